/* replay_trace.c: replays a pump trace file (pump_channel.h's trace layout,
 * versions 1 and 2) on the CUDA driver API, so a recorded or generated
 * workload runs on fakecuda under the shim (pump-run --policy P --budget B)
 * and its faults and bytes can be set against `pump simulate`.
 *
 *   replay_trace [--no-segments] [--step-pause MS] [--kernel-times FILE] TRACE
 *
 * What each record becomes:
 *   ALLOC   cuMemAllocManaged of its size (the trace's base maps to the new pointer); inside
 *           a segment (below; a named tensor's place is its arg3, shim/lookup/names.h), a
 *           tensor at the same offset of the segment's new allocation,
 *           told to the shim as PyTorch's caching allocator tells it (pump_torch_trace)
 *   FREE    cuMemFree of the mapped pointer; a tensor's: the shim is told it is dead
 *   ALLOC, FREE, ALLOC at one base, one after the other (among ALLOC, FREE and LAUNCH
 *           records), the FREE of the first's size, the second no larger: the shim carved a caching
 *           allocator's segment into tensors (shim/hooks/torch_trace.c), so the first
 *           allocation stays, whole, as a segment: a dead tensor's memory stays in it, as in
 *           the traced job (its stale bytes are evicted and brought back for the next tensor
 *           there), and each tensor is given to the shim as the job's allocator gave it (--no-segments: each tensor an allocation of
 *           its own, freed to the driver at its FREE, as if every dead tensor were discarded)
 *   LAUNCH  one launch, on one stream, of a kernel registered per trace function
 *           ("replay_<hex handle>"), that calls fakecuda_touch on each range it is given:
 *           the launch's EXTENT ranges, translated into the new allocations; without
 *           extents, each base's whole allocation. Its arguments are (pointer, bytes)
 *           pairs: for each base of the LAUNCH record, in order, its first range (so the
 *           shim finds the same allocations in the same order, hence the same launch
 *           keys); then further ranges while pairs remain (REPLAY_PAIRS in all; unused
 *           pairs are NULL, 0). Ranges beyond those go in a host table whose pointer and
 *           length are the last two arguments; the kernel touches them too.
 *   SYNC    cuStreamSynchronize (the shim's residency beliefs expire there, as in the
 *           traced job)
 *   STEP    the shim told the optimizer's step ended (pump_torch_trace_step); with
 *           --step-pause MS, also cuStreamSynchronize, a JSON line of fakecuda's counters
 *           so far and the monotonic clock (wall_ns), and a sleep of MS milliseconds, as a
 *           real step's host work
 *           (data, loss.item()) gives pumpd time to read the step and publish its plan
 *           before the next one
 *   others  nothing (FUNCTION, NAME, COUNTERS, COST, BLOCK_ALLOC, BLOCK_FREE)
 * --kernel-times FILE: a little-endian uint64 per LAUNCH record, in file order: the ns the
 * launch's kernel computes beside its touches (fakecuda_compute), as the simulator's model
 * times it; without it a kernel takes only its touches' time.
 * Records of every process in the trace are replayed in file order by this one
 * process. At the end: cuCtxSynchronize, then one JSON line with fakecuda's counters
 * and the replay's own (launches, ranges touched, records left out and why).
 * A bad or truncated file: a message naming what is wrong, exit status 2.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "pump_channel.h"
#include "pump_torch_trace.h"

static unsigned long step_pause_ms; /* --step-pause */
static bool no_segments;            /* --no-segments */

/* The monotonic clock, for a step's wall time (its line's wall_ns: the pause before it included). */
static uint64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

#define REPLAY_PAIRS 64                      /* (pointer, bytes) pairs among the arguments */
#define REPLAY_PARAMS (2 * REPLAY_PAIRS + 3) /* ... then the overflow table, its length, and the
                                                kernel's compute time (ns) */
#define MAX_BASES 4096                       /* bases one LAUNCH record may name */
#define MAX_FUNCTIONS 65536

struct range {
    uint64_t address, bytes;
};

struct allocation {
    uint64_t trace_base, size;
    CUdeviceptr ptr;
    bool tensor;  /* inside a segment: no allocation of its own */
};

