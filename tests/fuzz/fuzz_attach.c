/* fuzz_attach.c: pumpd's answer to attach, as a broken or hostile daemon (or
 * anyone who can stand in for it) might send it, against the shim's reader:
 * a message header with any magic, version, type and length, any payload,
 * zero to three descriptors of any kind (a ring or plan memfd of any size,
 * seals and header; a pipe; /dev/null; a directory). The shim must refuse
 * what is wrong, keep no descriptor it refused (the target counts the
 * process's descriptors before and after) and, when it accepts, work: the
 * job launches on the new channel and its buffers hold what its kernels
 * computed (fuzz_job.h).
 *
 * Input: header flags and fields, payload, descriptors, then launches.
 * Zeros mean the valid choice (fuzz_input.h). */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "channel.h"
#include "fuzz_input.h"
#include "fuzz_job.h"

#define PAYLOAD_MAX 255
#define DESCRIPTORS_MAX 3
#define LAUNCHES_MAX 8

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_job_start();
    return 0;
}

static int sealable_memfd(const char *name, uint64_t size)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
        abort();
    return fd;
}

/* Seals as pumpd sets them (no shrinking, no growing), or the input's. */
static void seal(struct fuzz_input *in, int fd)
{
    uint8_t how = fuzz_u8(in);
    int seals = F_SEAL_SHRINK | F_SEAL_GROW;
    if (how & 1)
        seals = (how >> 1) & (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE);
    if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)
        abort();
}

static int ring_memfd(struct fuzz_input *in)
{
    uint8_t flags = fuzz_u8(in);
    uint32_t capacity = 1024u << (fuzz_u8(in) % 4);
    if (flags & 1)
        capacity = fuzz_u32(in);
    /* Sparse: a size the shim maps but nobody fills. */
    uint64_t size = sizeof(struct pump_ring_header) + (uint64_t)capacity * sizeof(struct pump_event);
    if (flags & 2)
        size = fuzz_u32(in) % (1u << 29);
    int fd = sealable_memfd("fuzz-ring", size);
    struct pump_ring_header h = {
        .magic = flags & 4 ? fuzz_u32(in) : PUMP_RING_MAGIC,
        .version = flags & 8 ? fuzz_u32(in) : PUMP_PROTOCOL_VERSION,
        .record_size = flags & 16 ? fuzz_u32(in) : sizeof(struct pump_event),
        .capacity = capacity,
        .head = flags & 32 ? fuzz_u64(in) : 0,
        .tail = flags & 32 ? fuzz_u64(in) : 0,
    };
    if (pwrite(fd, &h, sizeof h < size ? sizeof h : size, 0) < 0)
        abort();
    seal(in, fd);
    return fd;
}

static int plan_memfd(struct fuzz_input *in)
{
    uint8_t flags = fuzz_u8(in);
    uint64_t size = sizeof(struct pump_plan);
    if (flags & 1)
        size += (uint64_t)(int16_t)fuzz_u16(in);
    int fd = sealable_memfd("fuzz-plan", size);
    uint32_t header[2] = {flags & 2 ? fuzz_u32(in) : PUMP_PLAN_MAGIC, flags & 4 ? fuzz_u32(in) : PUMP_PLAN_VERSION};
    if (pwrite(fd, header, sizeof header, 0) < 0)
        abort();
    seal(in, fd);
    return fd;
}

/* Descriptor i of the reply: a ring first and a plan second unless the
 * input says otherwise. */
static int descriptor(struct fuzz_input *in, unsigned i)
{
    int pipe_ends[2];
    switch ((fuzz_u8(in) + i) % 6) {
    case 0:
        return ring_memfd(in);
    case 1:
        return plan_memfd(in);
    case 2:
        if (pipe2(pipe_ends, O_CLOEXEC) != 0)
            abort();
        close(pipe_ends[1]);
        return pipe_ends[0];
    case 3:
        return open("/dev/null", O_RDWR | O_CLOEXEC);
    case 4:
        return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    default:
        return memfd_create("fuzz-unsealable", MFD_CLOEXEC);
    }
}

/* Writes the whole reply and closes the daemon's end for writing, so that a
 * header promising more than follows ends in EOF, not a wait. */
static void send_reply(struct fuzz_input *in, int daemon)
{
    uint8_t flags = fuzz_u8(in);
    struct {
        struct pump_msg_header h;
        char payload[PAYLOAD_MAX];
    } message;
    size_t n = fuzz_u8(in);
    for (size_t i = 0; i < n; i++)
        message.payload[i] = (char)fuzz_u8(in);
    message.h = (struct pump_msg_header){
        .magic = flags & 1 ? fuzz_u32(in) : PUMP_MSG_MAGIC,
        .version = flags & 2 ? fuzz_u16(in) : PUMP_PROTOCOL_VERSION,
        .type = flags & 4 ? fuzz_u16(in) : (flags & 8 ? PUMP_MSG_ERROR : PUMP_MSG_REPLY),
        .length = flags & 16 ? fuzz_u32(in) : (uint32_t)n,
    };
    int fds[DESCRIPTORS_MAX];
    unsigned nfds = (fuzz_u8(in) + 2) % (DESCRIPTORS_MAX + 1);
    for (unsigned i = 0; i < nfds; i++)
        if ((fds[i] = descriptor(in, i)) < 0)
            abort();
    struct iovec iov = {&message, sizeof message.h + n};
    union {
        char buffer[CMSG_SPACE(DESCRIPTORS_MAX * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        m.msg_control = control.buffer;
        m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    if (sendmsg(daemon, &m, MSG_NOSIGNAL) != (ssize_t)iov.iov_len)
        abort();
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    shutdown(daemon, SHUT_WR);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in = {data, size};
    int before = fuzz_open_descriptors();
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
        abort();
    send_reply(&in, ends[1]);
    if (pump_channel_attach(ends[0])) {
        for (int i = 0; i < LAUNCHES_MAX && in.left > 0; i++) {
            unsigned x = fuzz_u8(&in) % FUZZ_BUFFERS;
            fuzz_job_launch(x, x + 1);
        }
        fuzz_job_launch(0, 1);
    }
    fuzz_job_check();
    /* What a forked child does: unmap the channel, close its descriptors. */
    pump_channel_after_fork_in_child();
    close(ends[0]);
    close(ends[1]);
    if (fuzz_open_descriptors() != before) {
        fprintf(stderr, "fuzz attach: %d descriptors open before, %d after\n", before, fuzz_open_descriptors());
        abort();
    }
    return 0;
}
