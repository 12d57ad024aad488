/* channel.c: the shim's side of the channels to pumpd (see channel.h and
 * pump_channel.h).
 *
 * Here: the event ring's writer (the launch path), the events pump sends,
 * the plan's reader, and installing what the worker (channel_worker.c)
 * received. The launching threads never wait on any of this.
 *
 * Everything the daemon wrote is untrusted: the ring's geometry is checked
 * once and kept here, positions read back from the ring only ever index it
 * modulo its capacity, and plan contents are bounds-checked on every read.
 * The memfds must be sealed against shrinking, so no one holding them can
 * make the process fault on its own mapping.
 */
#include <string.h>
#include <time.h>

#include "channel.h"
#include "handles.h"
#include "layouts.h"
#include "names.h"

_Static_assert(sizeof(struct pump_event) == 64, "a ring record is 64 bytes");
_Static_assert(sizeof(struct pump_ring_header) == 256, "the ring header is 256 bytes");
_Static_assert(sizeof(struct pump_msg_header) == 16, "the message header is 16 bytes");
_Static_assert(offsetof(struct pump_ring_header, head) == 64 && offsetof(struct pump_ring_header, tail) == 128 &&
                   offsetof(struct pump_ring_header, written) == 192,
               "head, tail and the counters sit on cache lines of their own");
_Static_assert(offsetof(struct pump_plan, trigger) == 64, "the plan's triggers follow a 64-byte header");

#define RING_HEADER_BYTES ((uint64_t)sizeof(struct pump_ring_header))
/* A record reservation gives up after this many lost races (a head that
 * someone else keeps moving must not stall a launch). */
#define RESERVE_ATTEMPTS 64

static struct pump_channel channel;
PUMP_HIDDEN struct pump_channel *_Atomic pump_channel_live;
static atomic_bool exiting;  /* the process is exiting: no more driver calls */


/* ---- the event ring: the writer (hot path) ---- */

