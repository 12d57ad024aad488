/* fakecuda_internal.h: the objects and helpers the fakecuda source files share.
 * cuda.h is included with __CUDA_API_VERSION_INTERNAL so that none of its
 * `#define cuX cuX_v2` renames apply and every ABI export name (cuMemAlloc_v2,
 * cuLaunchKernel_ptsz, the 4-argument cuMemPrefetchAsync...) has its own prototype:
 * each definition below is checked by the compiler against the header. */
#ifndef FAKECUDA_INTERNAL_H
#define FAKECUDA_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include "cuda_compat.h" /* names newer than the cuda.h in use (13.0's) */

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fakecuda.h"
#include "fakecuda_model.h"

/* Exports are default-visibility; everything else is hidden (-fvisibility=hidden). */
#define FC_EXPORT __attribute__((visibility("default")))
/* A hidden alias of an export, so that procaddr.c takes the address of the library's
 * own definition (the one dlsym(handle, name) returns), never a PLT/GOT entry that an
 * LD_PRELOAD library could have interposed. Written after each export's definition. */
#define FC_ALIAS(name) \
    extern __typeof__(name) fcl_##name __attribute__((alias(#name), visibility("hidden")))

/* Entry guard of every export: FAKECUDA_FAIL, version gating, init check. */
CUresult fc_enter(const char *name, int min_version, int need_init);
extern _Thread_local const char *fc_tls_call; /* the entry point the thread is in (fc_enter) */
/* Whether the export this thread entered last is a _ptsz or _ptds one (its NULL stream is the
 * per-thread default stream, as cuda.h's CU_STREAM_PER_THREAD). */
