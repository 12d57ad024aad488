/* budget.c: the budget in force on each device (see budget.h).
 *
 * pump's default. cuMemGetInfo's free memory counts what everyone else holds (plain
 * allocations, a neighbour process, the driver's own: the foreign memory) and also the managed
 * pages of this process on the device: pump's resident blocks, and pages that reached it
 * without pump (a kernel's faults, a copy into managed memory, a block pump evicted whose chunk
 * the driver keeps). Those last are the driver's to evict when pump brings in more, so the
 * room pump's belief may take is the device less the foreign memory. A reading cannot tell
 * foreign memory from managed pages pump does not believe resident, so the foreign memory is
 * a ledger (FOREIGN below), the room is total - foreign, less a margin:
 * - FOREIGN: the device memory the process itself holds beside its managed memory (known:
 *   capacity.c), and others': at first what others had in use before any of the job's managed
 *   memory existed (the reading capacity.c made at the job's first managed allocation on the
 *   device); at each reading, what is in use beyond pump's resident blocks and the process's
 *   own is others' only where the job's managed bytes not believed resident cannot account for
 *   it, and never counts for more than that use. A job whose managed memory exceeds the device
 *   can account for everything, so others' memory only falls: PyTorch's parameters copied in
 *   before the first launch, and the pages the launches too large for the budget fault in, are
 *   not taken for a neighbour. Without the ledger each of them shrank the budget for good (GPT-2 small on
 *   a device of 1.6 GB: 1.12 GB, the copied parameters' 0.5 GB less; the faulted pages filled
 *   the room pump left: scripts/bench-real-client-budget). What it costs: a neighbour that
 *   arrives later on a device the job oversubscribes is not seen, and the driver evicts pump's
 *   blocks to make it room (faults, never a wrong value). Where the first reading is missing,
 *   everything in use beyond pump's blocks at the first reading is foreign, as before.
 * - PLANS: pumpd's plans are told the same room, and keep to it as the launch rule does. Until
 *   2026-11-28 they were told the room free now (free memory + pump's resident bytes, less the
 *   margin, never under half the ledger's room): memory on the device that pump did not believe
 *   resident filled the free memory, and the driver evicted planned blocks to make room for
 *   what faulted in. Most of that memory was pump's own blindness: a tensor of pump's allocator
 *   carved from its allocation at its first free lost its residency (ranges.c), so from the
 *   second step on the tensors were never counted. With that fixed, the room free now only cost
 *   room: GPT-2 small under lookahead on its full 1.6 GB card (scripts/bench-real-client-budget's
 *   replay) took 0.94 s a step told the room free now (798 MiB, the floor) and 0.70 s told the
 *   ledger's room (1,596 MiB). On the H100's case f the room free now had fallen to 2 MiB of a
 *   5.4 GiB ledger (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3), the floor's reason.
 * - MARGIN: what the reading cannot see coming until the next synchronisation: device memory
 *   allocated outside pump's count between two readings (NCCL's buffers, NCCL_BUFFSIZE 4 MiB
 *   per channel and peer; cuMemCreate memory such as PyTorch's expandable segments; a
 *   library's own cudaMalloc without managed_all; another process's), the driver's page
 *   tables for the managed memory, and the rounding of the partial blocks at allocations' ends
 *   to the driver's 2 MiB root chunks. No source gives one figure for all of them, so each
 *   device learns its own: the margin starts at MARGIN_MIN (1/128 of the device's memory, 640
 *   MiB of an 80 GiB card, 4 MiB of bench-steady's 512 MiB device, and never more than that 640
 *   MiB: what appears is the job's and its libraries', not in proportion to the card, and the
 *   H100's 634 MiB held GPT-2 under the filler with no raise where the H200's 1/128, 1.09 GiB,
 *   took a sixth of the room the filler left: bench/results/gpu-20261126-nvidia-h200, case f;
 *   budget_appeared_bytes measures what was needed) and grows to the largest
 *   drop of free memory between two readings that pump's own prefetching does not explain
 *   (what appeared), in whole blocks, up to MARGIN_MAX (1/32 of the device, the fixed margin
 *   before: never less room than then). Memory that appears inside chunks the driver still
 *   holds for blocks pump evicted shows no drop and needs none: that room was pump's to give.
 *   Too small a margin costs copies, not failures: the driver takes the room others allocate
 *   from managed memory (uvm_pmm_gpu.c: RM's allocations evict UVM's chunks through PMA's
 *   eviction callbacks), once, before the margin has learned it. Too large costs pump room: on
 *   bench-steady's oversubscribed step pump moved 426 MiB each way a step at the fixed 1/32,
 *   402 at 1/64 and 392 at 1/128 (the driver without pump: 402). A GPU's measure of what
 *   appears between two readings on real jobs should check MARGIN_MIN; docs/how-it-works.md.
 * - HYSTERESIS: a reading replaces the default only when it differs from it by more than two
 *   of the largest margins (MARGIN_MAX), whatever the margin learned. A block pump evicts leaves
 *   its root chunk with the driver (uvm_va_block.c gives a block's GPU chunks back only when
 *   they are evicted or the block is destroyed), which the driver takes back only when it needs
 *   the room: such chunks in the device's free room count as used, so a reading falls short by
 *   as much, and each short reading would lower the default and make pump evict more. At two
 *   learned margins (8 MiB) bench-steady's oversubscribed lookahead step spiralled down so, its
 *   default from 252 MiB to 28-70 by the last step (12 changes; 400-450 MiB each way a step);
 *   at two of the largest (32 MiB) it held at 252 (no change; 178 each way).
 * Re-read at synchronisations only on a device where the default is in force: one
 * cuMemGetInfo (and the context check around it) per synchronisation there, none elsewhere,
 * so a job that fits adds no driver call.
 */
