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
 * The probe's state machine is timing_events.h's. A probe is looked at LOOK_AGAIN_NS after it
 * was armed or last found running, not at every prefetch. */
#include "capture_mode.h"
#include "channel.h"
#include "link_rate.h"
#include "prefetch_ranges.h"
#include "timing_events.h"

/* A context's first probes follow one another, so that pumpd has a rate before it plans;
 * then one is armed at most every PUMP_LINK_INTERVAL_NS. */
#define FIRST_SAMPLES 4
/* A probe in flight is looked at again no sooner than this after the last look. */
#define LOOK_AGAIN_NS (PUMP_LINK_INTERVAL_NS / 16)

/* The probe in flight, under BUSY: true when it is over (reported, or dropped). */
static bool read_probe(struct pump_link_probe *l, uint32_t forgets, int device)
{
    uint64_t ns;
    if (!pump_probe_read(&l->probe, forgets, &ns))
        return false;
    if (ns > 0)
        pump_channel_link(device, l->bytes, ns);
    return true;
}

/* Under BUSY, after a probe was read: whether the next may be armed now, else when it may. */
static bool next_due(struct pump_link_probe *l, uint64_t now)
{
    if (l->armed < FIRST_SAMPLES || now - l->armed_ns >= PUMP_LINK_INTERVAL_NS)
        return true;
    __atomic_store_n(&l->next_ns, l->armed_ns + PUMP_LINK_INTERVAL_NS, __ATOMIC_RELAXED);
    return false;
}

PUMP_HIDDEN bool pump_link_probe_begin(struct pump_link_probe *l, CUcontext ctx, uint32_t forgets, CUstream stream,
                                       int device, uint64_t bytes)
{
    if (pump_driver.event_elapsed == NULL || bytes < PUMP_BLOCK_SIZE)
        return false;
    struct pump_timing_probe *p = &l->probe;
    uint64_t now = pump_channel_now_ns();
    if (now < __atomic_load_n(&l->next_ns, __ATOMIC_RELAXED))
        return false;
    uint32_t state =
        pump_probe_take(p, forgets, 1u << PUMP_PROBE_IDLE | 1u << PUMP_PROBE_IN_FLIGHT | 1u << PUMP_PROBE_BROKEN);
    if (state == PUMP_PROBE_BUSY)
        return false;
    struct pump_capture_mode mode = pump_capture_relax();
    bool armed = false;
    if (state == PUMP_PROBE_IN_FLIGHT && !read_probe(l, forgets, device)) {
        __atomic_store_n(&l->next_ns, now + LOOK_AGAIN_NS, __ATOMIC_RELAXED);
    } else if (state == PUMP_PROBE_IN_FLIGHT && !next_due(l, now)) {
        state = PUMP_PROBE_IDLE;
    } else if (!pump_probe_events(p, ctx, forgets)) {
        state = PUMP_PROBE_BROKEN;
        pump_log_once("cannot create timing events: pumpd plans without the link's measured rate (tried again "
                      "when the context is made again)");
    } else if (pump_call_ok(pump_driver.event_record(p->start, stream), "cuEventRecord")) {
        l->bytes = bytes;
        l->armed_ns = now;
        l->armed++;
        __atomic_store_n(&l->next_ns, now + LOOK_AGAIN_NS, __ATOMIC_RELAXED);
        armed = true;  /* BUSY until pump_link_probe_end */
    } else {
        state = PUMP_PROBE_IDLE;
    }
    pump_capture_restore(&mode);
    if (!armed)
        pump_probe_let_go(p, state);
    return armed;
}

PUMP_HIDDEN void pump_link_probe_end(struct pump_link_probe *l, CUstream stream, bool ok)
{
    struct pump_capture_mode mode = pump_capture_relax();
    bool recorded = ok && pump_call_ok(pump_driver.event_record(l->probe.end, stream), "cuEventRecord");
    pump_capture_restore(&mode);
    pump_probe_let_go(&l->probe, recorded ? PUMP_PROBE_IN_FLIGHT : PUMP_PROBE_IDLE);
}
