/* channel.c: the shim's side of the channels to pumpd (see channel.h and
 * pump_channel.h).
 *
 * One detached worker thread per process, started when CUDA is first used,
 * with every signal blocked: it connects to pumpd's socket, attaches (the
 * daemon answers with a ring and a plan, two sealed memfds), validates and
 * maps them, and publishes them; then it waits on the socket. When the daemon
 * goes away, the ring and the plan stay mapped and in use (events keep going
 * into the ring, counted as dropped once it is full) while the worker
 * reconnects every second and hands the same two memfds back ("resume").
 * The launching threads never wait on any of this.
 *
 * Everything the daemon wrote is untrusted: the ring's geometry is checked
 * once and kept here, positions read back from the ring only ever index it
 * modulo its capacity, and plan contents are bounds-checked on every read.
 * The memfds must be sealed against shrinking, so no one holding them can
 * make the process fault on its own mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "layouts.h"

_Static_assert(sizeof(struct pump_event) == 64, "a ring record is 64 bytes");
_Static_assert(sizeof(struct pump_ring_header) == 256, "the ring header is 256 bytes");
_Static_assert(sizeof(struct pump_msg_header) == 16, "the message header is 16 bytes");
_Static_assert(offsetof(struct pump_ring_header, head) == 64 && offsetof(struct pump_ring_header, tail) == 128 &&
                   offsetof(struct pump_ring_header, written) == 192,
               "head, tail and the counters sit on cache lines of their own");
_Static_assert(offsetof(struct pump_plan, trigger) == 64, "the plan's triggers follow a 64-byte header");

#define RING_HEADER_BYTES ((uint64_t)sizeof(struct pump_ring_header))
#define RETRY_MAX_S 10
#define IO_TIMEOUT_S 2
#define COUNTERS_INTERVAL_MS 500 /* how often the worker sends the shim's counters */
/* A record reservation gives up after this many lost races (a head that
 * someone else keeps moving must not stall a launch). */
#define RESERVE_ATTEMPTS 64

static struct pump_channel channel;
PUMP_HIDDEN struct pump_channel *_Atomic pump_channel_live;

/* The worker's resources, also seen by the fork handler. */
static void *_Atomic ring_map;
static _Atomic size_t ring_map_size;
static void *_Atomic plan_map;
static _Atomic int ring_fd = -1, plan_fd = -1, socket_fd = -1;
static atomic_bool started, exiting;
/* What ring_fd and plan_fd were at attach (the worker's own). */
static dev_t ring_dev, plan_dev;
static ino_t ring_ino, plan_ino;

/* ---- the event ring: the writer (hot path) ---- */

static inline void put64(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
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
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t time_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
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
    e.arg[0] = base;
    e.arg[1] = size;
    e.arg[2] = flags;
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

/* The bases a LAUNCH carries (pump/channel.py's LAUNCH_BASES_MAX): a wider launch's first ones. */
#define LAUNCH_BASES_MAX 64

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
        records[n - 1].arg[slot++] = __atomic_load_n(&scan->range[i]->base, __ATOMIC_RELAXED);
        if (n > 1)
            records[n - 1].count++;
    }
    pump_channel_emit(c, records, n);
}