/* Live allocations and tensors, sorted by trace base (they do not overlap). */
static struct allocation *allocations;
static size_t allocation_count, allocation_room;

/* Segments the traced job's caching allocator carved into tensors: whole allocations here,
 * never freed before the end (the allocator keeps its segments). */
static struct allocation segments[4096];
static size_t segment_count;
/* A FREE held back one record: an ALLOC at its base, no larger, next makes it a segment. */
static struct allocation carve_candidate;
static bool carve_pending;
/* The last ALLOC, FREE or LAUNCH record, if an ALLOC: a FREE of the same memory next may be a
 * carve (the caching allocator hands out the segment's first tensor as soon as it has it). */
static struct allocation last_alloc;
static bool last_was_alloc;

/* libpump's entry for PyTorch's caching allocator's events (pump_torch_trace.h); absent when
 * the replay runs without the shim. */
extern void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, struct CUstream_st *stream)
    __attribute__((weak));
extern void pump_torch_trace_step(void) __attribute__((weak));

static struct {
    uint64_t launches, ranges_touched, allocs, frees, syncs;
    uint64_t unknown_bases, ranges_outside, frees_unknown;
    uint64_t segments, tensor_allocs, tensor_frees;
} replayed;

static const char *trace_path;

static void fail(const char *what)
{
    fprintf(stderr, "replay_trace: %s: %s\n", trace_path, what);
    exit(2);
}

/* Index of the first allocation with trace_base > address. */
static size_t upper(uint64_t address)
{
    size_t lo = 0, hi = allocation_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (allocations[mid].trace_base <= address)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct allocation *holding(uint64_t address)
{
    size_t i = upper(address);
    if (i == 0 || address >= allocations[i - 1].trace_base + allocations[i - 1].size)
        return NULL;
    return &allocations[i - 1];
}

static CUstream stream;

static const struct allocation *segment_holding(uint64_t address)
{
    for (size_t i = 0; i < segment_count; i++)
        if (address >= segments[i].trace_base && address - segments[i].trace_base < segments[i].size)
            return &segments[i];
    return NULL;
}

static void tell_shim(int event, const struct allocation *tensor)
{
    if (pump_torch_trace != NULL)
        pump_torch_trace(event, tensor->ptr, tensor->size, 0, stream);
}

static void insert(struct allocation a)
{
    if (allocation_count == allocation_room) {
        allocation_room = allocation_room ? 2 * allocation_room : 1024;
        allocations = realloc(allocations, allocation_room * sizeof *allocations);
        if (allocations == NULL)
            fail("out of memory");
    }
    size_t i = upper(a.trace_base);
    memmove(&allocations[i + 1], &allocations[i], (allocation_count - i) * sizeof *allocations);
    allocations[i] = a;
    allocation_count++;
}

/* Takes a out of the live list (its memory is not touched). */
static void unlink_allocation(struct allocation *a)
{
    size_t i = (size_t)(a - allocations);
    memmove(&allocations[i], &allocations[i + 1], (allocation_count - i - 1) * sizeof *allocations);
    allocation_count--;
}

static void release(struct allocation *a)
{
    if (a->tensor) {
        tell_shim(PUMP_TORCH_TENSOR_FREE, a);
        replayed.tensor_frees++;
    } else {
        CHECK(cuMemFree(a->ptr));
        replayed.frees++;
    }
    unlink_allocation(a);
}

/* The FREE held back: made now, unless `base` and `size` (an ALLOC's) carve its allocation. */
static void settle_carve(bool alloc, uint64_t base, uint64_t size)
{
    if (!carve_pending)
        return;
    carve_pending = false;
    struct allocation *a = holding(carve_candidate.trace_base);
    if (alloc && base == carve_candidate.trace_base && size <= carve_candidate.size) {
        if (segment_count == sizeof segments / sizeof *segments)
            fail("more than 4096 segments");
        segments[segment_count++] = *a;
        replayed.segments++;
        unlink_allocation(a);
        return;
    }
    release(a);
}

/* An ALLOC of `size` at trace address `base`; `where`: the memory it stood for in the traced job
 * (base itself, or a named tensor's real address: pump_channel.h), which places it. */
static void alloc_record(uint64_t base, uint64_t where, uint64_t size)
{
    settle_carve(true, where, size);
    last_was_alloc = false;
    if (size == 0)
        fail("an ALLOC of 0 bytes");
    struct allocation *old = holding(base);
    if (old != NULL && old->trace_base == base) /* freed unseen: the trace's base is reused */
        release(old);
    else if (old != NULL)
        fail("an ALLOC overlaps a live allocation");
    const struct allocation *segment = segment_holding(where);
    if (segment != NULL) {
        if (size > segment->size - (where - segment->trace_base))
            fail("a tensor's ALLOC reaches past its segment");
        struct allocation tensor = {base, size, segment->ptr + (where - segment->trace_base), true};
        insert(tensor);
        tell_shim(PUMP_TORCH_TENSOR_ALLOC, &tensor);
        replayed.tensor_allocs++;
        return;
    }
    CUdeviceptr ptr;
    CHECK(cuMemAllocManaged(&ptr, size, CU_MEM_ATTACH_GLOBAL));
    replayed.allocs++;
    insert((struct allocation){base, size, ptr, false});
    last_alloc = (struct allocation){base, size, ptr, false};
    last_was_alloc = true;
}

static void free_record(uint64_t base, uint64_t size)
{
    settle_carve(false, 0, 0);
    bool after_its_alloc = last_was_alloc && last_alloc.trace_base == base && last_alloc.size == size;
    last_was_alloc = false;
    struct allocation *a = holding(base);
    if (a == NULL || a->trace_base != base) {
        replayed.frees_unknown++;
        return;
    }
    if (after_its_alloc && !a->tensor && !no_segments) {
        carve_candidate = *a;  /* held back a record: the next may carve it */
        carve_pending = true;
        return;
    }
    release(a);
}

/* ---- the kernels ---- */

static void touch_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    for (int i = 0; i < REPLAY_PAIRS; i++) {
        void *ptr = *(void **)params[2 * i];
        uint64_t bytes = *(uint64_t *)params[2 * i + 1];
        if (ptr != NULL)
            fakecuda_touch(ptr, bytes);
    }
    struct range *table = *(struct range **)params[2 * REPLAY_PAIRS];
    uint64_t n = *(uint64_t *)params[2 * REPLAY_PAIRS + 1];
    for (uint64_t i = 0; i < n; i++)
        fakecuda_touch((void *)(uintptr_t)table[i].address, table[i].bytes);
    free(table);
    fakecuda_compute(*(uint64_t *)params[2 * REPLAY_PAIRS + 2]);
}

