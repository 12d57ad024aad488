/* residency_ahead.c: room made ahead (see residency_ahead.h), issue 41 item 3.
 *
 * The launch rule makes room for a launch's blocks by evicting, and it decides on the
 * launching thread; if the calls were made there too, each would hold that thread, since
 * a migration to the host waits inside the call for its copies ("Creating CPU mappings
 * must wait for the migration to complete", uvm_ioctl.h; 11.2 GB/s out on the first H100:
 * about 190 us a 2 MiB block), and the program stops queuing kernels meanwhile. So, as a
 * kernel's page reclaim keeps free memory between a low and a high watermark, after a
 * launch on a device where less room than LOW recent launches brought is left under the
 * budget, the least recently used blocks (freed tensors' first, residency_evict.c) leave
 * until HIGH launches' worth is free. The decision is made after the kernel, so pump's
 * worker makes its calls (residency_moves.c: nothing on the program's streams waits for
 * it), and the next launches find their room: a prefetch waits on the GPU for the
 * evictions whose calls were made where they make room enough (residency.c), and makes
 * those not made yet itself (a drain) only where they do not. The watermarks were chosen
 * on bench/steady_step.c (medians of 3 runs, each against PUMP_EVICT_AHEAD=0): one launch's
 * worth ahead, then two, left the room to the next launch before the worker had begun (at a
 * 200 MiB budget 410 of some 540 decisions taken over); 2 and 4 took 67 over, the launching
 * thread's modelled host time 84 -> 35 us a launch, the step 52.6 -> 49.0 ms, 318/322 ->
 * 334/337 MiB in/out (at 150 MiB: 105 -> 45 us, 63.8 -> 59.3 ms, 412/416 -> 426/430).
 *
 * `ahead` is the most a launch brought lately: each launch that brought bytes keeps the
 * larger of them and seven eighths of the old figure, at most budget / AHEAD_MOST, so at
 * most an eighth of the budget is kept free, and none under a budget of fewer than
 * AHEAD_MOST blocks, where even one 2 MiB block is more (examples/managed_saxpy.py at 12
 * MiB: 28 MiB prefetched against 24, 18 evicted against 12). And only while the device is
 * pressed: a launch had to evict, or room was made ahead, within its last PRESSED_LAUNCHES
 * launches that brought bytes. A job whose memory the budget holds is never pressed, and
 * keeps it all (tests/test_residency.py: under a 14 MiB budget that holds a step's 14 MiB
 * exactly, room made ahead brought back 3 to 5 blocks a step it had evicted).
 *
 * Only blocks pump's eviction moves make room ahead: one it leaves to the driver (read-
 * mostly, its duplicate freed only by the driver's own eviction) would be room believed
 * and not had (over a half-full device with read-mostly weights the driver then evicted
 * behind pump: 309 faults a step). Not under a plan (pumpd's lookahead evicts ahead
 * itself) nor under policy off; nor where pump's own budget may hold (--capacity host): a
 * block pump evicts keeps its chunk on the device until the driver needs it
 * (uvm_pmm_gpu.c), so the room kept free reads as taken at the next synchronisation, and
 * the budget that follows the readings fell (tests/test_budget.py's default-budget run
 * changed it 4 times against 2) where it should stand. Nor does pump simulate model it
 * (tests/test_replay_vs_simulate.py replays with it off).
 */
#include "capacity.h"
#include "residency.h"
#include "residency_ahead.h"
#include "residency_evict.h"

/* The watermarks, in launches' worth of room, and the most room kept. */
#define LOW 2
#define HIGH 4
#define AHEAD_MOST 32
/* Launches that bring bytes, no eviction among them, after which a device is not pressed. */
#define PRESSED_LAUNCHES 64

PUMP_HIDDEN void pump_ahead_learn(int device, uint64_t brought, bool evicted, uint64_t budget)
{
    struct pump_device_state *d = &pump_devices[device];
    if (evicted)
        d->ahead_pressed = PRESSED_LAUNCHES;
    else if (brought > 0 && d->ahead_pressed > 0)
        d->ahead_pressed--;
    uint64_t ahead = __atomic_load_n(&d->ahead, __ATOMIC_RELAXED);
    if (d->ahead_pressed == 0 || budget / AHEAD_MOST < PUMP_BLOCK_SIZE || pump_capacity_beyond_device(device)) {
        ahead = 0;
    } else if (brought > 0) {
        ahead -= ahead / 8;
        if (brought > ahead)
            ahead = brought;
        if (ahead > budget / AHEAD_MOST)
            ahead = budget / AHEAD_MOST;
    }
    __atomic_store_n(&d->ahead, ahead, __ATOMIC_RELAXED);
}

PUMP_HIDDEN void pump_ahead_evict(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                                  uint64_t budget, uint64_t token)
{
    struct pump_device_state *d = &pump_devices[device];
    uint64_t ahead = __atomic_load_n(&d->ahead, __ATOMIC_RELAXED);
    if (ahead == 0 || __atomic_load_n(&d->resident, __ATOMIC_RELAXED) + LOW * ahead <= budget)
        return;
    struct pump_decision dn = {.c = c, .device = device, .fallback = token};
    if (!pump_decision_begin(&dn, ranges, n, NULL, 0))
        return;
    struct evictions e = {.dn = &dn, .moving_only = true};
    uint64_t before = d->resident;
    if (before + LOW * ahead > budget)  /* again, under the lock */
        pump_make_room(&e, HIGH * ahead, budget, PUMP_ORDER_USED);
    pump_evictions_flush(&e);
    uint64_t freed = before - d->resident;
    if (freed > 0)
        d->ahead_pressed = PRESSED_LAUNCHES;
    pump_decision_unlock(&dn);
    pump_decision_make(&dn);
    if (freed > 0) {
        PUMP_COUNT(ahead_decisions, 1);
        PUMP_COUNT(ahead_bytes, freed);
    }
}