#include <pthread.h>

#include "budget.h"
#include "capacity.h"
#include "channel.h"
#include "locks.h"
#include "residency.h"

#define MARGIN_MIN_DIVISOR 128
#define MARGIN_MIN_MOST (640ull << 20)
#define MARGIN_MAX_DIVISOR 32
#define HYSTERESIS_MARGINS 2

struct device_budget {
    bool configured_ready;  /* atomic: `configured` was resolved */
    uint64_t configured;    /* PUMP_BUDGET in bytes for this device; 0: none */
    bool own_ready;         /* atomic: `own` and `margin` were read */
    uint64_t own;           /* atomic: pump's default, 0: none (the device could not be read) */
    /* under resolve_lock, once own_ready: */
    uint64_t margin, margin_max;
    uint64_t others;                     /* FOREIGN above, beside the process's own; UINT64_MAX: not known yet */
    uint64_t last_free, last_counted_in; /* the last reading, and the bytes pump had counted in then */
};

static struct device_budget devices[PUMP_DEVICES_MAX];
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static bool own_anywhere;  /* atomic: some device has pump's default: synchronisations re-read */

/* Managed memory can exceed the device (< 0: any device), and pump prefetches: pump's
 * default applies. */
static bool own_applies(int device)
{
    return pump_config.policy == PUMP_POLICY_LAUNCH && pump_capacity_beyond_device(device);
}

PUMP_HIDDEN bool pump_budget_possible(void)
{
    return pump_config.budget_kind != PUMP_CAP_DEFAULT || pump_channel_plan_budget() != 0 || own_applies(-1);
}

static uint64_t blocks_up(uint64_t bytes)
{
    return (bytes + PUMP_BLOCK_SIZE - 1) / PUMP_BLOCK_SIZE * PUMP_BLOCK_SIZE;
}

/* Room less the margin, in whole blocks: at least one block. */
static uint64_t less_margin(const struct device_budget *d, uint64_t room)
{
    return room > d->margin + PUMP_BLOCK_SIZE ? (room - d->margin) / PUMP_BLOCK_SIZE * PUMP_BLOCK_SIZE
                                               : PUMP_BLOCK_SIZE;
}

/* What a reading of the device's memory is made of: the driver's figures and what the process
 * holds there beside its managed footprint (its pools' kept memory is asked of the driver too),
 * all read with no lock held. */
struct reading {
    size_t free_bytes, total_bytes;
    uint64_t held;
};

static bool read_device(struct pump_context *c, int device, struct reading *r)
{
    if (!pump_context_memory(c, &r->free_bytes, &r->total_bytes))
        return false;
    r->held = pump_capacity_held(device);
    return true;
}

/* Under resolve_lock: what a reading of the device's memory gives, updating the foreign memory
 * (FOREIGN above): pump's default, the room less the foreign memory. */
