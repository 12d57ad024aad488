/* shim.h: what the shim's files share: configuration, logging, counters and
 * the driver entry points pump calls for itself.
 *
 * The shim is the data plane of pump: it sits between a program and libcuda,
 * sees every managed allocation and kernel launch, and prefetches at launch.
 * Rule zero: it never harms the program. Every failure falls back to
 * pass-through (the driver's own behaviour, its own return codes).
 */
#ifndef PUMP_SHIM_H
#define PUMP_SHIM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_compat.h" /* cuda.h and cudaTypedefs.h, and what 13.0's lack */

#include "pump_stats.h"

#define PUMP_HIDDEN __attribute__((visibility("hidden")))
#define PUMP_LIKELY(x) __builtin_expect(!!(x), 1)
#define PUMP_UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline void pump_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Devices pump keeps state for, by the driver's ordinal; memory of a device past them passes
 * through uncounted. */
#define PUMP_DEVICES_MAX 64

/* The prefetch unit: the driver's VA block (uvm_va_block_types.h, 2 MiB). */
#define PUMP_BLOCK_SIZE ((uint64_t)2 << 20)

/* ---- configuration (config.c), read once from PUMP_* at load ---- */
enum pump_policy { PUMP_POLICY_OFF, PUMP_POLICY_LAUNCH };
enum pump_capacity_kind { PUMP_CAP_DEFAULT, PUMP_CAP_BYTES, PUMP_CAP_PERCENT, PUMP_CAP_HOST };
/* PUMP_TORCH_DISCARDS: what becomes of a dead tensor's blocks (torch_trace.c). POISON, a
 * diagnostic, writes them with 0xFF bytes (NaN in every float format) in the discard's place and
 * order: a result that changes under it means pump took live memory for dead; one that changes
 * under ON only means the driver's discard itself (discard_marks.c). */
enum pump_discards { PUMP_DISCARDS_OFF, PUMP_DISCARDS_ON, PUMP_DISCARDS_POISON };

/* The safety net's epoch (residency.h): managed launches after which every residency belief
 * expires, so what moved pages behind pump unseen (the driver evicting for another process, a
 * library's host path) is prefetched again within that many launches. 10,000: every 10 to 20
 * steps of a PyTorch training step's 500 to 1,000 launches, so its cost (the working set asked
 * again, resident: no bytes moved, a few batched calls) is spread thin; shorter epochs bring
 * back the per-step re-prefetching issue 15 removed. */
#define PUMP_EPOCH_LAUNCHES_DEFAULT 10000

struct pump_config {
    enum pump_policy policy;            /* PUMP_POLICY (lookahead: launch, and plans) */
    bool wait;                          /* PUMP_WAIT: kernels wait for their prefetch */
    bool worker;                        /* PUMP_WORKER: moves decided ahead are made by pump's worker thread */
    bool evict_ahead;                   /* PUMP_EVICT_AHEAD: the launch rule keeps room free ahead (residency_ahead.c) */
    enum pump_discards torch_discards;  /* PUMP_TORCH_DISCARDS: PyTorch's caching allocator's dead tensors are
                                           discarded (or poisoned) under a budget (torch_trace.c) */
    bool kernel_times;                  /* PUMP_KERNEL_TIMES: the GPU times launches for pumpd (kernel_time.h) */
    bool torch_placement;               /* PUMP_TORCH_PLACEMENT: pump's allocator for PyTorch places tensors
                                           where they went a step before (placement.h) */
    bool held_discards;                 /* PUMP_HELD_DISCARDS: the dead tensors of blocks placement keeps are
                                           discarded on pump's worker (held_discards.h); off by default
                                           until a GPU run shows it bit-identical */
    bool torch_names;                   /* PUMP_TORCH_NAMES: the caching allocator's tensors go to pumpd by
                                           their place in the step, not their address (names.h); off by
                                           default until lookahead's plans on them beat the launch rule */
    enum pump_capacity_kind cap_kind;   /* PUMP_CAPACITY */
    uint64_t cap_value;                 /* bytes, or percent */
    uint32_t epoch_launches;            /* PUMP_EPOCH_LAUNCHES */
    const char *stats_dir;              /* PUMP_STATS_DIR, or NULL */
    enum pump_capacity_kind budget_kind; /* PUMP_BUDGET: DEFAULT (none), BYTES or PERCENT */
    uint64_t budget_value;              /* bytes, or percent */
    bool daemon_off;                    /* PUMP_SOCKET="": never connect to pumpd */
    bool socket_set;                    /* PUMP_SOCKET names the socket */
    const char *socket_paths[2];        /* where pumpd is looked for, in order (NULL: none) */
    char job[32];                       /* PUMP_JOB, validated; "" when unset */
    char name[65];                      /* PUMP_NAME, validated; "" when unset */
    bool managed_all;                   /* PUMP_MANAGED_ALL: device allocations become managed memory */
    int32_t rank;                       /* the process's rank in its run (RANK, SLURM_PROCID, ...), or -1 */
};
extern PUMP_HIDDEN struct pump_config pump_config;
PUMP_HIDDEN void pump_config_load(void);
/* Prints the warnings for bad PUMP_* values (once, when CUDA is first used). */
PUMP_HIDDEN void pump_config_report(void);
/* Parses a capacity value; shared with nothing else but kept apart for tests. */
PUMP_HIDDEN bool pump_parse_capacity(const char *text, enum pump_capacity_kind *kind, uint64_t *value);
/* PUMP_BUDGET's grammar: PUMP_CAPACITY's without `host`. */
PUMP_HIDDEN bool pump_parse_budget(const char *text, enum pump_capacity_kind *kind, uint64_t *value);
/* PUMP_JOB: 1..31 of [A-Za-z0-9_-]. PUMP_NAME: 1..64 bytes of UTF-8 without control characters. */
PUMP_HIDDEN bool pump_valid_job(const char *text);
PUMP_HIDDEN bool pump_valid_name(const char *text);

