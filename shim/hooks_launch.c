/* hooks_launch.c: every kernel launch entry point, and what pump does before
 * forwarding it: count it, scan its arguments, add what the daemon's plan
 * names for this function, prefetch at launch, and tell the daemon.
 */
#include "channel.h"
#include "hooks_common.h"
#include "prefetch.h"

static void before_launch(CUfunction f, CUstream stream, void **params, void **extra)
{
    PUMP_COUNT(launches, 1);
    if (PUMP_UNLIKELY(!pump_active()) || pump_ranges_empty())
        return;
    struct pump_scan scan;
    pump_scan_launch(f, params, extra, &scan);
    if (scan.unscanned)
        PUMP_COUNT(launches_unscanned, 1);
    if (scan.found == 0)
        return;
    uint64_t managed = PUMP_COUNT(launches_managed, 1) + 1;
    if (managed % pump_config.epoch_launches == 0)
        pump_epoch_advance();
    struct pump_channel *channel = pump_channel_get();
    int device = -1;
    if (pump_config.policy == PUMP_POLICY_LAUNCH && pump_driver.can_prefetch) {
        if (channel != NULL)
            pump_channel_plan_extend(channel, f, &scan);
        device = pump_prefetch_for_launch(stream, &scan);
    }
    if (channel != NULL)
        pump_channel_launch(channel, f, stream, device, &scan);
}

#define PUMP_LAUNCH_KERNEL_HOOK(id, per_thread)                                                        \
    CUresult pump_##id(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                       unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,          \
                       void **params, void **extra)                                                    \
    {                                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                                 \
        before_launch(f, pump_stream_of(stream, per_thread), params, extra);                          \
        return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);                        \
    }
PUMP_LAUNCH_KERNEL_HOOK(launch_kernel, false)
PUMP_LAUNCH_KERNEL_HOOK(launch_kernel_ptsz, true)

#define PUMP_LAUNCH_KERNEL_EX_HOOK(id, per_thread)                                                 \
    CUresult pump_##id(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)    \
    {                                                                                              \
        PUMP_REAL_OR_RETURN(id, real);                                                             \
        if (config != NULL)                                                                        \
            before_launch(f, pump_stream_of(config->hStream, per_thread), params, extra);          \
        return real(config, f, params, extra);                                                     \
    }
PUMP_LAUNCH_KERNEL_EX_HOOK(launch_kernel_ex, false)
PUMP_LAUNCH_KERNEL_EX_HOOK(launch_kernel_ex_ptsz, true)

#define PUMP_LAUNCH_COOPERATIVE_HOOK(id, per_thread)                                                   \
    CUresult pump_##id(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                       unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,          \
                       void **params)                                                                  \
    {                                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                                 \
        before_launch(f, pump_stream_of(stream, per_thread), params, NULL);                           \
        return real(f, gx, gy, gz, bx, by, bz, shared, stream, params);                               \
    }
PUMP_LAUNCH_COOPERATIVE_HOOK(launch_cooperative_kernel, false)
PUMP_LAUNCH_COOPERATIVE_HOOK(launch_cooperative_kernel_ptsz, true)

/* A graph replay is one call: its kernels are not seen one by one. */
#define PUMP_GRAPH_LAUNCH_HOOK(id)                        \
    CUresult pump_##id(CUgraphExec graph, CUstream stream) \
    {                                                     \
        PUMP_REAL_OR_RETURN(id, real);                    \
        PUMP_COUNT(graph_launches, 1);                    \
        return real(graph, stream);                       \
    }
PUMP_GRAPH_LAUNCH_HOOK(graph_launch)
PUMP_GRAPH_LAUNCH_HOOK(graph_launch_ptsz)
