/* hooks_launch.c: every kernel launch entry point, and what pump does around
 * forwarding it: before, count it, scan its arguments and apply the launch
 * rule (prefetch, making room under the budget); after the real call, record
 * the kernel's use and carry out what policy off's budget or the daemon's
 * plan asks once it is enqueued; and tell the daemon.
 */
#include "budget.h"
#include "channel.h"
#include "handles.h"
#include "hooks_common.h"
#include "kernel_time.h"
#include "layouts.h"
#include "residency.h"
#include "stream_users.h"

/* Which kind of handle the launch named: whether a framework's kernels reach the driver
 * as CUkernels or CUfunctions is what the first GPU run must tell (handles.h). Each
 * thread remembers its last handle's kind until an unload (which may give the address
 * to another kernel): launches repeat kernels. */
static void count_handle_kind(CUfunction f)
{
    static __attribute__((tls_model("initial-exec"))) _Thread_local CUfunction last;
    static __attribute__((tls_model("initial-exec"))) _Thread_local uint32_t last_epoch;
    static __attribute__((tls_model("initial-exec"))) _Thread_local enum pump_handle_kind last_kind;
    uint32_t now = __atomic_load_n(&pump_layouts_epoch, __ATOMIC_RELAXED);
    if (f != last || now != last_epoch) {
        last_kind = pump_handle_kind_of(f);
        last = f;
        last_epoch = now;
    }
    if (last_kind == PUMP_HANDLE_KERNEL)
        PUMP_COUNT(launches_kernel_handles, 1);
    else if (last_kind == PUMP_HANDLE_FUNCTION)
        PUMP_COUNT(launches_function_handles, 1);
    else
        PUMP_COUNT(launches_unknown_handles, 1);
}

/* One launch's state between the two steps (on the hook's stack). */
struct launch {
    struct pump_scan scan;
    struct pump_context *context;  /* non-NULL: the step after the launch has work */
    struct pump_context *timed;    /* non-NULL: the GPU times this launch (probe + 1 in `probe`) */
    int probe;
    CUstream stream;
    uint64_t budget;
    uint64_t tick;                 /* its number among managed launches */
    int capturing;                 /* -1: not asked yet */
    const struct pump_trigger *trigger; /* the plan's trigger for it, or NULL */
};

/* Where a launch's trigger is copied: per thread, off the hook's stack (most
 * launches have none, and a 4 KiB frame costs every launch). */
static _Thread_local struct pump_trigger thread_trigger;

static void before_launch(struct launch *l, CUfunction f, unsigned grid_x, CUstream stream, void **params,
                          void **extra)
{
    l->context = l->timed = NULL;
    PUMP_COUNT(launches, 1);
    pump_lifecycle_launched();
    if (PUMP_UNLIKELY(!pump_active()))
        return;
    count_handle_kind(f);
    if (pump_ranges_empty()) {
        pump_stream_users_note(stream, NULL, 0);  /* pump's allocator orders frees after it */
        return;
    }
    pump_scan_launch(f, params, extra, grid_x, &l->scan);
    if (l->scan.unscanned)
        PUMP_COUNT(launches_unscanned, 1);
    pump_stream_users_note(stream, l->scan.range, l->scan.own);
    if (l->scan.found == 0)
        return;
    l->tick = PUMP_COUNT(launches_managed, 1) + 1;
    if (l->tick % pump_config.epoch_launches == 0)
        pump_epoch_advance();
    struct pump_channel *channel = pump_channel_get();
    bool launch_rule = pump_config.policy == PUMP_POLICY_LAUNCH;
    int device = -1;
    if (pump_driver.can_prefetch && (launch_rule || pump_budget_possible())) {
        struct pump_context *c = pump_context_of(stream);
        if (c != NULL) {
            l->budget = pump_budget_for(c);
            l->capturing = -1;
            l->trigger = NULL;
            uint64_t key = channel != NULL && (channel->plan != NULL || pump_config.kernel_times)
                               ? pump_channel_launch_key(f, &l->scan) : 0;
            if (launch_rule && channel != NULL && channel->plan != NULL &&
                pump_channel_plan_trigger(channel, key, &thread_trigger))
                l->trigger = &thread_trigger;
            if (launch_rule)
                pump_residency_launch(c, stream, &l->scan, l->budget, l->trigger, &l->capturing);
            else if (l->budget != 0)
                pump_residency_off_launch(c, stream, &l->capturing);
            if (channel != NULL && pump_config.kernel_times) {
                /* Last before the launch: the probe's start follows pump's waits. */
                pump_kernel_time_poll(c);
                if (pump_kernel_due(key) && (l->probe = pump_kernel_time_begin(c, stream, key, &l->capturing)) != 0)
                    l->timed = c;
            }
            device = launch_rule || l->budget != 0 ? pump_context_device(c) : -1;
            /* After the kernel: its use (budget), policy off's rule, the plan. */
            l->stream = stream;
            if (l->budget != 0 || l->trigger != NULL)
                l->context = c;
        }
    }
    if (channel != NULL)
        pump_channel_launch(channel, f, stream, device, &l->scan);
}