/* ---- logging (log.c): off by default, rate-limited when on ---- */
PUMP_HIDDEN void pump_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* PUMP_LOG's level (0 off, 1 info, 2 debug): the configuration sets it (config.c), the log keeps
 * it, so that the log reads no configuration and the configuration may log. */
PUMP_HIDDEN void pump_log_set_level(int level);
PUMP_HIDDEN int pump_log_level(void);
/* Always printed: a user error or a refusal the user must act on. */
PUMP_HIDDEN void pump_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs `call` only the first time this call site is reached. */
#define PUMP_ONCE(call)                                                                 \
    do {                                                                                \
        static atomic_flag pump_once_flag_ = ATOMIC_FLAG_INIT;                          \
        if (!atomic_flag_test_and_set_explicit(&pump_once_flag_, memory_order_relaxed)) \
            call;                                                                       \
    } while (0)
/* Logs at level 1, or says always, only the first time this call site runs. */
#define pump_log_once(...) PUMP_ONCE(pump_log(1, __VA_ARGS__))
#define pump_notice_once(...) PUMP_ONCE(pump_notice(__VA_ARGS__))

/* ---- counters (stats.c): a shared-memory record per process ---- */
extern PUMP_HIDDEN struct pump_stats *_Atomic pump_stats_record;
#define PUMP_COUNT(field, n)                                                                   \
    __atomic_fetch_add(&atomic_load_explicit(&pump_stats_record, memory_order_relaxed)->field, \
                       (uint64_t)(n), __ATOMIC_RELAXED)
#define PUMP_SET(field, v)                                                                  \
    __atomic_store_n(&atomic_load_explicit(&pump_stats_record, memory_order_relaxed)->field, \
                     (uint64_t)(v), __ATOMIC_RELAXED)
PUMP_HIDDEN void pump_stats_open(void);
PUMP_HIDDEN void pump_stats_passthrough(const char *reason);
/* A forked child's record: its own, in pass-through when the parent had used CUDA. */
PUMP_HIDDEN void pump_stats_after_fork_in_child(bool cuda_was_used);
/* Marks the record exited (and prints the counts with PUMP_LOG on, when CUDA was used). */
PUMP_HIDDEN void pump_stats_at_exit(bool cuda_was_used);

/* ---- state shared by the hooks ---- */
/* True once the shim stands aside for good (a child forked after CUDA init,
 * or the driver could not be loaded); hooks then only forward. */
extern PUMP_HIDDEN atomic_bool pump_passthrough;

/* ---- the driver (driver.c) ---- */
/* Loads libcuda and resolves every pointer pump needs; false if it cannot
 * (the hooks then return CUDA_ERROR_NOT_INITIALIZED, as nvshare does). */