static inline void put64(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* This thread's time in pump's own driver calls so far (pump_channel_own_time). */
static _Thread_local uint64_t own_ns __attribute__((tls_model("initial-exec")));
/* This thread's last stamp: a record written during a decision (a DEVICE record from inside
 * a prefetch) is stamped before the decision's time is left out, so the next record, with it
 * left out, could read earlier; each thread's stamps never go back. */
static _Thread_local uint64_t last_stamp_ns __attribute__((tls_model("initial-exec")));

PUMP_HIDDEN void pump_channel_own_time(uint64_t ns)
{
    own_ns += ns;
}

PUMP_HIDDEN uint64_t pump_channel_now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

PUMP_HIDDEN void pump_channel_emit(struct pump_channel *c, const struct pump_event *records, uint32_t n)
{
    struct pump_ring_header *h = c->ring;
    if (PUMP_UNLIKELY(n == 0 || n > c->capacity))
        return;
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    for (int attempt = 0;; attempt++) {
        uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
        /* Unsigned: a tail past the head (a broken reader) reads as full. */
        if (PUMP_UNLIKELY(head + n - tail > c->capacity || attempt == RESERVE_ATTEMPTS)) {
            __atomic_fetch_add(&h->dropped, n, __ATOMIC_RELAXED);
            PUMP_COUNT(events_dropped, n);
            return;
        }
        if (PUMP_LIKELY(__atomic_compare_exchange_n(&h->head, &head, head + n, true, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)))
            break;
    }
    uint64_t time_ns = pump_channel_now_ns() - own_ns;
    if (time_ns < last_stamp_ns)
        time_ns = last_stamp_ns;
    last_stamp_ns = time_ns;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t position = head + i;
        struct pump_event *e = &c->records[position & c->mask];
        /* Atomic stores: a slot is rewritten by whichever thread reserves it
         * next time round, ordered only through the daemon's tail. */
        __atomic_store_n(&e->kind, records[i].kind, __ATOMIC_RELAXED);
        __atomic_store_n(&e->count, records[i].count, __ATOMIC_RELAXED);
        __atomic_store_n(&e->device, records[i].device, __ATOMIC_RELAXED);
        put64(&e->time_ns, time_ns);
        for (int a = 0; a < 5; a++)
            put64(&e->arg[a], records[i].arg[a]);
        __atomic_store_n(&e->seq, position + 1, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&h->written, n, __ATOMIC_RELAXED);
    PUMP_COUNT(events_written, n);
}

static inline struct pump_event event(uint16_t kind, uint16_t count, int32_t device)
{
    return (struct pump_event){.kind = kind, .count = count, .device = device};
}

PUMP_HIDDEN void pump_channel_alloc(struct pump_range *range, uint64_t base, uint64_t size, uint32_t flags)
{
    struct pump_channel *c = pump_channel_get();
    uint32_t not_yet = 0;
    if (c == NULL || range == NULL ||
        !__atomic_compare_exchange_n(&range->announced, &not_yet, 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    struct pump_event e = event(PUMP_EVENT_ALLOC, 1, -1);
    uint64_t name = __atomic_load_n(&range->name, __ATOMIC_RELAXED);
    e.arg[0] = name != 0 ? name : base;
    e.arg[1] = size;
    e.arg[2] = flags;
    e.arg[3] = name != 0 ? base : 0;  /* where a named tensor is, for traces */
    pump_channel_emit(c, &e, 1);
}

PUMP_HIDDEN void pump_channel_free(uint64_t base, uint64_t size)
{
    struct pump_channel *c = pump_channel_get();
    if (c == NULL)
        return;
    struct pump_event e = event(PUMP_EVENT_FREE, 1, -1);
    e.arg[0] = base;
    e.arg[1] = size;
    pump_channel_emit(c, &e, 1);
}

/* The bases a LAUNCH carries (pump/channel.py's LAUNCH_BASES_MAX): a wider launch's first ones.
 * Enough for PyTorch's multi_tensor_apply (up to 150 tensors a launch): pumpd's plan names as a
 * launch's need only the allocations it heard of, and the shim takes the others whole at the
 * launch (64 left GPT-2 small's optimizer launches about 1,700 blocks a step to move there). */
#define LAUNCH_BASES_MAX 256

static uint32_t launch_bases(const struct pump_scan *scan)
{
    return scan->own < LAUNCH_BASES_MAX ? scan->own : LAUNCH_BASES_MAX;
}

PUMP_HIDDEN void pump_channel_launch(struct pump_channel *c, CUfunction f, CUstream stream, int device,
                                     const struct pump_scan *scan)
{
    /* 3 bases in the LAUNCH record, 5 in each LAUNCH_MORE. */
    struct pump_event records[1 + (LAUNCH_BASES_MAX + 4) / 5];
    uint32_t own = launch_bases(scan);
    records[0] = event(PUMP_EVENT_LAUNCH, (uint16_t)own, device);
    records[0].arg[0] = (uint64_t)(uintptr_t)f;
    records[0].arg[1] = (uint64_t)(uintptr_t)stream;
    uint32_t n = 1, slot = 2;
    for (uint32_t i = 0; i < own; i++) {
        if (slot == 5) {
            records[n] = event(PUMP_EVENT_LAUNCH_MORE, 0, device);
            n++;
            slot = 0;
        }
        records[n - 1].arg[slot++] = pump_range_name(scan->range[i]);
        if (n > 1)
            records[n - 1].count++;
    }
    pump_channel_emit(c, records, n);
}

static const char *function_name(CUfunction f)
{
    return atomic_load_explicit(&exiting, memory_order_relaxed) ? "" : pump_handle_name(f);
}

PUMP_HIDDEN void pump_channel_function(struct pump_channel *c, CUfunction f)
{
    enum { FIRST_BYTES = 32, MORE_BYTES = 40 };
    struct pump_event records[1 + (PUMP_FUNCTION_NAME_MAX - FIRST_BYTES + MORE_BYTES - 1) / MORE_BYTES];
    const char *name = function_name(f);
    size_t length = strnlen(name, PUMP_FUNCTION_NAME_MAX);
    records[0] = event(PUMP_EVENT_FUNCTION, (uint16_t)length, -1);
    records[0].arg[0] = (uint64_t)(uintptr_t)f;
    size_t part = length < FIRST_BYTES ? length : FIRST_BYTES;
    memcpy(&records[0].arg[1], name, part);
    uint32_t n = 1;
    for (size_t done = part; done < length; done += part, n++) {
        part = length - done < MORE_BYTES ? length - done : MORE_BYTES;
        records[n] = event(PUMP_EVENT_NAME, (uint16_t)part, -1);
        memcpy(&records[n].arg[0], name + done, part);
    }
    pump_channel_emit(c, records, n);
}

/* A record of `kind` about no device with one argument. */
static void emit_one(uint16_t kind, uint64_t arg)
{
    struct pump_channel *c = pump_channel_get();
    if (c == NULL)
        return;
    struct pump_event e = event(kind, 1, -1);
    e.arg[0] = arg;
    pump_channel_emit(c, &e, 1);
}

PUMP_HIDDEN void pump_channel_sync(uint32_t epoch)
{
    emit_one(PUMP_EVENT_SYNC, epoch);
}

PUMP_HIDDEN void pump_channel_step(uint64_t step)
{
    emit_one(PUMP_EVENT_STEP, step);
}

/* ---- devices: which GPUs the process works on (DEVICE) ----
 * Each device's UUID is read once and announced once per daemon: at first
 * use if a channel is live, else by pump_channel_install. The two race
 * without a lock: the user stores KNOWN then loads the channel, the worker
 * stores the channel then loads KNOWN (all sequentially consistent), so at
 * least one of them sees the other, and `announced` lets only one emit. */
/* Ordinals 0 .. PUMP_DEVICES_MAX - 1 are announced (pump/channel.py: DEVICES_MAX). */
enum { DEVICE_UNKNOWN, DEVICE_READING, DEVICE_KNOWN, DEVICE_FAILED };
static struct {
    _Atomic uint32_t state;
    atomic_bool announced;
    uint64_t uuid[2];          /* written before state becomes DEVICE_KNOWN */
} devices[PUMP_DEVICES_MAX];

static void announce_device(struct pump_channel *c, int device, bool again)
{
    if (atomic_load(&devices[device].state) != DEVICE_KNOWN ||
        (!again && atomic_exchange(&devices[device].announced, true)))
        return;
    struct pump_event e = event(PUMP_EVENT_DEVICE, 16, device);
    e.arg[0] = devices[device].uuid[0];
    e.arg[1] = devices[device].uuid[1];
    pump_channel_emit(c, &e, 1);
}

PUMP_HIDDEN void pump_channel_device(CUdevice device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX) {
        pump_log_once("device %d is past the %d devices pump names to pumpd: its jobs count against GPU 0",
                      (int)device, PUMP_DEVICES_MAX);
        return;
    }
    uint32_t unknown = DEVICE_UNKNOWN;
    if (!atomic_compare_exchange_strong(&devices[device].state, &unknown, DEVICE_READING))
        return;  /* read already, or being read */
    CUuuid uuid;
    if (pump_driver.device_get_uuid == NULL || pump_driver.device_get_uuid(&uuid, device) != CUDA_SUCCESS) {
        atomic_store(&devices[device].state, DEVICE_FAILED);
        pump_log_once("cannot read device %d's UUID: pumpd counts this job against GPU 0", (int)device);
        return;
    }
    memcpy(devices[device].uuid, uuid.bytes, sizeof devices[device].uuid);
    atomic_store(&devices[device].state, DEVICE_KNOWN);
    struct pump_channel *c = atomic_load(&pump_channel_live);
    if (c != NULL)
        announce_device(c, device, false);
}

/* ---- pump's own budget on each device (BUDGET) ----
 * Stored, then emitted when a channel is live; the channel's install and resume
 * emit every one stored. The two may both emit a value: a repeat says nothing new. */
static uint64_t own_budgets[PUMP_DEVICES_MAX];  /* atomic; 0: none read */

static void announce_budget(struct pump_channel *c, int device)
{
    uint64_t bytes = __atomic_load_n(&own_budgets[device], __ATOMIC_SEQ_CST);
    if (bytes == 0)
        return;
    struct pump_event e = event(PUMP_EVENT_BUDGET, 1, device);
    e.arg[0] = bytes;
    pump_channel_emit(c, &e, 1);
}

PUMP_HIDDEN void pump_channel_own_budget(int device, uint64_t bytes)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX || bytes == 0 ||
        __atomic_exchange_n(&own_budgets[device], bytes, __ATOMIC_SEQ_CST) == bytes)
        return;
    struct pump_channel *c = atomic_load(&pump_channel_live);
    if (c != NULL)
        announce_budget(c, device);
}