/* --kernel-times: the launches' compute times, read as they are replayed. */
static FILE *kernel_times;
static const char *kernel_times_path;

static uint64_t next_kernel_ns(void)
{
    uint64_t ns = 0;
    if (kernel_times != NULL && fread(&ns, sizeof ns, 1, kernel_times) != 1) {
        fprintf(stderr, "replay_trace: %s: holds fewer times than %s has launches\n", kernel_times_path, trace_path);
        exit(2);
    }
    return ns;
}

static struct {
    uint64_t handle;
    CUfunction function;
} functions[MAX_FUNCTIONS];
static size_t function_count;
static CUmodule module;

static CUfunction function_for(uint64_t handle)
{
    for (size_t i = 0; i < function_count; i++)
        if (functions[i].handle == handle)
            return functions[i].function;
    if (function_count == MAX_FUNCTIONS)
        fail("more than 65536 distinct functions");
    static size_t sizes[REPLAY_PARAMS], aligns[REPLAY_PARAMS];
    for (int i = 0; i < REPLAY_PARAMS; i++)
        sizes[i] = aligns[i] = 8;
    char name[40];
    snprintf(name, sizeof name, "replay_%" PRIx64, handle);
    if (fakecuda_register_kernel(name, touch_kernel, REPLAY_PARAMS, sizes, aligns) != 0)
        fail("fakecuda refused to register a kernel");
    CHECK(cuModuleGetFunction(&functions[function_count].function, module, name));
    functions[function_count].handle = handle;
    return functions[function_count++].function;
}

/* ---- launches ---- */

static struct {
    bool open;
    uint64_t function;
    uint32_t bases_expected, base_count;
    uint64_t bases[MAX_BASES];
    struct range *extents;
    size_t extent_count, extent_room;
} pending;