static void after_launch(struct launch *l, CUresult r)
{
    if (l->timed != NULL)
        pump_kernel_time_end(l->timed, l->probe, l->stream, r == CUDA_SUCCESS);
    if (PUMP_LIKELY(l->context == NULL) || r != CUDA_SUCCESS)
        return;
    if (l->capturing < 0)
        l->capturing = pump_stream_capturing(l->stream);
    if (l->capturing)
        return;  /* nothing is added to a stream being captured */
    pump_residency_after_launch(l->context, l->stream, &l->scan, l->budget, l->tick, l->trigger);
}

#define PUMP_LAUNCH_KERNEL_HOOK(id, per_thread)                                                        \
    CUresult pump_##id(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                       unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,          \
                       void **params, void **extra)                                                    \
    {                                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                                 \
        struct launch l;                                                                               \
        before_launch(&l, f, gx, pump_stream_of(stream, per_thread), params, extra);                      \
        CUresult r = real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);                  \
        after_launch(&l, r);                                                                           \
        return r;                                                                                      \
    }
PUMP_LAUNCH_KERNEL_HOOK(launch_kernel, false)
PUMP_LAUNCH_KERNEL_HOOK(launch_kernel_ptsz, true)

#define PUMP_LAUNCH_KERNEL_EX_HOOK(id, per_thread)                                                 \
    CUresult pump_##id(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)    \
    {                                                                                              \
        PUMP_REAL_OR_RETURN(id, real);                                                             \
        struct launch l;                                                                           \
        l.context = l.timed = NULL;                                                                \
        if (config != NULL)                                                                        \
            before_launch(&l, f, config->gridDimX, pump_stream_of(config->hStream, per_thread), params, extra);      \
        CUresult r = real(config, f, params, extra);                                               \
        after_launch(&l, r);                                                                       \
        return r;                                                                                  \
    }
PUMP_LAUNCH_KERNEL_EX_HOOK(launch_kernel_ex, false)
PUMP_LAUNCH_KERNEL_EX_HOOK(launch_kernel_ex_ptsz, true)

#define PUMP_LAUNCH_COOPERATIVE_HOOK(id, per_thread)                                                   \
    CUresult pump_##id(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                       unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,          \
                       void **params)                                                                  \
    {                                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                                 \
        struct launch l;                                                                               \
        before_launch(&l, f, gx, pump_stream_of(stream, per_thread), params, NULL);                       \
        CUresult r = real(f, gx, gy, gz, bx, by, bz, shared, stream, params);                         \
        after_launch(&l, r);                                                                           \
        return r;                                                                                      \
    }
PUMP_LAUNCH_COOPERATIVE_HOOK(launch_cooperative_kernel, false)
PUMP_LAUNCH_COOPERATIVE_HOOK(launch_cooperative_kernel_ptsz, true)