static const char *function_name(CUfunction f)
{
    const char *name = NULL;
    if (atomic_load_explicit(&exiting, memory_order_relaxed))
        return "";
    /* A CUkernel may arrive where a CUfunction is expected: ask both. */
    if (pump_driver.func_get_name != NULL && pump_driver.func_get_name(&name, f) == CUDA_SUCCESS && name != NULL)
        return name;
    name = NULL;
    if (pump_driver.kernel_get_name != NULL &&
        pump_driver.kernel_get_name(&name, (CUkernel)(void *)f) == CUDA_SUCCESS && name != NULL)
        return name;
    return "";
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

PUMP_HIDDEN void pump_channel_sync(uint32_t epoch)
{
    struct pump_channel *c = pump_channel_get();
    if (c == NULL)
        return;
    struct pump_event e = event(PUMP_EVENT_SYNC, 1, -1);
    e.arg[0] = epoch;
    pump_channel_emit(c, &e, 1);
}

/* ---- devices: which GPUs the process works on (DEVICE) ----
 * Each device's UUID is read once and announced once per daemon: at first
 * use if a channel is live, else by pump_channel_install. The two race
 * without a lock: the user stores KNOWN then loads the channel, the worker
 * stores the channel then loads KNOWN (all sequentially consistent), so at
 * least one of them sees the other, and `announced` lets only one emit. */
#define DEVICES_MAX 64 /* ordinals 0..63 are announced (pump/channel.py: DEVICES_MAX) */
enum { DEVICE_UNKNOWN, DEVICE_READING, DEVICE_KNOWN, DEVICE_FAILED };
static struct {
    _Atomic uint32_t state;
    atomic_bool announced;
    uint64_t uuid[2];          /* written before state becomes DEVICE_KNOWN */
} devices[DEVICES_MAX];

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
    if (device < 0 || device >= DEVICES_MAX) {
        pump_log_once("device %d is past the %d devices pump names to pumpd: its jobs count against GPU 0",
                      (int)device, DEVICES_MAX);
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

/* Every device known (each once, unless again: then all, for a daemon that
 * restarted and lost what its predecessor read). */
static void announce_devices(struct pump_channel *c, bool again)
{
    for (int d = 0; d < DEVICES_MAX; d++)
        announce_device(c, d, again);
}

/* The shim's own accounting for pumpd: what `pump status` shows of the job. */
static void send_counters(void)
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

/* The launch key of pump_channel.h: the function, then each allocation base. */
static uint64_t launch_key(CUfunction f, const struct pump_scan *scan)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = (uint64_t)(uintptr_t)f * k;
    for (uint32_t i = 0; i < launch_bases(scan); i++)
        h = (h ^ __atomic_load_n(&scan->range[i]->base, __ATOMIC_RELAXED)) * k;
    h ^= h >> 32;
    return h != 0 ? h : 1;
}

PUMP_HIDDEN bool pump_channel_plan_trigger(struct pump_channel *c, CUfunction f, const struct pump_scan *scan,
                                           struct pump_trigger *out)
{
    const struct pump_plan *p = c->plan;
    if (p == NULL || __atomic_load_n(&p->trigger_count, __ATOMIC_RELAXED) == 0)
        return false;
    uint64_t generation = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
    if (generation & 1)
        return false;  /* the daemon is writing it */
    uint64_t key = launch_key(f, scan);
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
    out->need = take_need;
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
    announce_devices(&channel, false);
    return true;
}

/* ---- the worker ---- */

static void sleep_seconds(unsigned seconds)
{
    struct timespec t = {(time_t)seconds, 0};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static void close_fd(_Atomic int *fd)
{
    /* Forget it first: a fork in between must not close a reused number. */
    int old = atomic_exchange(fd, -1);
    if (old >= 0)
        close(old);
}

/* Before anything is sent, the daemon must be this user's or root's (SO_PEERCRED):
 * another user's socket in its place never gets the job's name, ring or plan. */
static bool peer_trusted(int fd, const char *path)
{
    struct ucred peer;
    socklen_t length = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || length != sizeof peer) {
        pump_log_once("cannot read the credentials of the daemon at %s: not attaching", path);
        return false;
    }
    if (peer.uid == 0 || peer.uid == geteuid())
        return true;
    pump_log_once("the daemon at %s runs as uid %u, neither this user's (%u) nor root: not attaching",
                  path, (unsigned)peer.uid, (unsigned)geteuid());
    return false;
}

static int connect_to(const char *path)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t length = strlen(path);
    if (length == 0 || length >= sizeof address.sun_path)
        return -1;
    memcpy(address.sun_path, path, length + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    atomic_store(&socket_fd, fd);
    /* A daemon that hangs never blocks the worker for long (connect too
     * waits at most the send timeout on a full backlog). */
    struct timeval timeout = {IO_TIMEOUT_S, 0};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) != 0 ||
        connect(fd, (struct sockaddr *)&address, sizeof address) != 0 || !peer_trusted(fd, path)) {
        close_fd(&socket_fd);
        return -1;
    }
    return fd;
}

