/* fuzz_plan.c: the ring and the plan as pumpd (or anyone who got hold of
 * them) might write them, against the shim's checks: a ring header of any
 * geometry, head and tail scribbled between launches, a plan whose triggers
 * point anywhere, with any counts, budget, order and generation, rewritten
 * while the job launches. Ring and plan live on the heap, so AddressSanitizer
 * sees any access past them; the job's buffers must end up holding exactly
 * what its kernels computed (fuzz_job.h).
 *
 * Input: ring flags and geometry, plan header, triggers, ranges, then
 * operations (launch, scribble the ring, rewrite the plan, read on the host)
 * until the input runs out. Zeros mean the valid choice (fuzz_input.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "fuzz_input.h"
#include "fuzz_job.h"

#define RING_HEADER_BYTES sizeof(struct pump_ring_header)
#define RING_BYTES_MAX (RING_HEADER_BYTES + 8192 * sizeof(struct pump_event))
#define OPERATIONS_MAX 48

static struct pump_plan *plan;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_job_start();
    plan = calloc(1, sizeof *plan);
    if (plan == NULL)
        abort();
    return 0;
}

static void pick_launch(struct fuzz_input *in, unsigned *x, unsigned *y)
{
    *x = fuzz_u8(in) % FUZZ_BUFFERS;
    *y = (*x + 1 + fuzz_u8(in) % (FUZZ_BUFFERS - 1)) % FUZZ_BUFFERS;
}

/* A ring of the input's geometry, on the heap at exactly the size claimed. */
static struct pump_ring_header *make_ring(struct fuzz_input *in, size_t *size)
{
    uint8_t flags = fuzz_u8(in);
    uint32_t capacity = 1024u << (fuzz_u8(in) % 4);
    if (flags & 1)
        capacity = fuzz_u32(in);
    *size = RING_HEADER_BYTES + (uint64_t)(capacity <= 8192 ? capacity : 1024) * sizeof(struct pump_event);
    if (flags & 2)
        *size = fuzz_u32(in) % (RING_BYTES_MAX + 1);
    struct pump_ring_header *ring = malloc(*size > 0 ? *size : 1);
    if (ring == NULL)
        abort();
    memset(ring, 0, *size);
    if (*size >= RING_HEADER_BYTES) {
        ring->magic = flags & 4 ? fuzz_u32(in) : PUMP_RING_MAGIC;
        ring->version = flags & 8 ? fuzz_u32(in) : PUMP_PROTOCOL_VERSION;
        ring->record_size = flags & 16 ? fuzz_u32(in) : sizeof(struct pump_event);
        ring->capacity = capacity;
        if (flags & 32) {
            ring->head = fuzz_u64(in);
            ring->tail = fuzz_u64(in);
        }
    }
    return ring;
}

/* An address near one of the job's buffers (or anywhere), a length of up to
 * a few blocks (or anything). */
static struct pump_plan_range make_range(struct fuzz_input *in)
{
    uint8_t how = fuzz_u8(in);
    struct pump_plan_range r;
    r.address = fuzz_job_base(how) + fuzz_u32(in) % (FUZZ_BUFFER_BYTES + (1u << 20));
    if (how & 4)
        r.address &= ~(uint64_t)4095;
    if ((how & 24) == 24)
        r.address = fuzz_u64(in);
    r.bytes = fuzz_u32(in) % (8u << 20);
    if (how & 32)
        r.bytes = (r.bytes + 4095) & ~(uint64_t)4095;
    if ((how & 192) == 192)
        r.bytes = fuzz_u64(in);
    return r;
}

static void set_trigger(struct fuzz_input *in)
{
    unsigned x, y;
    pick_launch(in, &x, &y);
    uint8_t how = fuzz_u8(in);
    uint64_t key = (how & 7) == 7 ? fuzz_u64(in) : fuzz_job_key(x, y);
    uint32_t slot = (uint32_t)(key >> (64 - PUMP_PLAN_SLOT_BITS)) + (how >> 3) % (PUMP_PLAN_PROBES + 2);
    struct pump_plan_trigger *t = &plan->trigger[slot & (PUMP_PLAN_SLOTS - 1)];
    t->key = key;
    t->first = how & 128 ? fuzz_u32(in) : fuzz_u8(in) % 64;
    uint8_t counts = fuzz_u8(in);
    t->need = counts & 1 ? fuzz_u16(in) : fuzz_u8(in) % 8;
    t->prefetch = counts & 2 ? fuzz_u16(in) : fuzz_u8(in) % 8;
    t->evict = counts & 4 ? fuzz_u16(in) : fuzz_u8(in) % 8;
}

static void make_plan(struct fuzz_input *in)
{
    memset(plan, 0, sizeof *plan);
    uint8_t flags = fuzz_u8(in);
    plan->magic = flags & 1 ? fuzz_u32(in) : PUMP_PLAN_MAGIC;
    plan->version = flags & 2 ? fuzz_u32(in) : PUMP_PLAN_VERSION;
    const uint64_t budgets[4] = {0, 2 * FUZZ_BUFFER_BYTES, 6u << 20, 0};
    plan->budget_bytes = budgets[(flags >> 2) & 3];
    if (((flags >> 2) & 3) == 3)
        plan->budget_bytes = fuzz_u64(in);
    plan->order = flags & 16 ? fuzz_u32(in) : (flags >> 5) & 1;
    plan->generation = flags & 64 ? fuzz_u64(in) : 2;
    unsigned triggers = fuzz_u8(in) % 9;
    for (unsigned i = 0; i < triggers; i++)
        set_trigger(in);
    plan->trigger_count = flags & 128 ? fuzz_u32(in) : triggers;
    unsigned ranges = fuzz_u8(in) % 33;
    for (unsigned i = 0; i < ranges; i++) {
        uint16_t at = fuzz_u16(in);
        plan->range[at & 0x8000 ? at : at % 64] = make_range(in);
    }
    plan->range_count = ranges;
}

static void operate(struct fuzz_input *in, struct pump_ring_header *ring)
{
    unsigned x, y;
    switch (fuzz_u8(in) % 6) {
    case 0:
        pick_launch(in, &x, &y);
        fuzz_job_launch(x, y);
        break;
    case 1: {
        /* Another writer of the shared ring header. */
        uint64_t *fields[4] = {&ring->head, &ring->tail, &ring->written, &ring->dropped};
        __atomic_store_n(fields[fuzz_u8(in) % 4], fuzz_u64(in), __ATOMIC_RELAXED);
        break;
    }
    case 2:
        __atomic_store_n(&plan->generation, fuzz_u64(in), __ATOMIC_RELEASE);
        break;
    case 3:
        set_trigger(in);
        break;
    case 4:
        plan->range[fuzz_u16(in)] = make_range(in);
        break;
    case 5:
        fuzz_job_host_read(fuzz_u8(in));
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in = {data, size};
    size_t ring_size;
    struct pump_ring_header *ring = make_ring(&in, &ring_size);
    make_plan(&in);
    bool with_plan = (fuzz_u8(&in) & 1) == 0;
    if (pump_channel_install(ring, ring_size, with_plan ? plan : NULL)) {
        for (int i = 0; i < OPERATIONS_MAX && in.left > 0; i++)
            operate(&in, ring);
        fuzz_job_launch(0, 1);  /* at least one launch sees the final state */
    }
    fuzz_job_check();
    /* What a forked child does: the channel is dropped (nothing of it was
     * mapped by the shim here, so nothing is unmapped). */
    pump_channel_after_fork_in_child();
    free(ring);
    return 0;
}