static uint64_t own_from(struct device_budget *d, int device, const struct reading *r)
{
    uint64_t free_bytes = r->free_bytes, total_bytes = r->total_bytes, held = r->held;
    uint64_t resident = pump_residency_resident_bytes(device), footprint = pump_capacity_footprint(device);
    uint64_t used = total_bytes > free_bytes ? total_bytes - free_bytes : 0;
    uint64_t beyond_belief = used > resident + held ? used - resident - held : 0;  /* others' or managed */
    uint64_t unbelieved = footprint > resident ? footprint - resident : 0;
    uint64_t unaccounted = beyond_belief > unbelieved ? beyond_belief - unbelieved : 0;
    uint64_t known = d->others < beyond_belief ? d->others : beyond_belief;
    d->others = unaccounted > known ? unaccounted : known;
    uint64_t foreign = d->others + held;
    return less_margin(d, total_bytes > foreign ? total_bytes - foreign : 0);
}

static void publish_own(uint64_t own)
{
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    if (__atomic_load_n(&record->default_budget_bytes, __ATOMIC_RELAXED) != own)
        PUMP_SET(default_budget_bytes, own);
}

/* A counter of the record that keeps the most it was given (its writers hold resolve_lock). */
#define PUBLISH_MOST(field, value)                                                                \
    do {                                                                                          \
        struct pump_stats *record_ = atomic_load_explicit(&pump_stats_record, memory_order_relaxed); \
        if (__atomic_load_n(&record_->field, __ATOMIC_RELAXED) < (value))                          \
            PUMP_SET(field, (value));                                                             \
    } while (0)

static void remember_reading(struct device_budget *d, int device, uint64_t free_bytes)
{
    d->last_free = free_bytes;
    d->last_counted_in = pump_residency_counted_in_bytes(device);
}

/* Under resolve_lock, with a new reading: the margin grows to what appeared since the last one
 * (MARGIN above): the drop of free memory beyond the bytes pump brought in meanwhile (evicted or
 * not: the driver keeps an evicted block's chunk until it needs the room, so a block brought in,
 * evicted and brought in again may take two chunks, or one: what appeared is then read low, which
 * costs copies, not failures). Two threads' readings may arrive out of order: an older one read
 * as a rise of free memory learns nothing, and the next drop is counted from it (at worst a
 * margin larger than what appeared, never above MARGIN_MAX). */
static void learn_margin(struct device_budget *d, int device, uint64_t free_bytes)
{
    uint64_t dropped = d->last_free > free_bytes ? d->last_free - free_bytes : 0;
    uint64_t own_growth = pump_residency_counted_in_bytes(device) - d->last_counted_in;
    uint64_t appeared = blocks_up(dropped > own_growth ? dropped - own_growth : 0);
    remember_reading(d, device, free_bytes);
    /* The largest `appeared` of any reading, raise or not: the two GPU runs of case f kept margins
     * of 634 MiB (an H100) and 1.09 GiB (an H200) that nothing ever exceeded, which says only that
     * those were enough (bench/results/gpu-20261126-nvidia-h200). */
    PUBLISH_MOST(budget_appeared_bytes, appeared);
    if (appeared <= d->margin)
        return;
    d->margin = appeared < d->margin_max ? appeared : d->margin_max;
    PUMP_COUNT(budget_margin_raises, 1);
    PUBLISH_MOST(budget_margin_bytes, d->margin);
}

/* Resolves what needs the device's memory, once per device (under resolve_lock), from a
 * reading made before it with no lock held (`read`: it could be made). */
static void resolve(struct device_budget *d, struct pump_context *c, bool own, bool read, const struct reading *r)
{
    uint64_t total_bytes = r->total_bytes;
    if (!d->configured_ready) {
        if (pump_config.budget_kind == PUMP_CAP_BYTES)
            d->configured = pump_config.budget_value;
        else if (pump_config.budget_kind == PUMP_CAP_PERCENT && read)
            d->configured = total_bytes / 100 * pump_config.budget_value +
                            total_bytes % 100 * pump_config.budget_value / 100;
        else if (pump_config.budget_kind == PUMP_CAP_PERCENT)
            pump_log_once("cannot read the device's memory: no budget");
        __atomic_store_n(&d->configured_ready, true, __ATOMIC_RELEASE);
    }
    if (own && !d->own_ready) {
        if (read) {
            uint64_t least = total_bytes / MARGIN_MIN_DIVISOR;
            d->margin = blocks_up(least < MARGIN_MIN_MOST ? least : MARGIN_MIN_MOST);
            d->margin_max = blocks_up(total_bytes / MARGIN_MAX_DIVISOR);
            if (d->margin == 0)
                d->margin = d->margin_max = PUMP_BLOCK_SIZE;
            int device = pump_context_device(c);
            if (!pump_capacity_others_before(device, &d->others))
                d->others = UINT64_MAX;
            remember_reading(d, device, r->free_bytes);
            PUBLISH_MOST(budget_margin_bytes, d->margin);
            uint64_t own_bytes = own_from(d, device, r);
            __atomic_store_n(&d->own, own_bytes, __ATOMIC_RELAXED);
            __atomic_store_n(&own_anywhere, true, __ATOMIC_RELEASE);
            pump_channel_own_budget(device, own_bytes);  /* pumpd plans for it (PLANS above) */
        } else {
            pump_log_once("cannot read the device's memory: no default budget above the device");
        }
        __atomic_store_n(&d->own_ready, true, __ATOMIC_RELEASE);
    }
}