static int connect_daemon(const char **which)
{
    for (int i = 0; i < 2; i++) {
        const char *path = pump_config.socket_paths[i];
        if (path == NULL)
            continue;
        int fd = connect_to(path);
        if (fd >= 0) {
            *which = path;
            return fd;
        }
    }
    return -1;
}

static bool send_request(int fd, const char *json, const int *fds, int nfds)
{
    char message[sizeof(struct pump_msg_header) + 1024];
    size_t length = strlen(json);
    if (length > sizeof message - sizeof(struct pump_msg_header))
        return false;
    struct pump_msg_header h = {.magic = PUMP_MSG_MAGIC, .version = PUMP_PROTOCOL_VERSION,
                                .type = PUMP_MSG_REQUEST, .length = (uint32_t)length};
    memcpy(message, &h, sizeof h);
    memcpy(message + sizeof h, json, length);
    size_t left = sizeof h + length, sent = 0;
    while (left > 0) {
        struct iovec iov = {message + sent, left};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            char buffer[CMSG_SPACE(2 * sizeof(int))];
            struct cmsghdr align;
        } control;
        if (sent == 0 && nfds > 0) {  /* the descriptors ride on the first byte */
            memset(&control, 0, sizeof control);
            m.msg_control = control.buffer;
            m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
            memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
        }
        ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        sent += (size_t)r;
        left -= (size_t)r;
    }
    return true;
}

/* Reads exactly n bytes; descriptors that come along are kept in fds (two at
 * most; any others are closed). */