PUMP_HIDDEN void pump_channel_link(int device, uint64_t bytes, uint64_t ns)
{
    struct pump_channel *c = atomic_load(&pump_channel_live);
    if (c == NULL || device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct pump_event e = event(PUMP_EVENT_LINK, 2, device);
    e.arg[0] = bytes;
    e.arg[1] = ns;
    pump_channel_emit(c, &e, 1);
}

/* Every device known (each once, unless again: then all, for a daemon that
 * restarted and lost what its predecessor read), and pump's own budget on each. */
PUMP_HIDDEN void pump_channel_announce_devices(struct pump_channel *c, bool again)
{
    for (int d = 0; d < PUMP_DEVICES_MAX; d++) {
        announce_device(c, d, again);
        announce_budget(c, d);
    }
}

/* The shim's own accounting for pumpd: what `pump status` shows of the job. */
PUMP_HIDDEN void pump_channel_send_counters(void)
{
    struct pump_channel *c = pump_channel_get();
    if (c == NULL)
        return;
    const struct pump_stats *s = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    struct pump_event e = event(PUMP_EVENT_COUNTERS, 5, -1);
    e.arg[0] = __atomic_load_n(&s->launches, __ATOMIC_RELAXED);
    e.arg[1] = __atomic_load_n(&s->launches_managed, __ATOMIC_RELAXED);
    e.arg[2] = __atomic_load_n(&s->prefetch_bytes, __ATOMIC_RELAXED);
    e.arg[3] = __atomic_load_n(&s->resident_bytes, __ATOMIC_RELAXED);
    e.arg[4] = __atomic_load_n(&s->bytes_evicted, __ATOMIC_RELAXED);
    pump_channel_emit(c, &e, 1);
}

/* ---- the plan: the reader ---- */

PUMP_HIDDEN void pump_channel_kernel(int device, uint64_t key, uint64_t ns)
{
    struct pump_channel *c = atomic_load(&pump_channel_live);
    if (c == NULL || device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct pump_event e = event(PUMP_EVENT_KERNEL, 2, device);
    e.arg[0] = key;
    e.arg[1] = ns;
    pump_channel_emit(c, &e, 1);
}

/* The launch key of pump_channel.h: the function, then each allocation base (a named tensor's name). */
PUMP_HIDDEN uint64_t pump_channel_launch_key(CUfunction f, const struct pump_scan *scan)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = (uint64_t)(uintptr_t)f * k;
    uint32_t n = scan->own < PUMP_KEY_BASES ? scan->own : PUMP_KEY_BASES;  /* within launch_bases */
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ pump_range_name(scan->range[i])) * k;
    h ^= h >> 32;
    return h != 0 ? h : 1;
}

