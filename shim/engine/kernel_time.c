/* kernel_time.c: timing a few launches of each launch key (see kernel_time.h).
 *
 * A probe is two timing events on the launch's own stream, recorded just before and just
 * after the launch call, after the waits pump gave the stream: the start completes once the
 * stream's earlier work and those waits have, so the two bracket the kernel alone (its
 * faults included, its wait for pump's prefetches not). Its result is read at a later
 * launch in the context, never waited for. A launch key is timed at its first
 * PUMP_KERNEL_FIRST_SAMPLES launches (pumpd needs kernel times before it plans), then at
 * most once a PUMP_KERNEL_KEY_INTERVAL_NS (kernels change: faults vanish under a plan):
 * two event records per timed launch and a query per look, not a cost per launch.
 *
 * The probes' state machine is timing_events.h's. Which keys were timed is kept in a
 * direct-mapped table: a key that lost its slot to another is timed again (more samples, never
 * wrong ones). */
#include <time.h>

#include "capture_mode.h"
#include "channel.h"
#include "kernel_time.h"
#include "prefetch.h"
#include "prefetch_context.h"
#include "prefetch_ranges.h"
#include "timing_events.h"

/* A probe a launch may take: idle, or broken in an earlier life of its context. */
#define FRESH (1u << PUMP_PROBE_IDLE | 1u << PUMP_PROBE_BROKEN)
/* Probes in flight are looked at no sooner than this after the last look. */
#define PUMP_KERNEL_LOOK_NS 20000
#define KEY_SLOT_BITS 12

static struct {
    uint64_t key, timed_ns;  /* atomic each */
    uint32_t samples;        /* atomic */
} timed[1u << KEY_SLOT_BITS];

static inline uint32_t key_slot(uint64_t key)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - KEY_SLOT_BITS));
}

/* The coarse clock (a few ms; vDSO, no syscall): the launch path asks it at every launch of
 * a key timed enough, and the interval is seconds. */
static uint64_t coarse_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

PUMP_HIDDEN bool pump_kernel_due(uint64_t key)
{
    uint32_t s = key_slot(key);
    if (__atomic_load_n(&timed[s].key, __ATOMIC_RELAXED) != key ||
        __atomic_load_n(&timed[s].samples, __ATOMIC_RELAXED) < PUMP_KERNEL_FIRST_SAMPLES)
        return true;
    return coarse_ns() - __atomic_load_n(&timed[s].timed_ns, __ATOMIC_RELAXED) >= PUMP_KERNEL_KEY_INTERVAL_NS;
}

static void note_timed(uint64_t key)
{
    uint32_t s = key_slot(key);
    if (__atomic_exchange_n(&timed[s].key, key, __ATOMIC_RELAXED) != key)
        __atomic_store_n(&timed[s].samples, 0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&timed[s].samples, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&timed[s].timed_ns, coarse_ns(), __ATOMIC_RELAXED);
}

PUMP_HIDDEN int pump_kernel_time_begin(struct pump_context *c, CUstream stream, uint64_t key, int *capturing)
{
    struct pump_kernel_probes *p = &c->kernels;
    if (pump_driver.event_elapsed == NULL || __atomic_load_n(&p->in_flight, __ATOMIC_RELAXED) >= PUMP_KERNEL_PROBES)
        return 0;
    uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
    int i = 0;  /* most slots are in flight in a burst: pump_probe_take loads before it swaps */
    while (i < PUMP_KERNEL_PROBES && pump_probe_take(&p->probe[i], forgets, FRESH) == PUMP_PROBE_BUSY)
        i++;
    if (i == PUMP_KERNEL_PROBES)
        return 0;
    uint64_t started = pump_channel_now_ns();
    if (*capturing < 0)
        *capturing = pump_stream_capturing(stream);
    struct pump_capture_mode mode = pump_capture_relax();
    uint32_t state = PUMP_PROBE_IDLE;
    int taken = 0;
    if (*capturing) {
        /* nothing is added to a stream being captured */
    } else if (!pump_probe_events(&p->probe[i], c->key, forgets)) {
        state = PUMP_PROBE_BROKEN;
        pump_log_once("cannot create timing events: pumpd plans from launch intervals, not kernel times (tried "
                      "again when the context is made again)");
    } else if (pump_call_ok(pump_driver.event_record(p->probe[i].start, stream), "cuEventRecord")) {
        p->key[i] = key;
        note_timed(key);
        taken = i + 1;  /* BUSY until pump_kernel_time_end */
    }
    pump_capture_restore(&mode);
    if (!taken)
        pump_probe_let_go(&p->probe[i], state);
    pump_channel_own_time(pump_channel_now_ns() - started);  /* not kernel time (LAUNCH stamps) */
    return taken;
}