/* A trace range in the new allocations (clipped to the one holding its
 * start); false when no live allocation holds it. */
static bool translate(uint64_t address, uint64_t bytes, struct range *out)
{
    struct allocation *a = holding(address);
    if (a == NULL || bytes == 0) {
        replayed.ranges_outside++;
        return false;
    }
    uint64_t end = a->trace_base + a->size;
    out->address = a->ptr + (address - a->trace_base);
    out->bytes = address + bytes > end || address + bytes < address ? end - address : bytes;
    return true;
}

static void launch_pending(void)
{
    if (!pending.open)
        return;
    pending.open = false;
    if (pending.base_count != pending.bases_expected)
        fail("a LAUNCH is missing LAUNCH_MORE records");
    /* Per base, in order: its ranges (its extents, or the whole allocation). */
    size_t room = pending.base_count + pending.extent_count, n = 0;
    struct range *ranges = malloc((room ? room : 1) * sizeof *ranges);
    bool *first_of_base = calloc(room ? room : 1, 1);
    if (ranges == NULL || first_of_base == NULL)
        fail("out of memory");
    bool *used = calloc(pending.extent_count ? pending.extent_count : 1, 1);
    if (used == NULL)
        fail("out of memory");
    for (uint32_t b = 0; b < pending.base_count; b++) {
        struct allocation *a = holding(pending.bases[b]);
        if (a == NULL) {
            replayed.unknown_bases++;
            continue;
        }
        bool any = false;
        for (size_t e = 0; e < pending.extent_count; e++) {
            struct allocation *home = holding(pending.extents[e].address);
            if (used[e] || home != a)
                continue;
            used[e] = true;
            if (translate(pending.extents[e].address, pending.extents[e].bytes, &ranges[n])) {
                first_of_base[n] = !any;
                any = true;
                n++;
            }
        }
        if (!any && pending.extent_count == 0) {
            ranges[n] = (struct range){a->ptr, a->size};
            first_of_base[n++] = true;
        }
    }
    for (size_t e = 0; e < pending.extent_count; e++) /* extents outside the launch's bases */
        if (!used[e] && translate(pending.extents[e].address, pending.extents[e].bytes, &ranges[n]))
            n++;
    free(used);

    /* Arguments: each base's first range in order, then the others; past
     * REPLAY_PAIRS, the table. */
    uint64_t values[REPLAY_PARAMS] = {0};
    void *params[REPLAY_PARAMS];
    struct range *table = malloc((n ? n : 1) * sizeof *table);
    if (table == NULL)
        fail("out of memory");
    size_t pairs = 0;
    uint64_t overflow = 0;
    for (int firsts = 1; firsts >= 0; firsts--)
        for (size_t i = 0; i < n; i++) {
            if (first_of_base[i] != firsts)
                continue;
            if (pairs < REPLAY_PAIRS) {
                values[2 * pairs] = ranges[i].address;
                values[2 * pairs++ + 1] = ranges[i].bytes;
            } else {
                table[overflow++] = ranges[i];
            }
        }
    values[2 * REPLAY_PAIRS] = (uint64_t)(uintptr_t)table;
    values[2 * REPLAY_PAIRS + 1] = overflow;
    values[2 * REPLAY_PAIRS + 2] = next_kernel_ns();
    for (int i = 0; i < REPLAY_PARAMS; i++)
        params[i] = &values[i];
    CHECK(cuLaunchKernel(function_for(pending.function), 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    replayed.launches++;
    replayed.ranges_touched += n;
    free(ranges);
    free(first_of_base);
}

static void add_extent(uint64_t address, uint64_t bytes)
{
    if (pending.extent_count == pending.extent_room) {
        pending.extent_room = pending.extent_room ? 2 * pending.extent_room : 64;
        pending.extents = realloc(pending.extents, pending.extent_room * sizeof *pending.extents);
        if (pending.extents == NULL)
            fail("out of memory");
    }
    pending.extents[pending.extent_count++] = (struct range){address, bytes};
}

static void add_base(uint64_t base)
{
    if (pending.base_count == MAX_BASES)
        fail("a LAUNCH names more than 4096 allocations");
    pending.bases[pending.base_count++] = base;
}

static void replay(const struct pump_event *e)
{
    switch (e->kind) {
    case PUMP_EVENT_LAUNCH_MORE:
        if (!pending.open || e->count > 5)
            fail("a LAUNCH_MORE record that follows no LAUNCH");
        for (uint16_t i = 0; i < e->count; i++)
            add_base(e->arg[i]);
        return;
    case PUMP_EVENT_EXTENT:
        if (!pending.open || e->count < 1 || e->count > 2)
            fail("an EXTENT record that follows no LAUNCH");
        for (uint16_t i = 0; i < e->count; i++)
            add_extent(e->arg[2 * i], e->arg[2 * i + 1]);
        return;
    case PUMP_EVENT_COST:
        return;
    default:
        break;
    }
    launch_pending();
    if (e->kind != PUMP_EVENT_ALLOC && e->kind != PUMP_EVENT_FREE)
        settle_carve(false, 0, 0);
    switch (e->kind) {
    case PUMP_EVENT_ALLOC:
        alloc_record(e->arg[0], e->arg[3] != 0 ? e->arg[3] : e->arg[0], e->arg[1]);
        break;
    case PUMP_EVENT_FREE:
        free_record(e->arg[0], e->arg[1]);
        break;
    case PUMP_EVENT_LAUNCH:
        last_was_alloc = false;
        pending.open = true;
        pending.function = e->arg[0];
        pending.bases_expected = e->count;
        pending.base_count = 0;
        pending.extent_count = 0;
        for (uint16_t i = 0; i < e->count && i < 3; i++)
            add_base(e->arg[2 + i]);
        break;
    case PUMP_EVENT_SYNC:
        CHECK(cuStreamSynchronize(stream));
        replayed.syncs++;
        break;
    case PUMP_EVENT_STEP:
        if (pump_torch_trace_step != NULL)
            pump_torch_trace_step();  /* as the job's optimizer hook did: the shim's names count from here */
        if (step_pause_ms > 0) {
            CHECK(cuStreamSynchronize(stream));
            struct fakecuda_stats s;
            fakecuda_get_stats(&s);
            printf("{\"step\": %" PRIu64 ", \"gpu_faults\": %" PRIu64 ", \"bytes_prefetched_h2d\": %" PRIu64
                   ", \"bytes_faulted_h2d\": %" PRIu64 ", \"bytes_d2h\": %" PRIu64 ", \"bytes_discarded\": %" PRIu64
                   ", \"gpu_faults_unpointed\": %" PRIu64 ", \"wall_ns\": %" PRIu64 "}\n", e->arg[0], s.gpu_faults,
                   s.bytes_prefetched_h2d, s.bytes_faulted_h2d, s.bytes_d2h, s.bytes_discarded, s.gpu_faults_unpointed,
                   monotonic_ns());
            struct timespec pause = {step_pause_ms / 1000, (long)(step_pause_ms % 1000) * 1000000L};
            while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
            }
        }
        break;
    default:
        break; /* FUNCTION, NAME, COUNTERS, BLOCK_ALLOC, BLOCK_FREE, and kinds unknown here */
    }
}

static void read_exactly(FILE *f, void *buffer, size_t bytes, const char *what)
{
    if (fread(buffer, 1, bytes, f) != bytes) {
        char message[160];
        snprintf(message, sizeof message, "truncated: the file ends inside %s", what);
        fail(message);
    }
}

int main(int argc, char **argv)
{
    char *end = NULL;
    for (; argc >= 3 && strcmp(argv[1], "--no-segments") == 0; argv++, argc--)
        no_segments = true;
    while (argc >= 4 && (strcmp(argv[1], "--step-pause") == 0 || strcmp(argv[1], "--kernel-times") == 0)) {
        if (strcmp(argv[1], "--kernel-times") == 0) {
            kernel_times_path = argv[2];
            if (kernel_times != NULL || (kernel_times = fopen(kernel_times_path, "rb")) == NULL) {
                fprintf(stderr, "replay_trace: --kernel-times %s: %s\n", argv[2],
                        kernel_times != NULL ? "given twice" : strerror(errno));
                return 2;
            }
        } else {
            errno = 0;
            unsigned long ms = strtoul(argv[2], &end, 10);
            if (errno != 0 || end == argv[2] || *end != '\0' || ms > 60000) {
                fprintf(stderr, "replay_trace: --step-pause %s: allowed 0..60000 (milliseconds)\n", argv[2]);
                return 2;
            }
            step_pause_ms = ms;
        }
        argv += 2;
        argc -= 2;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: replay_trace [--no-segments] [--step-pause MS] [--kernel-times FILE] TRACE\n");
        return 2;
    }
    trace_path = argv[1];
    FILE *f = fopen(trace_path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay_trace: %s: %s\n", trace_path, strerror(errno));
        return 2;
    }
    struct pump_trace_header header;
    read_exactly(f, &header, sizeof header, "the header");
    if (header.magic != PUMP_TRACE_MAGIC)
        fail("not a pump trace (bad magic)");
    if (header.version < 1 || header.version > PUMP_TRACE_VERSION || header.record_size != sizeof(struct pump_event)) {
        char message[160];
        snprintf(message, sizeof message, "trace version %u with %u-byte records; this reads versions 1 to %d, %zu-byte",
                 header.version, header.record_size, PUMP_TRACE_VERSION, sizeof(struct pump_event));
        fail(message);
    }

    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    enum { CHUNK = 4096 };
    static struct pump_event records[CHUNK];
    struct pump_trace_block block;
    size_t got;
    while ((got = fread(&block, 1, sizeof block, f)) == sizeof block) {
        if (block.magic != PUMP_TRACE_BLOCK_MAGIC)
            fail("a block with a bad magic");
        for (uint64_t done = 0; done < block.records;) {
            size_t n = block.records - done < CHUNK ? (size_t)(block.records - done) : CHUNK;
            read_exactly(f, records, n * sizeof *records, "a block's records");
            for (size_t i = 0; i < n; i++)
                replay(&records[i]);
            done += n;
        }
    }
    if (!feof(f))
        fail("a read error");
    if (got != 0)
        fail("truncated: the file ends inside a block header");
    launch_pending();
    settle_carve(false, 0, 0);
    fclose(f);
    uint64_t more;
    if (kernel_times != NULL && fread(&more, sizeof more, 1, kernel_times) == 1) {
        fprintf(stderr, "replay_trace: %s: holds more times than %s has launches\n", kernel_times_path, trace_path);
        return 2;
    }
    CHECK(cuCtxSynchronize());

    struct fakecuda_stats s;
    fakecuda_get_stats(&s);
    printf("{\"launches\": %" PRIu64 ", \"ranges_touched\": %" PRIu64 ", \"allocs\": %" PRIu64
           ", \"frees\": %" PRIu64 ", \"syncs\": %" PRIu64 ", \"unknown_bases\": %" PRIu64
           ", \"ranges_outside\": %" PRIu64 ", \"frees_unknown\": %" PRIu64 ", \"gpu_faults\": %" PRIu64
           ", \"bytes_faulted_h2d\": %" PRIu64 ", \"bytes_prefetched_h2d\": %" PRIu64
           ", \"bytes_prefetched_unused\": %" PRIu64 ", \"bytes_d2h\": %" PRIu64 ", \"cpu_faults\": %" PRIu64
           ", \"kernels_run\": %" PRIu64 ", \"device_resident_peak\": %" PRIu64 ", \"segments\": %" PRIu64
           ", \"tensor_allocs\": %" PRIu64 ", \"tensor_frees\": %" PRIu64 "}\n",
           replayed.launches, replayed.ranges_touched, replayed.allocs, replayed.frees, replayed.syncs,
           replayed.unknown_bases, replayed.ranges_outside, replayed.frees_unknown, s.gpu_faults,
           s.bytes_faulted_h2d, s.bytes_prefetched_h2d, s.bytes_prefetched_unused, s.bytes_d2h, s.cpu_faults,
           s.kernels_run, s.device_resident_peak, replayed.segments, replayed.tensor_allocs, replayed.tensor_frees);
    for (size_t i = 0; i < allocation_count; i++)
        if (!allocations[i].tensor)
            CHECK(cuMemFree(allocations[i].ptr));
    for (size_t i = 0; i < segment_count; i++)
        CHECK(cuMemFree(segments[i].ptr));
    return 0;
}