PUMP_HIDDEN bool pump_driver_ready(void);
PUMP_HIDDEN bool pump_driver_was_used(void);

/* Driver functions pump calls for itself (never through its own hooks). */
/* CUDA 13.2's parameter counts, declared here (cuda.h's typedefs came with 13.2) so that pump
 * builds against older headers: the driver is asked for them by name, at run time. */
typedef CUresult(CUDAAPI *pump_pfn_func_param_count)(CUfunction func, size_t *count);
typedef CUresult(CUDAAPI *pump_pfn_kernel_param_count)(CUkernel kernel, size_t *count);

struct pump_driver {
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuCtxGetDevice_v2000 ctx_get_device;
    PFN_cuMemGetInfo_v3020 mem_get_info;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuEventCreate_v2000 event_create;
    PFN_cuEventRecord_v2000 event_record;
    PFN_cuEventQuery_v2000 event_query;
    PFN_cuStreamQuery_v2000 stream_query;
    PFN_cuEventElapsedTime_v2000 event_elapsed;   /* NULL: no LINK records (link_rate.c) */
    PFN_cuStreamWaitEvent_v3020 stream_wait_event;
    PFN_cuStreamSynchronize_v2000 stream_synchronize;
    PFN_cuStreamIsCapturing_v10000 stream_is_capturing;
    PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_capture_mode;
    PFN_cuMemPrefetchBatchAsync_v13000 prefetch_batch;   /* NULL before CUDA 13 */
    PFN_cuMemPrefetchAsync_v12020 prefetch_v2;           /* NULL before CUDA 12.2 */
    PFN_cuMemPrefetchAsync_v8000 prefetch_v1;
    PFN_cuFuncGetParamInfo_v12040 func_param_info;       /* NULL before CUDA 12.4 */
    PFN_cuKernelGetParamInfo_v12040 kernel_param_info;
    pump_pfn_func_param_count func_param_count;          /* NULL before CUDA 13.2 */
    pump_pfn_kernel_param_count kernel_param_count;
    PFN_cuPointerGetAttribute_v4000 pointer_get_attribute;
    PFN_cuFuncGetName_v12030 func_get_name;              /* NULL before CUDA 12.3 */
    PFN_cuKernelGetName_v12030 kernel_get_name;
    /* managed_all (managed_all.c): which devices allow it, and the managed pools */
    PFN_cuDeviceGetCount_v2000 device_get_count;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
    PFN_cuStreamGetDevice_v12080 stream_get_device;      /* NULL before CUDA 12.8 */
    PFN_cuDeviceGetMemPool_v11020 device_get_mem_pool;
    PFN_cuDeviceGetDefaultMemPool_v11020 device_get_default_mem_pool;
    PFN_cuMemGetDefaultMemPool_v13000 mem_get_default_mem_pool; /* NULL before CUDA 13 */
    PFN_cuMemPoolGetAttribute_v11020 mem_pool_get_attribute;
    PFN_cuMemPoolSetAttribute_v11020 mem_pool_set_attribute;
    PFN_cuMemDiscardBatchAsync_v13000 discard_batch;     /* NULL before CUDA 13 */
    PFN_cuMemsetD32Async_v3020 memset_d32_async;         /* PUMP_TORCH_DISCARDS=poison's writes */
    bool can_prefetch;                                   /* all of the prefetch path is there */
    /* graphs (hooks_graph.c) and devices (prefetch.c) */
    PFN_cuGraphGetNodes_v10000 graph_get_nodes;
    PFN_cuGraphNodeGetType_v10000 graph_node_get_type;
    PFN_cuGraphKernelNodeGetParams_v12000 graph_kernel_node_get_params; /* NULL before CUDA 12 */
    PFN_cuGraphChildGraphNodeGetGraph_v10000 graph_child_graph;
    PFN_cuStreamGetCtx_v9020 stream_get_ctx;             /* the context a stream belongs to */
    PFN_cuCtxPushCurrent_v4000 ctx_push_current;
    PFN_cuCtxPopCurrent_v4000 ctx_pop_current;
    /* a primary context's handle when it is reset (hooks_context.c) */
    PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_get_state;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    /* the UUIDs of the devices pump works on, for pumpd (channel.c) */
    PFN_cuDeviceGetUuid_v11040 device_get_uuid;
};
extern PUMP_HIDDEN struct pump_driver pump_driver; /* driver_table.c; filled by driver.c */

#endif
