/* pump_stats.h: the per-process counter record, the one layout both sides read.
 *
 * Each process that loads libpump and uses CUDA creates its own record file,
 * PUMP_STATS_DIR/pump-<pid>.stats, maps it shared and counts straight into it:
 * no system call on the hot path, and the counts survive _exit() and kill -9.
 * pump-run reads every record of the process tree (cffi parses this header,
 * so it holds no macros and no #include beyond the guard below).
 */
#ifndef PUMP_STATS_H
#define PUMP_STATS_H
#include <stdint.h>

enum {
    PUMP_STATS_MAGIC = 0x504d5053,   /* "SPMP" little-endian: a pump record */
    PUMP_STATS_VERSION = 20
};

struct pump_stats {
    uint32_t magic;                  /* PUMP_STATS_MAGIC once the record is valid */
    uint32_t version;                /* PUMP_STATS_VERSION */
    int32_t pid;
    int32_t parent_pid;
    uint32_t exited;                 /* 1 once the process ran its exit handler */
    uint32_t passthrough;            /* 1 when the shim stood aside (see reason) */
    char passthrough_reason[48];

    uint64_t procaddr_hooks;         /* cuGetProcAddress answers swapped for pump's hooks */
    uint64_t launches;               /* kernel launches seen (every entry point) */
    uint64_t launches_managed;       /* ... whose arguments point into managed memory */
    uint64_t launches_prefetched;    /* ... for which a prefetch was enqueued */
    uint64_t launches_captured;      /* ... on a capturing stream: left untouched */
    uint64_t launches_unscanned;     /* ... whose parameter layout was unknown */
    uint64_t graph_launches;         /* cuGraphLaunch calls */
    uint64_t scan_words;             /* 8-byte argument words checked */
    uint64_t scan_hits;              /* ... that fell inside a managed allocation */
    uint64_t prefetch_calls;         /* driver prefetch calls made (batch or single) */
    uint64_t prefetch_ranges;        /* address ranges in those calls */
    uint64_t prefetch_bytes;         /* bytes asked to move to a GPU */
    uint64_t plan_prefetch_ranges;   /* ... of those ranges, ones a trigger of the daemon's plan named */
    uint64_t resident_skips;         /* allocations skipped: believed resident (prefetched this epoch) */
    uint64_t budget_skips;           /* 2 MiB blocks a launch did not prefetch: they did not fit the budget */
    uint64_t epochs;                 /* residency-belief expiries */
    uint64_t managed_allocs;         /* managed allocations tracked */
    uint64_t managed_frees;
    uint64_t managed_bytes;          /* managed footprint now, all devices together */
    uint64_t managed_bytes_peak;
    uint64_t capacity_bytes;         /* the caps in force (one a device), summed over the devices that
                                        have one so far (0 until the first managed allocation) */
    uint64_t capacity_refusals;      /* allocations refused at the cap */
    uint64_t budget_bytes;           /* the budget in force (the daemon's plan, else PUMP_BUDGET): the cap
                                        on managed bytes believed resident per GPU; 0: none */
    uint64_t resident_bytes;         /* managed bytes believed resident on GPUs now (whole 2 MiB blocks) */
    uint64_t bytes_evicted;          /* bytes pump moved back to the host (prefetch to the host) */
    uint64_t events_written;         /* event records written to the daemon's ring */
    uint64_t events_dropped;         /* event records dropped: the ring was full */
    uint64_t errors;                 /* pump's own driver calls that failed */
    /* version 3: the budget held by eviction, and the plan's triggers carried out */
    uint64_t resident_bytes_peak;    /* the most resident_bytes has been: at most the budget when it held */
    uint64_t evictions;              /* 2 MiB blocks evicted (to hold the budget, or as a plan said) */
    uint64_t plan_triggers;          /* launches whose key found a trigger in the daemon's plan */
    uint64_t plan_evict_ranges;      /* the triggers' evict ranges carried out */
    uint64_t plan_ranges_skipped;    /* the triggers' ranges not inside a managed allocation or a freed
                                        tensor kept in place (or past the 256 a launch carries out) */
    /* managed_all: the program's device allocations made managed memory (PUMP_MANAGED_ALL) */
    uint64_t managed_all_allocs;     /* device allocations (cuMemAlloc, cuMemAllocAsync) made managed */
    uint64_t managed_all_bytes;      /* ... their bytes */
    uint64_t managed_all_captured;   /* stream-ordered allocations left alone: their stream was capturing */
    uint64_t managed_all_kept_shared; /* device allocations left alone: a communication library (NCCL, MPI,
                                        NVSHMEM, UCX) made them, to share by IPC handle */
    uint64_t vmm_allocs;             /* cuMemCreate allocations: device memory pump cannot make managed */
    uint64_t ipc_refusals;           /* cuIpcGetMemHandle calls that failed on memory managed_all made managed */
    /* pump's allocator for PyTorch (torch_allocator.c) */
    uint64_t torch_allocs;           /* tensors allocated through pump_torch_alloc */
    uint64_t torch_frees;
    uint64_t bytes_discarded;        /* dead tensors' whole 2 MiB blocks discarded at their free (pump's
                                        allocator's, and the caching allocator's under a budget) */
    uint64_t discards_skipped;       /* dead tensors not discarded (either allocator): pump could not order
                                        later prefetches of their memory after one more discard (256 still
                                        running), or another thread was making one in the same context */
    uint64_t discards_declined;      /* dead tensors not discarded: no scanned launch named them, or pump saw
                                        launches on another stream (stream_users.c) */
    uint64_t discard_drain_waits;    /* discards the freeing thread waited for its stream to drain before
                                        (discard_marks.c: a discard is asked for on an idle stream only) */
    uint64_t discards_undrained;     /* dead tensors not discarded: their stream did not drain within a
                                        second */
    uint64_t torch_free_waits;       /* waits of a freeing stream for another stream pump saw launches on */
    uint64_t torch_frees_unordered;  /* frees not ordered after every such stream (logged once) */
    uint64_t prefetch_discard_waits; /* prefetches of memory allocated again over a discard that may still
                                        be running, made to wait for it on the GPU */
    uint64_t prefetch_discard_skips; /* blocks not prefetched: their discard could not be waited for (its
                                        event could not be recorded), so kernels fault them in */
    /* PyTorch's caching allocator, followed (torch_trace.c) */
    uint64_t torch_tensor_allocs;    /* tensors it handed out of managed segments, tracked one by one */
    uint64_t torch_tensor_frees;
    /* CUDA graphs: each instantiation's kernel nodes are scanned, each replay prefetched */
    uint64_t graph_execs_scanned;    /* instantiations whose kernel nodes pump scanned */
    uint64_t graph_exec_updates;     /* exec updates and kernel-node parameter changes seen */
    uint64_t graph_launches_prefetched; /* replays whose working set was prefetched (or believed resident) */
    uint64_t graph_launches_over_budget; /* replays whose working set exceeds the budget: left to faults */
    uint64_t graph_launches_unknown; /* replays of an exec pump could not scan: passed through */
    /* version 6: residency beliefs outlive synchronisations under managed_all */
    uint64_t epoch_reprefetches;     /* 2 MiB blocks believed resident prefetched again only because the
                                        safety net's epoch of launches expired the belief */
    /* version 7: pump's own budget where managed memory can exceed the device (budget.c) */
    uint64_t default_budget_bytes;   /* pump's default budget now (the device less foreign memory and a
                                        margin: budget.c), part of budget_bytes' minimum; 0: not in force */
    uint64_t budget_rereads;         /* device memory read again at synchronisations for that default */
    uint64_t budget_changes;         /* ... readings that changed it (past the hysteresis) */
    /* ... and residency state per device, no driver call under its locks */
    uint64_t residency_lock_waits;   /* waits for a residency lock another thread held (its launch's device's,
                                        or one keeping memory the launch names): held only to decide */
    uint64_t residency_turn_waits;   /* waits of a decision's hand-over of its moves for an earlier decision's on
                                        the same device (its streams take the moves in the order they were
                                        decided; no driver call is made in a turn) */
    /* version 8: the kind of handle each launch named (handles.c), and TMA descriptors (tensor_maps.c) */
    uint64_t launches_kernel_handles;   /* launches of a CUkernel (cuLibraryGetKernel) cast to CUfunction */
    uint64_t launches_function_handles; /* ... of a CUfunction (cuModuleGetFunction, cuKernelGetFunction) */
    uint64_t launches_unknown_handles;  /* ... of a handle made where pump did not see it */
    uint64_t tensor_maps_noted;         /* TMA descriptors encoded or given a new address (cuTensorMap*) */
    uint64_t tensor_map_args;           /* launch arguments found to be one of those descriptors */
    /* also version 8: prefetch refusals handled per allocation; managed_all without managed pools */
    uint64_t prefetch_refusals;      /* allocations the driver refused to prefetch (e.g. a managed pool's
                                        memory): marked, never asked again, batching kept for the rest */
    uint64_t prefetch_refused_skips; /* ranges left out of prefetches and evictions: their allocation was
                                        refused before */
    uint64_t unpooled_allocs;        /* managed_all's stream-ordered allocations made by cuMemAllocManaged: the
                                        driver refuses to prefetch its managed pools' memory (managed_all_cache.c) */
    uint64_t unpooled_reuses;        /* ... of those, freed blocks handed out again in stream order */
    uint64_t unpooled_releases;      /* freed blocks given back to the driver (cuMemFree) at synchronisations
                                        above the release threshold, or trims */
    /* also version 8: hook coverage, so that a pass-through is never silent (docs/pump-run.md) */
    uint64_t dlsym_hooks;            /* dlsym answers with pump's hooks (procaddr_hooks: cuGetProcAddress's) */
    uint64_t procaddr_unmatched;     /* cuGetProcAddress answers, for a name pump hooks, with a pointer that is no
                                        export of libcuda's for that name: pump cannot put its hook there, and
                                        calls through it pass pump by (each name said once on stderr) */
    uint64_t launch_lookups;         /* lookups of a kernel launch entry point (cuLaunchKernel*,
                                        cuLaunchCooperativeKernel*, cuGraphLaunch*) by cuGetProcAddress or
                                        dlsym, answered with pump's hook or not */
    /* version 9: moves decided ahead made by pump's worker thread (prefetch_worker.c), not the launching one */
    uint64_t worker_jobs;            /* decisions' driver calls the worker made */
    uint64_t worker_takeovers;       /* ... that a thread whose calls had to come after them made itself instead,
                                        the worker not having begun them */
    uint64_t worker_waits;           /* waits of such a thread for the job the worker was making */
    uint64_t use_waits_readied;      /* use events recorded again without the eviction stream's wait on their
                                        previous record by the launching thread: the worker had made it */
    /* also version 9: policy off's emulation of a smaller card keeps the driver's order (residency.c) */
    uint64_t off_kernel_waits;       /* launches under policy off whose kernel waits for the evictions decided
                                        after the kernels before it */
    /* version 10: the default budget's margin, learned from what appears between readings (budget.c) */
    uint64_t budget_margin_bytes;    /* the largest margin in force on any device */
    uint64_t budget_margin_raises;   /* readings that found more appeared than the margin held, and raised it */
    /* version 11: PyTorch's caching allocator's dead tensors discarded under a budget (torch_trace.c) */
    uint64_t torch_tensor_discards;  /* freed tensors whose whole 2 MiB blocks were discarded (their bytes
                                        count in bytes_discarded) */
    /* also version 11: use events with generations (prefetch.c) */
    uint64_t use_waits_recycled;     /* waits on a use token whose event was recorded again since (1,024
                                        uses later): made on a fresh point of the eviction stream instead */
    /* also version 11: how much of a job pumpd's plan covers (issue 41) */
    uint64_t launches_planned;       /* managed launches, while a plan with triggers is in force, that found
                                        every block they use believed where the plan put it: no move of the
                                        launch rule's, none left to faults by the budget */
    /* version 12: pump's allocator for PyTorch places each tensor where it went a step before (placement.c) */
    uint64_t placement_steps;        /* optimizer steps marked (pump_torch_step) */
    uint64_t placement_wanted;       /* tensors allocated with a place: where the same allocation went in an
                                        earlier step that agrees with this one so far */
    uint64_t placement_hits;         /* ... put there */
    uint64_t placement_reuses;       /* freed pool blocks pump kept and handed out again */
    uint64_t placement_releases;     /* ... given back to their pool, not taken again for a few steps */
    /* version 13: room made ahead of the launch rule's launches, by pump's worker (residency_ahead.c) */
    uint64_t ahead_decisions;        /* launches after which blocks were evicted ahead */
    uint64_t ahead_bytes;            /* ... the bytes that left the belief so */
    /* version 14: what the default budget's margin is for, measured (budget.c) */
    uint64_t budget_appeared_bytes;  /* the largest drop of a device's free memory between two readings that
                                        pump's own prefetching does not explain, whether or not it raised the
                                        margin: what a margin must hold on this job */
    /* version 15: PyTorch's caching allocator's tensors named by their place in the step (names.c) */
    uint64_t tensor_names_bound;     /* tensors pumpd heard of by name, not address */
    uint64_t tensor_names_taken;     /* tensors whose name a live tensor of an earlier step still held: by
                                        address instead */
    uint64_t tensor_names_unheld;    /* plan ranges in a name no live tensor held: nothing moved */
    /* version 16: which evictions a plan asked for (issue 41: a plan's bytes against the budget's hold) */
    uint64_t plan_bytes_evicted;     /* of bytes_evicted, those moved at a plan's trigger: its evict ranges
                                        and the room its prefetches took */
    /* version 17: a plan's prefetches that did not fit are not faults (issue 41: the end line said so) */
    uint64_t plan_prefetch_skips;    /* 2 MiB blocks a trigger's prefetches for later launches left out:
                                        they did not fit beside its evictions; the launch that needs them
                                        takes them (budget_skips counts what a launch itself left out) */
    /* version 18: dead tensors of pump's allocator discarded without waiting on the program's streams */
    uint64_t held_discards;          /* freed tensors of blocks pump keeps for placement whose whole 2 MiB
                                        blocks were discarded once the GPU had passed their free (their bytes
                                        count in bytes_discarded) */
    uint64_t placement_claim_waits;  /* allocations that waited for the discard of the block their place names */
    /* version 19: what evictions copy that no one reads again (issue 41 item 2) */
    uint64_t bytes_evicted_dead;     /* of bytes_evicted, those of freed tensors kept in place (ranges.h): a
                                        copy to the host of memory the next tensor there writes first */
    /* version 20: lookups a writer of the range table held up (ranges.c) */
    uint64_t range_finds_missed;     /* argument words or addresses not looked up: the range table's writer
                                        stayed mid-edit while the looking thread held a pump lock (without
                                        one, it waits for the writer) */
};

#endif
