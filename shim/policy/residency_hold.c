/* residency_hold.c: the budget held after a kernel (see residency_hold.h): policy off's
 * emulation of a card of the budget's size, which evicts and leaves the fills to the
 * kernels' faults, and any policy's return under a budget that was lowered. Their
 * decisions are made after the kernel, so pump's worker makes their calls
 * (residency_moves.c). */
#include "prefetch_worker.h"
#include "residency.h"
#include "residency_evict.h"
#include "residency_hold.h"

/* Policy off's decision is made (by pump's worker, or here); the next kernel on the device
 * waits for its evictions (pump_residency_off_launch). */
static void off_decision_make(struct pump_decision *dn)
{
    bool evicts = dn->n > 0;
    pump_decision_make(dn);
    if (evicts)
        __atomic_fetch_add(&pump_devices[dn->device].off_evictions, 1, __ATOMIC_RELEASE);
}

PUMP_HIDDEN void pump_residency_off_launch(struct pump_context *c, CUstream stream, int *capturing)
{
    int device = pump_context_device(c);
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct pump_device_state *d = &pump_devices[device];
    uint64_t made = __atomic_load_n(&d->off_evictions, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&d->off_waited, __ATOMIC_RELAXED) == made)
        return;
    if (*capturing < 0)
        *capturing = pump_stream_capturing(stream);
    if (*capturing)
        return;
    pump_worker_wait(device);
    pump_evictions_wait(c, stream);
    PUMP_COUNT(off_kernel_waits, 1);
    uint64_t old = __atomic_load_n(&d->off_waited, __ATOMIC_RELAXED);
    while (old < made && !__atomic_compare_exchange_n(&d->off_waited, &old, made, true, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED)) {
    }
}

/* Policy off with a budget: the launch's blocks are counted in (the kernel
 * faults in what it touches), then the oldest others leave until it holds. */
PUMP_HIDDEN void pump_off_rule(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                               uint64_t budget, uint64_t token)
{
    uint32_t counted = 0;
    for (uint32_t r = 0; r < n; r++)
        counted += __atomic_load_n(&ranges[r]->accounted_on, __ATOMIC_RELAXED) == (uint32_t)device + 1;
    if (counted == n)
        return;
    struct pump_decision dn = {.c = c, .device = device, .fallback = token};
    if (!pump_decision_begin(&dn, ranges, n, NULL, 0))
        return;
    for (uint32_t r = 0; r < n; r++) {
        struct pump_blocks *a = ranges[r]->blocks;
        if (a == NULL)
            continue;
        for (uint32_t i = 0; i < a->count; i++)
            pump_block_count_in(a, i, device);
        pump_blocks_refresh(a, device, 0);
    }
    struct evictions e = {.dn = &dn};
    pump_make_room(&e, 0, budget, PUMP_ORDER_MIGRATED);
    pump_evictions_flush(&e);
    pump_decision_unlock(&dn);
    off_decision_make(&dn);
}

/* Over the budget although every rule kept to it: the budget was lowered (the
 * arbiter, `pump` set) or a rule could not help it (policy off's launch larger
 * than the budget). The oldest blocks but this launch's leave. */
PUMP_HIDDEN void pump_hold_budget(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                                  uint64_t budget, uint64_t token)
{
    struct pump_decision dn = {.c = c, .device = device, .fallback = token};
    if (!pump_decision_begin(&dn, ranges, n, NULL, 0))
        return;
    struct evictions e = {.dn = &dn};
    pump_make_room(&e, 0, budget, PUMP_ORDER_MIGRATED);
    pump_evictions_flush(&e);
    pump_decision_unlock(&dn);
    if (pump_config.policy == PUMP_POLICY_OFF)
        off_decision_make(&dn);
    else
        pump_decision_make(&dn);
}