PUMP_HIDDEN bool pump_channel_plan_trigger(struct pump_channel *c, uint64_t key, struct pump_trigger *out)
{
    const struct pump_plan *p = c->plan;
    if (p == NULL || __atomic_load_n(&p->trigger_count, __ATOMIC_RELAXED) == 0)
        return false;
    uint64_t generation = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
    if (generation & 1)
        return false;  /* the daemon is writing it */
    uint32_t slot = (uint32_t)(key >> (64 - PUMP_PLAN_SLOT_BITS));
    uint32_t first = 0, need = 0, prefetch = 0, evict = 0;
    bool hit = false;
    for (uint32_t probe = 0; probe < PUMP_PLAN_PROBES && !hit; probe++) {
        const struct pump_plan_trigger *t = &p->trigger[(slot + probe) & (PUMP_PLAN_SLOTS - 1)];
        if (__atomic_load_n(&t->key, __ATOMIC_ACQUIRE) == key) {
            first = __atomic_load_n(&t->first, __ATOMIC_ACQUIRE);
            need = __atomic_load_n(&t->need, __ATOMIC_ACQUIRE);
            prefetch = __atomic_load_n(&t->prefetch, __ATOMIC_ACQUIRE);
            evict = __atomic_load_n(&t->evict, __ATOMIC_ACQUIRE);
            hit = true;
        }
    }
    uint32_t all = need + prefetch + evict;
    if (!hit || first >= PUMP_PLAN_RANGES || all > PUMP_PLAN_RANGES - first || all == 0)
        return false;
    /* At most PUMP_TRIGGER_RANGES_MAX ranges are carried out: up to half of
     * them needs, then of the room left up to half evictions when both other
     * kinds are many; the rest count as skipped. */
    uint32_t take_need = need < PUMP_TRIGGER_RANGES_MAX / 2 ? need : PUMP_TRIGGER_RANGES_MAX / 2;
    uint32_t room = PUMP_TRIGGER_RANGES_MAX - take_need;
    uint32_t half = evict < room / 2 ? evict : room / 2;
    uint32_t take_prefetch = prefetch < room - half ? prefetch : room - half;
    uint32_t take_evict = evict < room - take_prefetch ? evict : room - take_prefetch;
    /* Acquire loads: the generation's second read cannot move before them. */
    const uint32_t from[3] = {first, first + need, first + need + prefetch};
    const uint32_t take[3] = {take_need, take_prefetch, take_evict};
    uint32_t to = 0;
    for (int part = 0; part < 3; part++)
        for (uint32_t i = 0; i < take[part]; i++, to++) {
            out->range[to].address = __atomic_load_n(&p->range[from[part] + i].address, __ATOMIC_ACQUIRE);
            out->range[to].bytes = __atomic_load_n(&p->range[from[part] + i].bytes, __ATOMIC_ACQUIRE);
        }
    out->order = __atomic_load_n(&p->order, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != generation)
        return false;  /* rewritten meanwhile: this launch goes without */
    for (uint32_t i = 0; i < to; i++)
        pump_names_translate(&out->range[i]);  /* a tensor's name: the bytes of its holder now */
    out->need = take_need;
    out->need_cut = take_need < need;
    out->prefetch = take_prefetch;
    out->evict = take_evict;
    PUMP_COUNT(plan_triggers, 1);
    if (to < all)
        PUMP_COUNT(plan_ranges_skipped, all - to);
    return true;
}

