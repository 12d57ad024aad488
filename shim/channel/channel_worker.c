/* channel_worker.c: the thread that attaches the process to pumpd (see
 * channel.h; channel.c writes the ring and reads the plan it installs).
 *
 * One detached worker thread per process, started when CUDA is first used,
 * with every signal blocked: it connects to pumpd's socket, attaches (the
 * daemon answers with a ring and a plan, two sealed memfds), validates and
 * maps them, and installs them; then it waits on the socket. When the daemon
 * goes away, the ring and the plan stay mapped and in use (events keep going
 * into the ring, counted as dropped once it is full) while the worker
 * reconnects every second and hands the same two memfds back ("resume").
 * The launching threads never wait on any of this. Every reply is untrusted:
 * its descriptors must be sealed memfds of sane size, checked here, and
 * their contents are checked by pump_channel_install.
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

/* The worker's resources, also seen by the fork handler. */
static void *_Atomic ring_map;
static _Atomic size_t ring_map_size;
static void *_Atomic plan_map;
static _Atomic int ring_fd = -1, plan_fd = -1, socket_fd = -1;
static atomic_bool started;
/* What ring_fd and plan_fd were at attach (the worker's own). */
static dev_t ring_dev, plan_dev;
static ino_t ring_ino, plan_ino;
#define RETRY_MAX_S 10
#define IO_TIMEOUT_S 2
#define COUNTERS_INTERVAL_MS 500 /* how often the worker sends the shim's counters */


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
        rs.st_size < (off_t)sizeof(struct pump_ring_header) ||
        rs.st_size > (off_t)(sizeof(struct pump_ring_header) + (uint64_t)PUMP_RING_RECORDS_MAX * sizeof(struct pump_event)) ||
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
    /* The plan's pages made here, by reading each once, so that they count against the job's
     * memory cgroup: a memfd's page is charged to whoever touches it first, and pumpd writes
     * triggers only into pages that exist (pump/channel.py, Plan.pages_made), else its writes
     * would make 1.4 MiB a lookahead process in pumpd's. */
    for (size_t offset = 0; offset < sizeof(struct pump_plan); offset += 4096)
        (void)((volatile const unsigned char *)p)[offset];
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
        pump_channel_send_counters();
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
            pump_channel_announce_devices(live, true);
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