PUMP_HIDDEN void pump_kernel_time_end(struct pump_context *c, int probe, CUstream stream, bool launched)
{
    struct pump_kernel_probes *p = &c->kernels;
    int i = probe - 1;
    uint64_t started = pump_channel_now_ns();
    struct pump_capture_mode mode = pump_capture_relax();
    bool recorded = launched && pump_call_ok(pump_driver.event_record(p->probe[i].end, stream), "cuEventRecord");
    pump_capture_restore(&mode);
    pump_channel_own_time(pump_channel_now_ns() - started);
    if (recorded)
        __atomic_fetch_add(&p->in_flight, 1, __ATOMIC_RELAXED);
    pump_probe_let_go(&p->probe[i], recorded ? PUMP_PROBE_IN_FLIGHT : PUMP_PROBE_IDLE);
}

/* Under BUSY, probe i in flight: true when it is over (reported, or dropped). */
static bool read_probe(struct pump_context *c, int i, uint32_t forgets)
{
    uint64_t ns;
    if (!pump_probe_read(&c->kernels.probe[i], forgets, &ns))
        return false;
    if (ns > 0)
        pump_channel_kernel(c->device, c->kernels.key[i], ns);
    return true;
}

/* Reports c's probes that have finished: at a launch no sooner than PUMP_KERNEL_LOOK_NS after
 * the last look (soon: one thread at a time), after a synchronisation at once. */
static void look(struct pump_context *c, bool soon)
{
    struct pump_kernel_probes *p = &c->kernels;
    if (__atomic_load_n(&p->in_flight, __ATOMIC_RELAXED) == 0)
        return;
    uint64_t now = pump_channel_now_ns();
    uint64_t next = __atomic_load_n(&p->next_look_ns, __ATOMIC_RELAXED);
    if (soon && (now < next || !__atomic_compare_exchange_n(&p->next_look_ns, &next, now + PUMP_KERNEL_LOOK_NS,
                                                            false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)))
        return;  /* not yet, or another thread looks now */
    uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
    struct pump_capture_mode mode = pump_capture_relax();
    uint64_t started = pump_channel_now_ns();
    for (int i = 0; i < PUMP_KERNEL_PROBES; i++) {
        if (__atomic_load_n(&p->probe[i].state, __ATOMIC_RELAXED) != PUMP_PROBE_IN_FLIGHT ||
            pump_probe_take(&p->probe[i], forgets, 1u << PUMP_PROBE_IN_FLIGHT) == PUMP_PROBE_BUSY)
            continue;
        bool over = read_probe(c, i, forgets);
        if (over)
            __atomic_fetch_sub(&p->in_flight, 1, __ATOMIC_RELAXED);
        pump_probe_let_go(&p->probe[i], over ? PUMP_PROBE_IDLE : PUMP_PROBE_IN_FLIGHT);
        if (!over)
            break;  /* one still running: the others most likely are too (read at a later look) */
    }
    pump_capture_restore(&mode);
    pump_channel_own_time(pump_channel_now_ns() - started);
}

PUMP_HIDDEN void pump_kernel_time_poll(struct pump_context *c)
{
    look(c, true);
}

PUMP_HIDDEN void pump_kernel_time_synchronised(void)
{
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&pump_contexts[i].ctx, __ATOMIC_ACQUIRE) != NULL)
            look(&pump_contexts[i], false);
}
