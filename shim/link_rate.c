/* link_rate.c: timing one of pump's prefetches now and then (see link_rate.h).
 *
 * A context's probe is two timing events on pump's prefetch stream, recorded just
 * before and just after one prefetch call: the start completes once the stream's
 * earlier work has, so the two bracket that prefetch alone, waits the stream was
 * given before it excluded. Its result is read at a later prefetch in the context,
 * never waited for. At most one probe per context is in flight; after the first
 * FIRST_SAMPLES, one is armed at most every PUMP_LINK_INTERVAL_NS: four driver calls
 * a sample (two records, a query, the elapsed time), not a cost per launch.
 *
 * Only a prefetch of blocks pump evicted before and believes still on the host, every one,
 * is timed (its caller says): their bytes cross the link. A batch that also names resident
 * blocks moves less than it names (seen at 3,806 GB/s on fakecuda's 25 GB/s link). A first prefetch of memory nothing
 * wrote moves no data (1,068 to 3,130 GB/s on fakecuda: three of a budget's first four
 * samples, whose median pumpd then planned at). A sample is still what the GPU took for
 * that prefetch: bytes faulted back meanwhile make it look faster, a fault-time eviction
 * to make room or a copy sharing the link slower. pumpd takes the lower median of a
 * session's last samples, once it has three (daemon/pumpd/jobs.py).
 *
 * States move by compare-and-swap; the thread that takes BUSY owns the events until
 * it lets go, and holds no lock meanwhile. A probe is looked at LOOK_AGAIN_NS after it
 * was armed or last found running, not at every prefetch. */
#include "capture_mode.h"
#include "channel.h"
#include "link_rate.h"
#include "prefetch_ranges.h"
#include "timing_events.h"

enum { PROBE_IDLE, PROBE_BUSY, PROBE_IN_FLIGHT, PROBE_BROKEN };

/* A context's first probes follow one another, so that pumpd has a rate before it plans;
 * then one is armed at most every PUMP_LINK_INTERVAL_NS. */
#define FIRST_SAMPLES 4
/* A probe in flight is looked at again no sooner than this after the last look. */
#define LOOK_AGAIN_NS (PUMP_LINK_INTERVAL_NS / 16)

static bool take(struct pump_link_probe *p, uint32_t from)
{
    return __atomic_compare_exchange_n(&p->state, &from, PROBE_BUSY, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void let_go(struct pump_link_probe *p, uint32_t to)
{
    __atomic_store_n(&p->state, to, __ATOMIC_RELEASE);
}

/* The probe in flight, under BUSY: true when it is over (reported, or dropped). */
static bool read_probe(struct pump_link_probe *p, uint32_t forgets, int device)
{
    if (p->forgets != forgets) {
        p->made = false;  /* its context went, and its events with it */
        return true;
    }
    uint64_t ns;
    if (!pump_timing_events_read(p->start, p->end, &ns))
        return false;
    if (ns > 0)
        pump_channel_link(device, p->bytes, ns);
    return true;
}

/* Under BUSY: the events made in ctx (timing on), once per context's life. */
static bool make_events(struct pump_link_probe *p, CUcontext ctx, uint32_t forgets)
{
    if (p->made && p->forgets == forgets)
        return true;
    bool made = pump_timing_events_make(ctx, &p->start, &p->end);
    p->made = made;
    p->forgets = forgets;
    return made;
}

/* Under BUSY, after a probe was read: whether the next may be armed now, else when it may. */
static bool next_due(struct pump_link_probe *p, uint64_t now)
{
    if (p->armed < FIRST_SAMPLES || now - p->armed_ns >= PUMP_LINK_INTERVAL_NS)
        return true;
    __atomic_store_n(&p->next_ns, p->armed_ns + PUMP_LINK_INTERVAL_NS, __ATOMIC_RELAXED);
    return false;
}

PUMP_HIDDEN bool pump_link_probe_begin(struct pump_link_probe *p, CUcontext ctx, uint32_t forgets, CUstream stream,
                                       int device, uint64_t bytes)
{
    if (pump_driver.event_elapsed == NULL || bytes < PUMP_BLOCK_SIZE)
        return false;
    uint32_t state = __atomic_load_n(&p->state, __ATOMIC_RELAXED);
    uint64_t now = pump_channel_now_ns();
    if ((state != PROBE_IDLE && state != PROBE_IN_FLIGHT) || now < __atomic_load_n(&p->next_ns, __ATOMIC_RELAXED) ||
        !take(p, state))
        return false;
    struct pump_capture_mode mode = pump_capture_relax();
    bool armed = false;
    if (state == PROBE_IN_FLIGHT && !read_probe(p, forgets, device)) {
        __atomic_store_n(&p->next_ns, now + LOOK_AGAIN_NS, __ATOMIC_RELAXED);
    } else if (state == PROBE_IN_FLIGHT && !next_due(p, now)) {
        state = PROBE_IDLE;
    } else if (!make_events(p, ctx, forgets)) {
        state = PROBE_BROKEN;
        pump_log_once("cannot create timing events: pumpd plans without the link's measured rate");
    } else if (pump_call_ok(pump_driver.event_record(p->start, stream), "cuEventRecord")) {
        p->bytes = bytes;
        p->armed_ns = now;
        p->armed++;
        __atomic_store_n(&p->next_ns, now + LOOK_AGAIN_NS, __ATOMIC_RELAXED);
        armed = true;  /* BUSY until pump_link_probe_end */
    } else {
        state = PROBE_IDLE;
    }
    pump_capture_restore(&mode);
    if (!armed)
        let_go(p, state);
    return armed;
}

PUMP_HIDDEN void pump_link_probe_end(struct pump_link_probe *p, CUstream stream, bool ok)
{
    struct pump_capture_mode mode = pump_capture_relax();
    bool recorded = ok && pump_call_ok(pump_driver.event_record(p->end, stream), "cuEventRecord");
    pump_capture_restore(&mode);
    let_go(p, recorded ? PROBE_IN_FLIGHT : PROBE_IDLE);
}