extern _Thread_local int fc_tls_ptsz;
#define FC_ENTRY(name, ver)                                  \
    do {                                                     \
        CUresult fc_r_ = fc_enter(#name, (ver), 1);          \
        if (fc_r_ != CUDA_SUCCESS) return fc_r_;             \
    } while (0)
#define FC_ENTRY_NOINIT(name, ver)                           \
    do {                                                     \
        CUresult fc_r_ = fc_enter(#name, (ver), 0);          \
        if (fc_r_ != CUDA_SUCCESS) return fc_r_;             \
    } while (0)
/* An export that guards its entry and forwards to an internal implementation:
 * FC_DEF(cuX_ptsz, 7000, (CUstream s), impl(s)); (params keep cuda.h's prototype). */
#define FC_DEF(name, ver, params, call)                      \
    FC_EXPORT CUresult name params                           \
    {                                                        \
        FC_ENTRY(name, ver);                                 \
        return call;                                         \
    }                                                        \
    FC_ALIAS(name)

/* Handles the program has not destroyed stay reachable from this list (as the driver
 * keeps them until the context goes), so leak checkers do not blame fakecuda. */
typedef struct fc_link { struct fc_link *prev, *next; } fc_link;
void fc_keep(fc_link *l);
void fc_unkeep(fc_link *l);

/* ---- stats.c: knobs and counters ---- */
typedef struct fc_config {
    int driver_version;
    int ndevices;                       /* visible to this process (CUDA_VISIBLE_DEVICES) */
    int physical[FAKECUDA_MAX_DEVICES]; /* ordinal -> the machine's device (UUID, name, PCI) */
    uint64_t device_memory;
    int ioctl_on_worker; /* FAKECUDA_IOCTL_THREAD=worker: ioctls are paid by the stream's worker */
    /* The UVM fault path's tunables (fakecuda_model.h), FAKECUDA_UVM_PERF_* knobs */
    unsigned fault_batch_count, prefetch_enable, prefetch_threshold, prefetch_min_faults;
    int pool_prefetch;   /* FAKECUDA_POOL_PREFETCH=accept (the default): managed pools' memory may be prefetched */
    /* FAKECUDA_POOL_PREFETCH_REFUSE_AFTER: ranges of managed pools' memory prefetched before every later
     * one is refused (prefetch.c; UINT_MAX: never) */
    unsigned pool_prefetch_refuse_after;
    int pool_reuse_freed; /* FAKECUDA_POOL_REUSE=freed: a pool hands out the last freed block of a size first */
    int discard_fill;     /* FAKECUDA_DISCARD_FILL=poison (the default): discarded pages are written with poison */
} fc_config;
extern fc_config fc_cfg; /* valid after fc_config_load() */
void fc_config_load(void);

typedef struct fc_counters {
    _Atomic uint64_t gpu_faults, cpu_faults, pages_touched_by_kernels, bytes_prefetched_h2d,
        bytes_prefetched_unused, bytes_faulted_h2d, bytes_d2h, kernels_run, launches,
        prefetch_calls, batch_prefetch_calls, bytes_discarded, allocations_reused, driver_evictions,
        bytes_evicted_d2h, bytes_evicted_h2d, pool_bytes_reserved, pool_bytes_released, gpu_fault_batches,
        gpu_fault_stall_ns, bytes_fault_prefetched_h2d, launches_by_function, launches_by_kernel,
        param_info_refused, launches_given_uses, launch_uses_missing, launch_uses_mismatched,
        discard_races, bytes_lost_to_discard_races, lookups_above_driver, bytes_read_discarded,
        gpu_faults_unpointed, bytes_dead_h2d, bytes_dead_d2h;
} fc_counters;
extern fc_counters fc_ctr;
#define FC_COUNT(field, n) atomic_fetch_add_explicit(&fc_ctr.field, (uint64_t)(n), memory_order_relaxed)

/* ---- time model (stats.c) ---- */
uint64_t fc_now_ns(void);
void fc_charge_ns(int64_t ns);  /* add modelled time to this thread's debt; may sleep */
void fc_pay_debt(int64_t min_ns); /* sleep off this thread's debt if >= min_ns */
void fc_wait_until(uint64_t t_ns); /* and then starts no earlier than t_ns */
uint64_t fc_model_clock_ns(void); /* now less this thread's oversleep credit: where its modelled work is */
void fc_start_no_earlier(uint64_t t_ns); /* its next work starts at t_ns or later (drops credit before it) */
uint64_t fc_host_clock_ns(void); /* now plus this thread's unpaid debt: when its work reaches the driver */

/* ---- cost.c: the driver's host-side cost per entry point ---- */
enum { FC_E_LAUNCH, FC_E_GRAPH_LAUNCH, FC_E_PREFETCH, FC_E_DISCARD, FC_E_EVENT_RECORD, FC_E_STREAM_WAIT_EVENT,
       FC_E_EVENT_QUERY, FC_E_STREAM_QUERY, FC_E_SYNCHRONIZE, FC_E_MEM_GET_INFO, FC_E_POINTER_QUERY,
       FC_E_CAPTURE_QUERY, FC_E_CONTEXT_QUERY, FC_E_MEMCPY, FC_E_MEMSET, FC_E_POOL_RESERVE, FC_E_POOL_RELEASE,
       FC_E_POOL_QUERY, FC_E_TENSOR_MAP, FC_E_VMM, FC_E_COUNT };
void fc_cost(int entry, int64_t ns);                       /* one call, ns charged to the caller */
void fc_cost_call(int entry);                               /* one call, nothing charged yet */
void fc_cost_charge(int entry, int64_t ns, int on_worker);  /* ns charged to this thread */
void fc_ioctl(int entry, int64_t ns, int64_t turn_ns, int on_worker); /* paid now, va_space lock held for reading */
int64_t fc_charge_copies(int64_t ns);                       /* a prefetch's copies, in their turn: ns waited and charged */
int fc_ioctl_on_worker(void);
int64_t fc_migrate_ioctl_ns(uintptr_t p, size_t n);
int64_t fc_discard_ioctl_ns(uintptr_t p, size_t n);
int64_t fc_move_ns(uint64_t bytes);
int64_t fc_prefetch_d2h_wait_ns(uint64_t bytes);
void fc_va_write_lock(void);
void fc_va_write_unlock(void);
void fc_va_read_lock(void);
void fc_va_read_unlock(void);
uint64_t fc_cost_total_ns(void);
uint64_t fc_va_lock_wait_ns(void);
void fc_cost_reset(void);
#include <stdio.h>
void fc_cost_write_json(FILE *f);

/* ---- not_found.c: what a client asked for and fakecuda lacks, counted by name ---- */
enum { FC_NF_PROC, FC_NF_TABLE, FC_NF_SLOT, FC_NF_KINDS };
void fc_not_found(int kind, const char *name);
void fc_not_found_write_json(FILE *f);

/* ---- persona.c: what each device says it is (FAKECUDA_PERSONA) ---- */
int fc_persona_attribute(int dev, CUdevice_attribute attr); /* dev: an ordinal this process sees */
void fc_persona_name(int dev, char *name, size_t len);
void fc_persona_uuid(int dev, uint8_t out[16]);
uint64_t fc_persona_memory(void); /* the card's bytes; 0 for fakecuda's own device */
const char *fc_persona_id(void);

/* ---- export_tables.c, context_storage.c ---- */
void fc_cls_context_gone(CUcontext c); /* destructors of its context-local storage, entries gone */

/* ---- device.c ---- */
#define FC_MAGIC_CTX 0x43545821u
#define FC_MAGIC_STREAM 0x53545221u
#define FC_MAGIC_EVENT 0x45564e21u
#define FC_MAGIC_FUNC 0x46554e21u
#define FC_MAGIC_KERN 0x4b524e21u
#define FC_MAGIC_MOD 0x4d4f4421u
#define FC_MAGIC_LIB 0x4c494221u
#define FC_MAGIC_GRAPH 0x47525021u
#define FC_MAGIC_EXEC 0x45584521u
#define FC_MAGIC_POOL 0x504f4f21u
#define FC_MAGIC_DEAD 0xdeadbeefu
#define FC_MAGIC_GONE 0x474f4e21u /* a stream whose context was destroyed or reset */

struct CUctx_st {
    uint32_t magic;
    int device;
    int primary;
    unsigned flags;
    unsigned long long id;
    _Atomic(struct CUstream_st *) default_stream; /* created on first use */
    /* Raised when the context is destroyed or reset: its streams and events, made under an
     * earlier epoch, are gone with it (fc_ctx_invalidate). */
    _Atomic unsigned epoch;
    struct fc_ctx_wait *waits; /* under streams.c's lock: what its later streams wait for (cuCtxWaitEvent) */
    struct CUctx_st *next_all;
};
extern _Atomic int fc_initialized;
extern _Atomic int fc_init_pid; /* the process that called cuInit (writes FAKECUDA_STATS) */
void fc_atfork_child(void);     /* a child forked after cuInit cannot use the driver */
extern _Atomic uint64_t fc_dev_resident[FAKECUDA_MAX_DEVICES]; /* managed bytes per device */
/* The most fc_dev_resident[d] has been since the last stats reset. */
extern _Atomic uint64_t fc_dev_resident_peak[FAKECUDA_MAX_DEVICES];
void fc_dev_resident_add(int device, uint64_t bytes); /* raises the peak too */
CUcontext fc_current_ctx(void);
int fc_ctx_valid(CUcontext c);
/* Why a context cannot be used: CUDA_ERROR_CONTEXT_IS_DESTROYED for one destroyed while
 * current to this thread (cuda.h, cuCtxDestroy), else CUDA_ERROR_INVALID_CONTEXT. */
CUresult fc_ctx_error(CUcontext c);
int fc_ctx_device(CUcontext c);
CUcontext fc_primary_ctx(int dev); /* its handle, neither retained nor activated */

/* ---- devmem.c: each device's memory, and the UVM driver's root chunks and their lists ---- */
typedef struct fc_chunk {
    struct fc_chunk *prev, *next; /* on one of its device's lists (under the device's lock) */
    void *owner;                  /* the managed allocation (memory.c's) */
    size_t block;                 /* its VA block index in the owner */
    int device;
    uint64_t bytes;
    unsigned resident; /* the block's pages resident on the device (under the owner's mu) */
    int list;          /* which list; -1 while being evicted (under the device's lock) */
} fc_chunk;
int fc_devmem_take(int device, uint64_t bytes); /* 0, or -1 if it does not fit */
void fc_devmem_give(int device, uint64_t bytes);
uint64_t fc_devmem_used(int device);
fc_chunk *fc_chunk_new(void *owner, size_t block, int device, uint64_t bytes); /* NULL: no room */
void fc_chunk_page_in(fc_chunk *c);                 /* a page of the block landed on the device */
void fc_chunk_page_out(fc_chunk *c, int discarded); /* a page left it (discarded: by a discard) */
fc_chunk *fc_chunk_pick_victim(int device);         /* taken off its list; NULL: nothing to evict */
void fc_chunk_release(fc_chunk *c);                 /* its bytes back to the device; freed */
/* Makes room on device for bytes of plain memory, evicting managed chunks: CUDA_SUCCESS or
 * CUDA_ERROR_OUT_OF_MEMORY (migrate.c). */
CUresult fc_reserve_device_memory(int device, uint64_t bytes);

/* ---- streams.c (fences, streams) ---- */
typedef struct fc_fence {
    _Atomic int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    uint64_t t_ns;
} fc_fence;

enum { FC_OP_KERNEL, FC_OP_PREFETCH, FC_OP_HOSTFN, FC_OP_RECORD, FC_OP_WAIT, FC_OP_FREE, FC_OP_COPY };
struct fc_kdef;
typedef struct fc_range { uintptr_t ptr; size_t size; int loc; } fc_range;
/* a copy (elem 0: n bytes from src) or a memset of n elements of elem bytes of value; *_dev:
 * how the device touches each operand; pinned: FC_PINNED_DST/SRC, the operands a captured copy
 * took as page-locked host memory, which must still be so whenever its node runs (copies.c) */
enum { FC_PINNED_DST = 1, FC_PINNED_SRC = 2 };
typedef struct fc_copy { uintptr_t dst, src; size_t n; unsigned elem, value; int dst_dev, src_dev, pinned; } fc_copy;
/* One operand of a launch as FAKECUDA_LAUNCH_USES recorded it (launch_uses.c): the kernel
 * touches [ptr, ptr + bytes), writing it or only reading it, whether its read is checked for
 * discarded bytes (reads: fc_pages_read), and whether it writes every byte it spans without
 * reading one (overwrite: a `w` operand, fc_tls_overwrite_lo). */
typedef struct fc_use { uintptr_t ptr; size_t bytes; int write, reads, pointed, overwrite; } fc_use;
typedef struct fc_op {
    struct fc_op *next;
    int kind;
    union {
        struct { struct fc_kdef *def; fakecuda_dims dims; uint64_t not_before; void *args; fc_use *uses; size_t nuses; } k;
        /* ioctl_ns, turn_ns: paid by the worker before the pages move (FAKECUDA_IOCTL_THREAD=worker) */
        struct { size_t n; fc_range *r; uint64_t not_before; int64_t ioctl_ns, turn_ns; int entry;
                 CUstream stream; uint64_t race_number; /* discard_races.c */
                 int late; /* a discard asked for on a busy stream (discard_races.c) */ } pf;
        struct { CUhostFn fn; void *ud; } h;
        fc_fence *fence;
        struct { uintptr_t ptr; int pooled; } free;
        fc_copy copy;
    } u;
    /* kernel argument bytes / prefetch ranges follow */
} fc_op;

struct fc_capture;
struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    int device;
    unsigned flags;
    int priority;
    int is_default;        /* the legacy or a per-thread default stream: not destroyable */
    int legacy;            /* the context's legacy default stream (implicit synchronisation) */
    unsigned long long id;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle;
    fc_op *head, *tail;
    uint64_t pending;      /* ops enqueued and not completed */
    uint64_t floor_ns;     /* under mu: what runs next starts no earlier (a waited event that
                              was already done: no op is enqueued for it) */
    int worker_running;
    int destroyed;
    int refs;              /* under fc_streams_mu */
    _Atomic(struct fc_capture *) capture;
    struct CUstream_st *next_all;
};
/* Maps CU_STREAM_LEGACY (and 0 in a non-_ptsz export) to the current context's legacy
 * stream, CU_STREAM_PER_THREAD (and 0 in a _ptsz export) to this thread's default stream of
 * it; validates other handles. NULL if invalid (*err says why). */
CUstream fc_resolve_stream(CUstream s, CUresult *err);
/* The stream's next work starts no earlier than t_ns on the modelled clock (streams.c). */
void fc_stream_floor(CUstream s, uint64_t t_ns);
/* Declares s, the stream h resolves to, or returns why h is not one. */
#define FC_STREAM_OR_RETURN(h)                               \
    CUresult err_ = CUDA_SUCCESS;                            \
    struct CUstream_st *s = fc_resolve_stream((h), &err_);   \
    if (!s) return err_
CUstream fc_ctx_default_stream(CUcontext c);
/* A context's work as a whole (streams.c, for events.c's cuCtxRecordEvent and cuCtxWaitEvent):
 * a fence signalled once every stream of ctx ran what it holds now (NULL: out of memory); all
 * later work of ctx, on its streams now and those made later, waiting for f (-1: out of memory). */
fc_fence *fc_ctx_fence(CUcontext ctx);
int fc_ctx_wait(CUcontext ctx, fc_fence *f);
void fc_enqueue(CUstream s, fc_op *op);
void fc_enqueue_chain(CUstream s, fc_op *first, fc_op *last, uint64_t n);
void fc_sync_ctx_streams(CUcontext c, int device);
void fc_stream_wait_idle(CUstream s); /* waits until everything enqueued on s has run */
/* The context is destroyed or reset: waits for its streams, then every stream and event made
 * in it is gone (a later use: CUDA_ERROR_INVALID_HANDLE) and its default stream is made anew. */
void fc_ctx_invalidate(CUcontext c);
/* Fences (events.c): a record op signals one, a wait op waits for one. */
fc_fence *fc_fence_new(void); /* one reference */
void fc_fence_unref(fc_fence *f); /* NULL is fine */
void fc_fence_signal(fc_fence *f); /* done, stamped with the signalling thread's modelled clock */
void fc_fence_wait(fc_fence *f);
int fc_fence_done(fc_fence *f, uint64_t *t); /* whether signalled; *t: when */

/* ---- capture.c: a stream belongs to at most one capture ---- */
int fc_stream_capturing(CUstream s);
/* Work enqueued on s and not completed (streams.c). */
int fc_stream_busy(CUstream s);
#define FC_NOT_CAPTURING (-1)
/* Append a node to s's capture (taking the node): a CUresult, or FC_NOT_CAPTURING. */
int fc_capture_append(CUstream s, CUgraphNode n);
int fc_capture_add_kernel(CUstream s, struct fc_kdef *def, const fakecuda_dims *d, const void *args);
int fc_capture_add_host(CUstream s, CUhostFn fn, void *ud);
int fc_capture_add_copy(CUstream s, const fc_copy *c);
void fc_capture_invalidate(CUstream s);
/* An event's last record inside a capture: the capture's id (0: none) and what its recording
 * stream knew then of each member stream's work (capture.c: which forks were joined back).
 * Under the capture lock. */
#define FC_CAPTURE_MEMBERS_MAX 32
typedef struct fc_capture_mark {
    uint64_t id;
    uint64_t clock[FC_CAPTURE_MEMBERS_MAX];
} fc_capture_mark;
/* An event recorded in s: *mark becomes s's capture's (id 0: none) under the capture lock, as
 * the capture lock guards it; returns whether s is capturing. */
int fc_capture_record(CUstream s, fc_capture_mark *mark);
/* s waits on an event: if the event was recorded in a live capture s joins it (or fails to
 * merge two), or s is capturing; then returns 1 with *r the result. 0: an ordinary wait. */
int fc_capture_wait_event(CUstream s, const fc_capture_mark *mark, CUresult *r);
/* cuThreadExchangeStreamCaptureMode's rule for potentially unsafe calls (cuEventQuery):
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that prohibit it. */
CUresult fc_capture_check_unsafe_call(void);
/* cuCtxRecordEvent's and cuCtxWaitEvent's refusals (cuda.h), invalidating the captures in
 * question: 1 if a stream of ctx is capturing; 1 if mark's capture is still going on. */
int fc_capture_invalidate_ctx(CUcontext ctx);
int fc_capture_invalidate_mark(const fc_capture_mark *mark);
void fc_capture_mark_clear(fc_capture_mark *mark); /* a record outside every capture */

/* ---- kernels.c ---- */
typedef struct fc_kdef fc_kdef;
struct CUfunc_st { uint32_t magic; fc_kdef *def; };
struct CUkern_st { uint32_t magic; fc_kdef *def; };
struct fc_kdef {
    char *name;
    fakecuda_kernel_fn fn;
    unsigned nparams;
    size_t *sizes, *offsets;
    size_t argsize;
    int noop;
    int image;                  /* a real image's kernel (images.c): no C body, runs as a no-op */
    struct fc_kdef *next_image; /* images.c's list of them */
    struct CUfunc_st func; /* the handle a graph node's parameters name (graphs.c) */
};
/* Runs def's body, then touches the recorded operands (none: NULL, 0). */
void fc_run_kernel(fc_kdef *def, const fakecuda_dims *d, void *args, const fc_use *uses, size_t nuses, int device);
/* A kernel op (args and uses copied, start not before now + FAKECUDA_LAUNCH_LATENCY_US). */
fc_op *fc_kernel_op(fc_kdef *def, const fakecuda_dims *d, const void *args, const fc_use *uses, size_t nuses);
/* launch_uses.c: takes the calling thread's next launch position (*at) for an accepted launch of
 * def, whose packed argument buffer is args, and returns the operands FAKECUDA_LAUNCH_USES
 * recorded for it (*uses malloc'd, the caller frees; 0 and NULL when none). */
typedef struct fc_launch_position { int thread; uint64_t launch; } fc_launch_position;
size_t fc_launch_uses_take(const fc_kdef *def, const unsigned char *args, fc_use **uses, fc_launch_position *at);
/* memory.c: the live allocation made ordinal-th (fakecuda_allocation_of): base and size, or 0. */
int fc_alloc_by_ordinal(uint64_t ordinal, uintptr_t *base, size_t *size);
/* The kernel behind a CUfunction or CUkernel handle, or NULL. */
fc_kdef *fc_kernel_def(const void *func_or_kernel);
/* The same for a handle of one kind only (want: FC_MAGIC_FUNC or FC_MAGIC_KERN; 0: either). */
fc_kdef *fc_kernel_def_of(const void *h, uint32_t want);
/* The registry, for modules.c: a kernel by name, the i-th registered one, how many. */
fc_kdef *fc_kernel_find(const char *name);
fc_kdef *fc_kernel_at(size_t i);
unsigned fc_kernel_count(void);
/* Copies a launch's arguments (kernelParams, or the `extra` buffer, never both) into
 * args (def->argsize bytes, device layout). */
CUresult fc_pack_args(const fc_kdef *def, void **params, void **extra, unsigned char *args);

/* ---- graphs.c: nodes and graphs, for capture.c ---- */
CUgraph fc_graph_new(void);
void fc_graph_free(CUgraph g);
int fc_graph_append(CUgraph g, CUgraphNode n); /* 0, or -1 (n freed; NULL n is refused) */
CUgraphNode fc_node_kernel(fc_kdef *def, const fakecuda_dims *d, const void *args); /* args copied */
CUgraphNode fc_node_host(CUhostFn fn, void *ud);
CUgraphNode fc_node_copy(const fc_copy *c);
void fc_node_free(CUgraphNode n);

/* ---- memory.c (allocations) and migrate.c (their pages' moves) ---- */
/* A new allocation (plain memory taken from the device, evicting managed memory if need be),
 * its release, and whether one starts at p: for pools.c. */
/* What fc_alloc_memory makes: device memory, managed memory (cuMemAllocManaged), or managed
 * memory of a managed pool (cuMemAllocFromPoolAsync on a CU_MEM_ALLOCATION_TYPE_MANAGED pool). */
enum { FC_ALLOC_DEVICE, FC_ALLOC_MANAGED, FC_ALLOC_MANAGED_POOL };
CUresult fc_alloc_memory(CUdeviceptr *dptr, size_t size, int kind, int device, CUcontext ctx);
void fc_free_memory(uintptr_t p);
/* A cuMemMap mapping entered as device memory (vmm.c); fc_free_memory(base) removes it. */
CUresult fc_register_mapping(uintptr_t base, size_t size, int device, CUcontext ctx);
int fc_alloc_starts_at(uintptr_t p);
/* The allocation holding p (1), or none (0): for pointers.c. */
/* ordinal: memory.c's allocations' place in the order they were made (launch_uses.c); 0 elsewhere */
typedef struct fc_alloc_desc { uintptr_t base; size_t size; int managed, device; CUcontext ctx; uint64_t ordinal; } fc_alloc_desc;
int fc_alloc_lookup(uintptr_t p, fc_alloc_desc *out);
/* The page-locked host range holding p (1, managed 0), or none (0): host_memory.c. */
int fc_host_lookup(uintptr_t p, fc_alloc_desc *out);
enum { FC_LOC_UNPOP = 0, FC_LOC_HOST = 1, FC_LOC_DEV0 = 2 };
/* The ranges of prefetches, discards and advice: inside one managed allocation, and not a
 * managed pool's with FAKECUDA_POOL_PREFETCH=refuse (memory.c). */
CUresult fc_check_prefetch_range(uintptr_t p, size_t n);
int fc_is_pool_memory(uintptr_t p); /* inside a managed pool's allocation */
/* What [p, p+n) is: memory no allocation covers (the host's), plain device memory, managed
 * memory, or -1 when it runs past an allocation's end or into one. */
enum { FC_MEM_HOST, FC_MEM_DEVICE, FC_MEM_MANAGED };
int fc_mem_kind(uintptr_t p, size_t n);
void fc_run_prefetch(const struct fc_op *op); /* a prefetch or discard reached in its stream */
/* Moves the pages (migrate.c); copies_waited: the caller's ioctl already took the time of the
 * copies to the host (prefetch.c), so those pages move without taking it again. */
void fc_migrate_ranges(const fc_range *r, size_t n, int copies_waited);
/* Managed bytes of [p, p+n) a migration to loc moves: to the host, those on any device; to a
 * device, those not on it yet (on the host, another device, or unpopulated). */
uint64_t fc_bytes_to_move(uintptr_t p, size_t n, int loc);
/* discard_races.c: a discard unordered with a migration of the same pages. A migration is
 * known from its enqueue (its number; 0: not tracked) until it completes; a discard takes its
 * number at its enqueue and finds, when it runs, those of its pages still migrating. */
uint64_t fc_migration_enqueued(CUstream s, const fc_range *r, size_t n);
void fc_migration_completed(uint64_t number);
uint64_t fc_race_number(void);
void fc_discard_runs(CUstream s, uint64_t number, const fc_range *r, size_t n);
/* A discard asked for on a busy stream, run: its pages keep the stuck status (discard_races.c). */
void fc_discard_late(const fc_range *r, size_t n);
/* The whole pages of [p, p+n) keep a stuck discard status (migrate.c, FC_BIT_DISCARD_STUCK). */
void fc_pages_discard_stuck(uintptr_t p, size_t n);
/* A kernel's or a copy's read of [p, p+n): the pages whose bytes a discard lost and nothing
 * wrote since count in bytes_read_discarded (migrate.c). */
void fc_pages_read(uintptr_t p, size_t n);
/* [lo, hi): what the running kernel's current access overwrites without reading (0, 0: none);
 * the link crossings of a page it covers whole since its last use were dead (migrate.c). */
extern _Thread_local uintptr_t fc_tls_overwrite_lo, fc_tls_overwrite_hi;
/* CU_MEM_ADVISE_SET_PREFERRED_LOCATION (loc: FC_LOC_HOST or FC_LOC_DEV0 + d) and UNSET (loc
 * FC_LOC_UNPOP) on the pages [p, p+n) overlaps: the fault-time prefetcher reads it. */
void fc_set_preferred_location(uintptr_t p, size_t n, int loc);
/* CU_MEM_ADVISE_SET_READ_MOSTLY (on) and UNSET (off) on the pages [p, p+n) overlaps (migrate.c). */
void fc_set_read_mostly(uintptr_t p, size_t n, int on);
/* fault_prefetch.c: the driver's fault-time prefetcher over one VA block's n pages (their
 * FC_LOC_* loc, preferred location pref and page bits): marks FC_BIT_DRIVER_PF on the pages it
 * migrates to target with those marked FC_BIT_FAULTED (the batch's faults). pfi: the block's
 * prefetch_info (last_migration_proc_id, fault_migrations_to_last_proc; uvm_perf_prefetch.c). */
enum { FC_BIT_FAULTED = 8, FC_BIT_DRIVER_PF = 16 }; /* memory_pages.h's page bits 1, 2, 4, 32, 64 are its own */
typedef struct fc_prefetch_info { uint8_t proc; uint32_t faults; } fc_prefetch_info;
void fc_prefetch_plan(size_t n, const uint8_t *loc, const uint8_t *pref, uint8_t *bits, uint8_t target,
                      fc_prefetch_info *pfi);

void fc_run_copy(const fc_op *op, int device); /* a copy or memset reached in its stream (copies.c) */
void fc_managed_scan(uint64_t *unused_bytes, int clear);
extern _Thread_local int fc_tls_kernel_device; /* -1 outside a kernel */
extern _Thread_local uint64_t fc_tls_gpu_faults; /* gpu_faults this thread counted */

/* ---- pools.c ---- */
void fc_run_free(const fc_op *op); /* a cuMemFreeAsync reached in its stream */
void fc_pools_synchronized(void);  /* a stream, event or context synchronisation returned */
int fc_pool_forget_block(uintptr_t base); /* cuMemFree of it: -1 if a pool's, freed already */

#endif
