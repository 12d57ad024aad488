/* channel.h: the shim's side of the channels to pumpd (pump_channel.h has
 * the layout): a worker thread that attaches to the daemon and keeps the
 * connection, the event ring's writer, and the plan's reader.
 *
 * The daemon is optional (fail-open, like MPS): without one, or while it is
 * away, nothing here costs a launch more than one atomic load.
 */
#ifndef PUMP_CHANNEL_SHIM_H
#define PUMP_CHANNEL_SHIM_H

#include "pump_channel.h"
#include "scan.h"

/* What the hot path reads: filled in once, before it is published, and
 * never changed after (the ring's capacity is the one validated at attach,
 * not whatever the shared header says later). */
struct pump_channel {
    struct pump_ring_header *ring;
    struct pump_event *records;
    uint64_t mask;                  /* capacity - 1 */
    uint32_t capacity;
    const struct pump_plan *plan;   /* read-only mapping */
};

/* NULL until a ring is attached, and in a forked child. */
extern PUMP_HIDDEN struct pump_channel *_Atomic pump_channel_live;

static inline struct pump_channel *pump_channel_get(void)
{
    return atomic_load_explicit(&pump_channel_live, memory_order_acquire);
}

/* Starts the worker (once per process; not with PUMP_SOCKET=""). Called
 * when the driver has been loaded: CUDA is in use. Never waits. */
PUMP_HIDDEN void pump_channel_start(void);
PUMP_HIDDEN void pump_channel_after_fork_in_child(void);
/* The process is exiting: the worker makes no more driver calls (libcuda
 * may be tearing down). */
PUMP_HIDDEN void pump_channel_at_exit(void);

/* Writes n records (kind, count, device and arg set by the caller; seq and
 * time_ns, less this thread's pump_channel_own_time, by the writer) contiguously, or drops them all and counts it when
 * the ring lacks room. No lock, no system call. */
PUMP_HIDDEN void pump_channel_emit(struct pump_channel *c, const struct pump_event *records, uint32_t n);

/* The calling thread spent `ns` in pump's own driver calls (a decision's
 * moves). Its records leave that time out of their time_ns (each thread's
 * records keep their order), so that the gaps between launch calls, which
 * pumpd reads as kernel times, hold the program's pace and not pump's calls
 * (issue 28). No lock, no system call. */
PUMP_HIDDEN void pump_channel_own_time(uint64_t ns);
/* CLOCK_MONOTONIC in ns (what records are stamped with). */
PUMP_HIDDEN uint64_t pump_channel_now_ns(void);

/* The events pump sends. */
PUMP_HIDDEN void pump_channel_alloc(struct pump_range *range, uint64_t base, uint64_t size, uint32_t flags);
PUMP_HIDDEN void pump_channel_free(uint64_t base, uint64_t size);
/* LAUNCH (+ LAUNCH_MORE) with the launch's own allocations (scan->own). */
PUMP_HIDDEN void pump_channel_launch(struct pump_channel *c, CUfunction f, CUstream stream, int device,
                                     const struct pump_scan *scan);
/* FUNCTION (+ NAME): the handle and its name, asked of the driver. */
PUMP_HIDDEN void pump_channel_function(struct pump_channel *c, CUfunction f);
PUMP_HIDDEN void pump_channel_sync(uint32_t epoch);
/* The program finished training step `step` (the optimizer's, pump_torch_step): a STEP record. */
PUMP_HIDDEN void pump_channel_step(uint64_t step);
/* DEVICE: the process works on `device` (a CUDA ordinal). Asks the driver for
 * its UUID the first time only; sent now, or when the daemon attaches. */
PUMP_HIDDEN void pump_channel_device(CUdevice device);
/* pump's own budget on `device` is `bytes` now (budget.c): pumpd hears it (BUDGET) when it
 * changed, now if a channel is live, else when one is. */
PUMP_HIDDEN void pump_channel_own_budget(int device, uint64_t bytes);
/* LINK: a prefetch of `bytes` to `device` took `ns` on the GPU (link_rate.c). A sample,
 * sent only while a channel is live: a restarted pumpd hears the next ones. */
PUMP_HIDDEN void pump_channel_link(int device, uint64_t bytes, uint64_t ns);
/* KERNEL: a launch with launch `key` ran `ns` on `device`'s GPU (kernel_time.c). A sample,
 * sent only while a channel is live. */
PUMP_HIDDEN void pump_channel_kernel(int device, uint64_t key, uint64_t ns);
/* The launch key (pump_channel.h) of a launch of f with the scan's own allocations. */
PUMP_HIDDEN uint64_t pump_channel_launch_key(CUfunction f, const struct pump_scan *scan);

/* The trigger a launch's key found in the plan, copied out of it (the plan
 * is rewritten by pumpd while launches read it). */
#define PUMP_TRIGGER_RANGES_MAX 256
struct pump_trigger {
    uint32_t need, prefetch, evict; /* range[0 .. need), then prefetch, then evict ranges */
    uint32_t order;               /* enum pump_plan_order */
    bool need_cut;                /* the plan named more need ranges than need: some were left out */
    struct pump_plan_range range[PUMP_TRIGGER_RANGES_MAX];
};

/* The plan: the trigger for a launch with launch `key` (pump_channel_launch_key), copied
 * into *out; false when there is none (or the daemon was rewriting the plan). */
PUMP_HIDDEN bool pump_channel_plan_trigger(struct pump_channel *c, uint64_t key, struct pump_trigger *out);
/* The plan's budget_bytes (0: none, or no plan). */
PUMP_HIDDEN uint64_t pump_channel_plan_budget(void);

/* For the worker (channel_worker.c): the shim's counters as a COUNTERS
 * event, and the DEVICE events of every device known (again: to a daemon
 * that restarted and lost what its predecessor read). */
PUMP_HIDDEN void pump_channel_send_counters(void);
PUMP_HIDDEN void pump_channel_announce_devices(struct pump_channel *c, bool again);

/* Validates a ring of ring_size bytes and a plan (NULL for none) already
 * mapped, and makes them the live channel, as the worker does after attach;
 * false if they are not valid. Exposed for the unit tests. */
PUMP_HIDDEN bool pump_channel_install(struct pump_ring_header *ring, size_t ring_size, const struct pump_plan *plan);
/* The worker's attach on a connected socket: sends the request, reads the
 * reply, maps and installs the ring and plan it carries; false, with every
 * descriptor received closed, when anything about the reply is wrong.
 * Exposed for the fuzz harness (tests/fuzz). */
PUMP_HIDDEN bool pump_channel_attach(int fd);

#endif