static bool receive(int fd, void *buffer, size_t n, int fds[2], int *nfds)
{
    char *p = buffer;
    while (n > 0) {
        struct iovec iov = {p, n};
        union {
            char buffer[CMSG_SPACE(8 * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buffer,
                           .msg_controllen = sizeof control.buffer};
        ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return false;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int received;
                memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
                if (*nfds < 2)
                    fds[(*nfds)++] = received;
                else
                    close(received);
            }
        }
        if (r == 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static void close_all(int fds[2], int *nfds)
{
    for (int i = 0; i < *nfds; i++)
        close(fds[i]);
    *nfds = 0;
}

/* The worker's only payload buffer (one worker per process). */
static char payload[PUMP_MSG_PAYLOAD_MAX + 1];

/* One message from the daemon: its type (PUMP_MSG_REPLY or PUMP_MSG_ERROR),
 * or -1 when the connection failed or broke the framing. The payload is
 * drained into `payload`, NUL-terminated, never parsed. */
static int receive_message(int fd, int fds[2], int *nfds)
{
    struct pump_msg_header h;
    if (!receive(fd, &h, sizeof h, fds, nfds))
        return -1;
    if (h.magic != PUMP_MSG_MAGIC || h.version != PUMP_PROTOCOL_VERSION || h.length > PUMP_MSG_PAYLOAD_MAX ||
        (h.type != PUMP_MSG_REPLY && h.type != PUMP_MSG_ERROR)) {
        pump_log_once("pumpd's answer breaks the protocol (magic 0x%08x, version %u, type %u, length %u)",
                      h.magic, h.version, h.type, h.length);
        return -1;
    }
    if (h.length > 0 && !receive(fd, payload, h.length, fds, nfds))
        return -1;
    payload[h.length] = '\0';
    return h.type;
}

static void report_error(const char *op)
{
    /* Bounded and printable: the text is the daemon's. */
    char text[201];
    size_t n = 0;
    for (const char *p = payload; *p != '\0' && n < sizeof text - 1; p++)
        text[n++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    text[n] = '\0';
    pump_log_once("pumpd refused %s: %s", op, text);
}

/* JSON string body: PUMP_JOB and PUMP_NAME are validated, escaped anyway. */
static void json_escape(char *out, size_t size, const char *in)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p != '\0' && n + 7 < size; p++) {
        if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p;
        } else if (*p < 0x20) {
            n += (size_t)snprintf(out + n, size - n, "\\u%04x", *p);
        } else {
            out[n++] = (char)*p;
        }
    }
    out[n] = '\0';
}

/* The request's "rank" member (with its leading comma), or "" without a rank. */
static void rank_field(char *out, size_t size)
{
    out[0] = '\0';
    if (pump_config.rank >= 0)
        snprintf(out, size, ",\"rank\":%d", (int)pump_config.rank);
}

static bool map_channel(int ring, int plan)
{
    struct stat rs, ps;
    if (fstat(ring, &rs) != 0 || fstat(plan, &ps) != 0 || !S_ISREG(rs.st_mode) || !S_ISREG(ps.st_mode) ||
        rs.st_size < (off_t)RING_HEADER_BYTES ||
        rs.st_size > (off_t)(RING_HEADER_BYTES + (uint64_t)PUMP_RING_RECORDS_MAX * sizeof(struct pump_event)) ||
        ps.st_size != (off_t)sizeof(struct pump_plan)) {
        pump_log_once("pumpd's ring or plan has the wrong size: working without the daemon");
        return false;
    }
    int ring_seals = fcntl(ring, F_GET_SEALS), plan_seals = fcntl(plan, F_GET_SEALS);
    if (ring_seals < 0 || plan_seals < 0 || !(ring_seals & F_SEAL_SHRINK) || !(plan_seals & F_SEAL_SHRINK)) {
        pump_log_once("pumpd's ring or plan is not sealed against shrinking: working without the daemon");
        return false;
    }
    size_t ring_size = (size_t)rs.st_size;
    void *r = mmap(NULL, ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
    if (r == MAP_FAILED)
        return false;
    void *p = mmap(NULL, sizeof(struct pump_plan), PROT_READ, MAP_SHARED, plan, 0);
    if (p == MAP_FAILED) {
        munmap(r, ring_size);
        return false;
    }
    atomic_store(&ring_map_size, ring_size);
    atomic_store(&ring_map, r);
    atomic_store(&plan_map, p);
    if (!pump_channel_install(r, ring_size, p)) {
        atomic_store(&ring_map, NULL);
        atomic_store(&plan_map, NULL);
        munmap(r, ring_size);
        munmap(p, sizeof(struct pump_plan));
        return false;
    }
    ring_dev = rs.st_dev;
    ring_ino = rs.st_ino;
    plan_dev = ps.st_dev;
    plan_ino = ps.st_ino;
    atomic_store(&ring_fd, ring);
    atomic_store(&plan_fd, plan);
    return true;
}

/* False when the program closed (and maybe reused) the ring's or the plan's
 * descriptor: they must not be handed to the daemon then. */
static bool still_ours(void)
{
    struct stat rs, ps;
    return fstat(atomic_load(&ring_fd), &rs) == 0 && fstat(atomic_load(&plan_fd), &ps) == 0 &&
           rs.st_dev == ring_dev && rs.st_ino == ring_ino && ps.st_dev == plan_dev && ps.st_ino == plan_ino;
}

PUMP_HIDDEN bool pump_channel_attach(int fd)
{
    char job[sizeof pump_config.job * 6], name[sizeof pump_config.name * 6], json[1024];
    json_escape(job, sizeof job, pump_config.job);
    json_escape(name, sizeof name, pump_config.name);
    char rank[24];
    rank_field(rank, sizeof rank);
    snprintf(json, sizeof json,
             "{\"op\":\"attach\",\"pid\":%d,\"job\":\"%s\",\"name\":\"%s\",\"policy\":\"%s\"%s}",
             (int)getpid(), job, name, pump_config.policy == PUMP_POLICY_LAUNCH ? "launch" : "off", rank);
    if (!send_request(fd, json, NULL, 0))
        return false;
    int fds[2], nfds = 0;
    int type = receive_message(fd, fds, &nfds);
    if (type == PUMP_MSG_ERROR)
        report_error("attach");
    else if (type == PUMP_MSG_REPLY && nfds != 2)
        pump_log_once("pumpd's attach reply carried %d descriptors, not 2: working without the daemon", nfds);
    if (type == PUMP_MSG_REPLY && nfds == 2 && map_channel(fds[0], fds[1]))
        return true;
    close_all(fds, &nfds);
    return false;
}

static bool resume(int fd)
{
    char json[96], rank[24];
    rank_field(rank, sizeof rank);
    snprintf(json, sizeof json, "{\"op\":\"resume\",\"pid\":%d%s}", (int)getpid(), rank);
    int ours[2] = {atomic_load(&ring_fd), atomic_load(&plan_fd)};
    if (!send_request(fd, json, ours, 2))
        return false;
    int fds[2], nfds = 0;
    int type = receive_message(fd, fds, &nfds);
    close_all(fds, &nfds);  /* a resume needs none back */
    if (type == PUMP_MSG_ERROR)
        report_error("resume");
    return type == PUMP_MSG_REPLY;
}

/* Returns when the daemon is gone (EOF or an error); anything it sends
 * meanwhile is read and ignored. Twice a second, the counters go out. */
static void wait_until_lost(int fd)
{
    char sink[256];
    for (;;) {
        send_counters();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ready = poll(&p, 1, COUNTERS_INTERVAL_MS);
        if (ready == 0 || (ready < 0 && errno == EINTR))
            continue;
        ssize_t r = recv(fd, sink, sizeof sink, 0);
        if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
            continue;
        return;
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    unsigned backoff = 1;
    bool attached = false;
    for (;;) {
        const char *path = NULL;
        int fd = connect_daemon(&path);
        if (fd < 0) {
            if (!attached) {
                /* Fail-open: no daemon, the shim works alone; said once, and
                 * only at debug level unless PUMP_SOCKET asked for one. */
                static bool told;
                if (!told)
                    pump_log(pump_config.socket_set ? 1 : 2, "no pump daemon at %s%s%s: working alone",
                             pump_config.socket_paths[0], pump_config.socket_paths[1] ? " or " : "",
                             pump_config.socket_paths[1] ? pump_config.socket_paths[1] : "");
                told = true;
                sleep_seconds(backoff);
                backoff = backoff * 2 > RETRY_MAX_S ? RETRY_MAX_S : backoff * 2;
            } else {
                sleep_seconds(1);
            }
            continue;
        }
        if (attached && !still_ours()) {
            pump_log_once("the daemon channel's descriptors were closed: not resuming (the ring stays in use)");
            close_fd(&socket_fd);
            return NULL;
        }
        bool ok = attached ? resume(fd) : pump_channel_attach(fd);
        if (!ok) {
            close_fd(&socket_fd);
            sleep_seconds(backoff);
            backoff = backoff * 2 > RETRY_MAX_S ? RETRY_MAX_S : backoff * 2;
            continue;
        }
        pump_log(2, "%s pumpd at %s", attached ? "resumed with" : "attached to", path);
        struct pump_channel *live = pump_channel_get();
        if (attached && live != NULL)
            announce_devices(live, true);
        attached = true;
        backoff = 1;
        wait_until_lost(fd);
        close_fd(&socket_fd);
        pump_log_once("daemon connection lost; reconnecting");
        sleep_seconds(1);
    }
    return NULL;
}

PUMP_HIDDEN void pump_channel_start(void)
{
    if (pump_config.daemon_off || pump_config.socket_paths[0] == NULL || atomic_exchange(&started, true))
        return;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        pump_log_once("cannot start the daemon channel: working alone");
        return;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    /* The worker takes none of the program's signals. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    int r = pthread_create(&thread, &attr, worker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r != 0)
        pump_log_once("cannot start the daemon channel (error %d): working alone", r);
    else
        pthread_setname_np(thread, "pump-channel");
}

PUMP_HIDDEN void pump_channel_at_exit(void)
{
    atomic_store(&exiting, true);
    send_counters();  /* the final figures (lock-free, like any event) */
}

/* The child has no worker: it drops the parent's ring, plan and socket.
 * (A child that later uses CUDA itself starts its own channel.) */
PUMP_HIDDEN void pump_channel_after_fork_in_child(void)
{
    atomic_store(&pump_channel_live, NULL);
    void *r = atomic_exchange(&ring_map, NULL);
    if (r != NULL)
        munmap(r, atomic_load(&ring_map_size));
    void *p = atomic_exchange(&plan_map, NULL);
    if (p != NULL)
        munmap(p, sizeof(struct pump_plan));
    close_fd(&ring_fd);
    close_fd(&plan_fd);
    close_fd(&socket_fd);
    atomic_store(&started, false);
}