PUMP_HIDDEN uint64_t pump_channel_plan_budget(void)
{
    struct pump_channel *c = pump_channel_get();
    if (c == NULL || c->plan == NULL)
        return 0;
    return __atomic_load_n(&c->plan->budget_bytes, __ATOMIC_RELAXED);
}

/* ---- attaching ---- */

static void announce_range(struct pump_range *range, void *arg)
{
    (void)arg;
    pump_channel_alloc(range, __atomic_load_n(&range->base, __ATOMIC_RELAXED),
                       __atomic_load_n(&range->size, __ATOMIC_RELAXED),
                       __atomic_load_n(&range->flags, __ATOMIC_RELAXED));
}

/* The layout cache's announcer: a FUNCTION event while a channel is live
 * (none in a forked child: the function is then offered to its channel). */
static bool announce_function(CUfunction f)
{
    struct pump_channel *c = atomic_load_explicit(&pump_channel_live, memory_order_seq_cst);
    if (c == NULL)
        return false;
    pump_channel_function(c, f);
    return true;
}

PUMP_HIDDEN bool pump_channel_install(struct pump_ring_header *ring, size_t ring_size, const struct pump_plan *plan)
{
    struct pump_ring_header h;
    if (ring_size < RING_HEADER_BYTES)
        return false;
    memcpy(&h, ring, sizeof h);  /* read once: later changes to it are ignored */
    uint32_t cap = h.capacity;
    if (h.magic != PUMP_RING_MAGIC || h.version != PUMP_PROTOCOL_VERSION ||
        h.record_size != sizeof(struct pump_event) || cap < PUMP_RING_RECORDS_MIN || cap > PUMP_RING_RECORDS_MAX ||
        (cap & (cap - 1)) != 0 || ring_size != RING_HEADER_BYTES + (uint64_t)cap * sizeof(struct pump_event)) {
        pump_log_once("pumpd's event ring is not valid: working without the daemon");
        return false;
    }
    if (plan != NULL) {
        uint32_t magic = __atomic_load_n(&plan->magic, __ATOMIC_RELAXED);
        uint32_t version = __atomic_load_n(&plan->version, __ATOMIC_RELAXED);
        if (magic != PUMP_PLAN_MAGIC || version != PUMP_PLAN_VERSION) {
            pump_log_once("pumpd's plan is not valid (magic 0x%08x, version %u; this shim reads version %d): "
                          "working without the daemon", magic, version, PUMP_PLAN_VERSION);
            return false;
        }
    }
    channel = (struct pump_channel){
        .ring = ring,
        .records = (struct pump_event *)(void *)((char *)ring + RING_HEADER_BYTES),
        .mask = cap - 1,
        .capacity = cap,
        .plan = plan,
    };
    /* Publish, then tell the daemon what came before it: the allocations
     * (under the range table's lock, so each gets exactly one ALLOC) and
     * the functions whose layouts were built (see layouts.c). */
    atomic_store_explicit(&pump_channel_live, &channel, memory_order_seq_cst);
    pump_ranges_each(announce_range, NULL);
    pump_layouts_announce(announce_function);
    pump_channel_announce_devices(&channel, false);
    return true;
}

PUMP_HIDDEN void pump_channel_at_exit(void)
{
    atomic_store(&exiting, true);
    pump_channel_send_counters();  /* the final figures (lock-free, like any event) */
}