PUMP_HIDDEN uint64_t pump_budget_for(struct pump_context *c)
{
    int device = pump_context_device(c);
    uint64_t plan = pump_channel_plan_budget(), budget = plan;
    if (device >= 0 && device < PUMP_DEVICES_MAX) {
        struct device_budget *d = &devices[device];
        bool own = own_applies(device);
        bool configured_needed = budget == 0 && pump_config.budget_kind != PUMP_CAP_DEFAULT;
        if ((configured_needed && !__atomic_load_n(&d->configured_ready, __ATOMIC_ACQUIRE)) ||
            (own && !__atomic_load_n(&d->own_ready, __ATOMIC_ACQUIRE))) {
            /* The reading is a driver call: made before the lock, by each thread that comes
             * first; the first to take the lock resolves with its reading. */
            struct reading r = {0};
            bool percent = !__atomic_load_n(&d->configured_ready, __ATOMIC_ACQUIRE) &&
                           pump_config.budget_kind == PUMP_CAP_PERCENT;
            bool read = (percent || (own && !__atomic_load_n(&d->own_ready, __ATOMIC_ACQUIRE))) &&
                        read_device(c, device, &r);
            pump_mutex_lock(&resolve_lock);
            resolve(d, c, own, read, &r);
            pump_mutex_unlock(&resolve_lock);
        }
        if (budget == 0 && __atomic_load_n(&d->configured_ready, __ATOMIC_ACQUIRE))
            budget = d->configured;
        uint64_t own_bytes = own ? __atomic_load_n(&d->own, __ATOMIC_RELAXED) : 0;
        if (own_bytes != 0 && (budget == 0 || own_bytes < budget))
            budget = own_bytes;
        publish_own(own_bytes);
    } else if (budget == 0 && pump_config.budget_kind == PUMP_CAP_BYTES) {
        budget = pump_config.budget_value;
    }
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    if (__atomic_load_n(&record->budget_bytes, __ATOMIC_RELAXED) != budget)
        PUMP_SET(budget_bytes, budget);
    return budget;
}

/* A reading replaces a figure only past the hysteresis (HYSTERESIS above). */
static bool apart_enough(const struct device_budget *d, uint64_t reading, uint64_t figure)
{
    return (reading > figure ? reading - figure : figure - reading) > HYSTERESIS_MARGINS * d->margin_max;
}

PUMP_HIDDEN void pump_budget_synchronised(CUstream stream)
{
    if (PUMP_LIKELY(!__atomic_load_n(&own_anywhere, __ATOMIC_ACQUIRE)))
        return;
    struct pump_context *c = pump_context_of(stream);
    int device = c != NULL ? pump_context_device(c) : -1;
    if (device < 0 || device >= PUMP_DEVICES_MAX || !own_applies(device))
        return;
    struct device_budget *d = &devices[device];
    if (!__atomic_load_n(&d->own_ready, __ATOMIC_ACQUIRE) || __atomic_load_n(&d->own, __ATOMIC_RELAXED) == 0)
        return;
    struct reading r;
    if (!read_device(c, device, &r))
        return;
    PUMP_COUNT(budget_rereads, 1);
    pump_mutex_lock(&resolve_lock);
    learn_margin(d, device, r.free_bytes);
    uint64_t reading = own_from(d, device, &r);
    bool changes = apart_enough(d, reading, __atomic_load_n(&d->own, __ATOMIC_RELAXED));
    if (changes)
        __atomic_store_n(&d->own, reading, __ATOMIC_RELAXED);
    pump_mutex_unlock(&resolve_lock);
    if (changes) {
        PUMP_COUNT(budget_changes, 1);
        publish_own(reading);
        pump_channel_own_budget(device, reading);
    }
}
