/* steady_step.c: a PyTorch-like training step on fakecuda, for scripts/bench-steady: what
 * pump adds in the steady state a GPU would show, measured per step.
 *
 *   steady_step STEPS WARMUP [managed] [neighbour=MIB] [read_mostly] [planned] [print_launches]
 *               [dead_told_early] [step_marks]
 *
 * The model: 32 layers, each with a weight, its gradient and Adam's two moments (2 MiB each),
 * and a 4 MiB activation saved for the backward pass; every tensor from PyTorch's caching
 * allocator (tests/c/torch_caching.h: 20 MiB segments, a freed block handed out again at the
 * same address) on the legacy default stream, reported to libpump's bridge when present. Per
 * step, 516 launches: the batch's host-to-device copy, 5 per layer forward, the loss, 6 per
 * layer backward, 4 per layer for the optimizer and 1 to zero each gradient, then the loss read
 * back as `.item()` does it (a copy to the host and one synchronisation). fakecuda has no
 * cuMemcpy* (fakecuda/README.md): the copies are kernels that read or write host memory
 * the program malloc'ed (standing for pinned memory) and touch only their device operand, as
 * a copy engine would. Every tensor is whole 2 MiB blocks.
 *
 * managed: segments from cuMemAllocManaged (a job whose memory can exceed the device) instead
 *   of cuMemAlloc (PyTorch's default, which pump's managed_all makes managed).
 * neighbour=MIB: first, that much device memory held by cuMemCreate (another process, NCCL's
 *   buffers: plain allocations pump leaves alone), for the whole run.
 * read_mostly: the weights advised CU_MEM_ADVISE_SET_READ_MOSTLY (managed memory only): read
 *   by the forward and backward passes, written once a step by the optimizer.
 * planned: under pump-run --policy lookahead, the warmup's WARMUP steps count from the first
 *   step in which a launch found a trigger of pumpd's plan (libpump's plan_triggers): pumpd
 *   learns the iteration from two steps and plans it in its own process, which takes a time of
 *   this machine's, not a number of steps. The steps before are run but not counted (at most
 *   PLAN_WAIT_STEPS; a run whose plan never came exits 4). Without libpump it does nothing.
 * dead_told_early: each layer's scratch tensor is reported freed to libpump before its last read,
 *   a planted error in what pump takes for dead: under PUMP_TORCH_DISCARDS=1 or =poison its
 *   blocks are dropped while the read is still to come, and the losses change.
 * step_marks: each step's end told to libpump as an optimizer's step (pump_torch_trace_step, as
 *   pump's start-up hook does after torch.optim's step), so that under PUMP_TORCH_NAMES=1 its
 *   tensors go to pumpd by their names (shim/lookup/names.h). Without libpump it does nothing.
 * print_launches: a line per launch, before the JSON object: "launch KERNEL 0xPTR ...", the
 *   device tensors it is given in argument order (what a launch key is made of, pump_channel.h).
 *
 * Prints one JSON object: per-step figures of step 1 ("first"), and the mean over the steps
 * after WARMUP ("steady"): fakecuda's counters, its calls and modelled host ns per entry point,
 * the launching thread's CPU time and the modelled driver time charged to it (not to another
 * thread: pump's worker, a stream's), the step's wall time, and libpump's counters when it runs under pump (its record
 * in $PUMP_STATS_DIR, read live), and the loss bits of every step.
 */
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pump_stats.h"
#include "torch_caching.h"

#define MIB ((size_t)1 << 20)
#define LAYERS 32
#define PARAM (2 * MIB)
#define ACT (4 * MIB)
#define BATCH (4 * MIB)
#define LOSS (2 * MIB)
#define COMPUTED 64 /* floats each kernel computes on: the rest of a tensor is touched only */
#define MAX_ENTRIES 64
#define PLAN_WAIT_STEPS 200
#define MAX_RECORDED 1024 /* steps whose loss is printed */

extern void pump_torch_trace_step(void) __attribute__((weak)); /* libpump's, where it is loaded */

static CUfunction unary, binary, adam, to_device, to_host;
static struct torch_caching cache = {.segment_size = 20 * MIB, .report = true};
static bool dead_told_early;
static CUdeviceptr weight[LAYERS], grad[LAYERS], moment1[LAYERS], moment2[LAYERS];

struct snapshot {
    struct fakecuda_stats driver;
    struct fakecuda_entry_cost entries[MAX_ENTRIES];
    struct pump_stats pump;
    int has_pump;
    double cpu_ns, host_ns; /* the launching thread's CPU, and the driver time charged to it */
    double wall_ns; /* fakecuda's clock: its modelled costs are slept, so a step's wall time is its modelled time */
};

/* ---- kernels: each touches all its tensors (the model's access: fakecuda_touch_read for what it
 * only reads, fakecuda_touch for what it writes) and computes on a prefix ---- */

static float *arg_ptr(void **params, int i) { return *(float **)params[i]; }

/* out = f(in) over (in, in_bytes, out, out_bytes). */
static void unary_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *in = arg_ptr(params, 0), *out = arg_ptr(params, 2);
    fakecuda_touch_read(in, *(uint64_t *)params[1]);
    fakecuda_touch(out, *(uint64_t *)params[3]);
    for (int i = 0; i < COMPUTED; i++)
        out[i] = in[i] * 0.5f + 0.25f;
}

/* out = g(a, b) over (a, b, out, bytes): all three the same size. */
static void binary_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *a = arg_ptr(params, 0), *b = arg_ptr(params, 1), *out = arg_ptr(params, 2);
    uint64_t bytes = *(uint64_t *)params[3];
    fakecuda_touch_read(a, bytes);
    fakecuda_touch_read(b, bytes);
    fakecuda_touch(out, bytes);
    for (int i = 0; i < COMPUTED; i++)
        out[i] = a[i] * 0.75f + b[i] * 0.125f;
}

/* Adam's update over (weight, grad, m, v, bytes). */
static void adam_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *w = arg_ptr(params, 0), *g = arg_ptr(params, 1), *m = arg_ptr(params, 2), *v = arg_ptr(params, 3);
    uint64_t bytes = *(uint64_t *)params[4];
    for (int i = 0; i < 4; i++) /* the gradient is only read */
        (i == 1 ? fakecuda_touch_read : fakecuda_touch)(arg_ptr(params, i), bytes);
    for (int i = 0; i < COMPUTED; i++) {
        m[i] = 0.9f * m[i] + 0.1f * g[i];
        v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
        w[i] -= 0.001f * m[i] / (1.0f + v[i]);
    }
}

/* A host-to-device copy over (host src, device dst, bytes): the copy engine writes dst. */
static void to_device_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *src = arg_ptr(params, 0);
    float *dst = arg_ptr(params, 1);
    fakecuda_touch(dst, *(uint64_t *)params[2]);
    memcpy(dst, src, COMPUTED * sizeof *dst);
}

/* A device-to-host copy over (device src, host dst, bytes). */
static void to_host_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *src = arg_ptr(params, 0);
    fakecuda_touch_read(src, *(uint64_t *)params[2]);
    memcpy(arg_ptr(params, 1), src, sizeof(float));
}

static CUfunction kernel(CUmodule module, const char *name, fakecuda_kernel_fn fn, unsigned count)
{
    const size_t sizes[] = {8, 8, 8, 8, 8}, aligns[] = {8, 8, 8, 8, 8};
    if (fakecuda_register_kernel(name, fn, count, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        exit(3);
    }
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, module, name));
    return f;
}

static long launches;
static bool print_launches;

/* Launches f; `device`: the n device tensors it is given, in argument order (print_launches). */
static void launch(CUfunction f, void **params, const CUdeviceptr *device, int n)
{
    CHECK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    launches++;
    if (!print_launches)
        return;
    printf("launch %s", f == unary ? "unary" : f == binary ? "binary" : f == adam ? "adam" : f == to_device ? "to_device" : "to_host");
    for (int i = 0; i < n; i++)
        printf(" 0x%llx", (unsigned long long)device[i]);
    printf("\n");
}

static void launch_unary(CUdeviceptr in, size_t in_bytes, CUdeviceptr out, size_t out_bytes)
{
    uint64_t ib = in_bytes, ob = out_bytes;
    void *params[] = {&in, &ib, &out, &ob};
    launch(unary, params, (CUdeviceptr[]){in, out}, 2);
}

static void launch_binary(CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, size_t bytes)
{
    uint64_t n = bytes;
    void *params[] = {&a, &b, &out, &n};
    launch(binary, params, (CUdeviceptr[]){a, b, out}, 3);
}

static void launch_copy(CUfunction f, void *first, void *second, CUdeviceptr device, size_t bytes)
{
    uint64_t n = bytes;
    void *params[] = {first, second, &n};
    launch(f, params, &device, 1);
}

/* ---- one training step ---- */

static float step(const float *batch_host, float *loss_host)
{
    CUdeviceptr batch = torch_caching_alloc(&cache, BATCH), act[LAYERS + 1];
    launch_copy(to_device, &batch_host, &batch, batch, BATCH);
    act[0] = batch;
    for (int l = 0; l < LAYERS; l++) { /* matmul, bias, activation, norm, dropout */
        CUdeviceptr tmp = torch_caching_alloc(&cache, ACT);
        launch_binary(act[l], act[l], tmp, ACT);
        launch_unary(weight[l], PARAM, tmp, ACT);
        if (dead_told_early)
            torch_caching_report(&cache, PUMP_TORCH_TENSOR_FREE, tmp, ACT);
        act[l + 1] = torch_caching_alloc(&cache, ACT);
        launch_unary(tmp, ACT, act[l + 1], ACT);
        torch_caching_free(&cache, tmp, ACT);
        launch_unary(act[l + 1], ACT, act[l + 1], ACT);
        launch_unary(act[l + 1], ACT, act[l + 1], ACT);
    }
    CUdeviceptr loss = torch_caching_alloc(&cache, LOSS);
    launch_unary(act[LAYERS], ACT, loss, LOSS);
    CUdeviceptr upstream = torch_caching_alloc(&cache, ACT);
    launch_unary(loss, LOSS, upstream, ACT);
    for (int l = LAYERS - 1; l >= 0; l--) {
        CUdeviceptr g = torch_caching_alloc(&cache, ACT);
        launch_binary(upstream, act[l + 1], g, ACT);
        launch_unary(g, ACT, g, ACT);
        launch_unary(g, ACT, grad[l], PARAM);   /* weight gradient */
        launch_unary(act[l], ACT, grad[l], PARAM);
        CUdeviceptr down = torch_caching_alloc(&cache, ACT);
        launch_binary(g, act[l], down, ACT);     /* input gradient */
        launch_unary(weight[l], PARAM, down, ACT);
        torch_caching_free(&cache, g, ACT);
        torch_caching_free(&cache, upstream, ACT);
        torch_caching_free(&cache, act[l + 1], ACT);
        upstream = down;
    }
    torch_caching_free(&cache, upstream, ACT);
    for (int l = 0; l < LAYERS; l++) { /* clip, moments, update */
        launch_unary(grad[l], PARAM, grad[l], PARAM);
        launch_binary(grad[l], moment1[l], moment1[l], PARAM);
        launch_binary(grad[l], moment2[l], moment2[l], PARAM);
        uint64_t n = PARAM;
        void *params[] = {&weight[l], &grad[l], &moment1[l], &moment2[l], &n};
        launch(adam, params, (CUdeviceptr[]){weight[l], grad[l], moment1[l], moment2[l]}, 4);
    }
    for (int l = 0; l < LAYERS; l++) /* zero_grad */
        launch_unary(grad[l], PARAM, grad[l], PARAM);
    launch_copy(to_host, &loss, &loss_host, loss, LOSS); /* .item(): copy, then wait */
    CHECK(cuStreamSynchronize(NULL));
    torch_caching_free(&cache, loss, LOSS);
    torch_caching_free(&cache, batch, BATCH);
    return *loss_host;
}

/* ---- measurement ---- */

static double clock_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* libpump's counters so far: its record, which it maps shared, read from the file. */
static int read_pump_record(struct pump_stats *out)
{
    const char *dir = getenv("PUMP_STATS_DIR");
    if (dir == NULL || pump_torch_trace == NULL)
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/pump-%d.stats", dir, (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t got = pread(fd, out, sizeof *out, 0);
    close(fd);
    return got == (ssize_t)sizeof *out && out->magic == PUMP_STATS_MAGIC && out->version == PUMP_STATS_VERSION;
}

static void take(struct snapshot *s)
{
    s->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    s->wall_ns = clock_ns(CLOCK_MONOTONIC); /* the clock fakecuda's time model sleeps on (stats.c) */
    s->host_ns = (double)fakecuda_thread_host_ns(); /* not another thread's: pump's worker's, a stream's */
    fakecuda_get_stats(&s->driver);
    /* driver_host_ns is the entries' sum, read from the same reading: pump's worker may be
     * charged between fakecuda_get_stats and the entries (5 us apart in one CI run). */
    s->driver.driver_host_ns = 0;
    for (unsigned i = 0; i < MAX_ENTRIES && fakecuda_entry_name(i) != NULL; i++) {
        fakecuda_get_entry_cost(fakecuda_entry_name(i), &s->entries[i]);
        s->driver.driver_host_ns += s->entries[i].caller_ns + s->entries[i].worker_ns;
    }
    s->has_pump = read_pump_record(&s->pump);
}

#define DELTA(field) (((double)b->field - (double)a->field) / steps)

/* The mean per step from a to b over `steps` steps, as the members of a JSON object. */
static void print_delta(const char *name, const struct snapshot *a, const struct snapshot *b, int steps)
{
    printf("\"%s\": {\"steps\": %d, \"cpu_ns\": %.1f, \"thread_host_ns\": %.1f, \"wall_ns\": %.1f", name, steps,
           DELTA(cpu_ns), DELTA(host_ns), DELTA(wall_ns));
#define DRIVER(f) printf(", \"%s\": %.3f", #f, DELTA(driver.f))
    DRIVER(gpu_faults); DRIVER(cpu_faults); DRIVER(bytes_prefetched_h2d); DRIVER(bytes_faulted_h2d);
    DRIVER(bytes_d2h); DRIVER(launches); DRIVER(prefetch_calls); DRIVER(batch_prefetch_calls);
    DRIVER(driver_host_ns); DRIVER(driver_evictions); DRIVER(bytes_evicted_d2h); DRIVER(bytes_evicted_h2d);
    DRIVER(gpu_fault_batches); DRIVER(gpu_fault_stall_ns); DRIVER(bytes_fault_prefetched_h2d); DRIVER(bytes_h2d);
    DRIVER(bytes_d2h_all);
    DRIVER(va_lock_wait_ns); DRIVER(bytes_discarded); DRIVER(discard_races); DRIVER(bytes_lost_to_discard_races);
#undef DRIVER
    printf(", \"device_resident_bytes\": %llu", (unsigned long long)b->driver.device_resident_bytes);
    printf(", \"entries\": {");
    for (unsigned i = 0, n = 0; i < MAX_ENTRIES && fakecuda_entry_name(i) != NULL; i++) {
        if (b->entries[i].calls == a->entries[i].calls && b->entries[i].caller_ns == a->entries[i].caller_ns &&
            b->entries[i].worker_ns == a->entries[i].worker_ns)
            continue;
        printf("%s\"%s\": {\"calls\": %.3f, \"caller_ns\": %.1f, \"worker_ns\": %.1f}", n++ ? ", " : "",
               fakecuda_entry_name(i), DELTA(entries[i].calls), DELTA(entries[i].caller_ns),
               DELTA(entries[i].worker_ns));
    }
    printf("}, \"pump\": ");
    if (!a->has_pump || !b->has_pump) {
        printf("null}");
        return;
    }
#define PUMP(f) printf(", \"%s\": %.3f", #f, DELTA(pump.f))
    printf("{\"launches\": %.3f", DELTA(pump.launches));
    PUMP(launches_managed); PUMP(launches_prefetched); PUMP(prefetch_calls); PUMP(prefetch_ranges); PUMP(prefetch_bytes); PUMP(resident_skips); PUMP(budget_skips);
    PUMP(bytes_evicted); PUMP(bytes_evicted_dead); PUMP(evictions); PUMP(plan_triggers); PUMP(plan_prefetch_ranges); PUMP(plan_evict_ranges);
    PUMP(worker_jobs); PUMP(worker_takeovers); PUMP(worker_waits);
    PUMP(torch_tensor_discards); PUMP(bytes_discarded); PUMP(discards_skipped); PUMP(prefetch_discard_waits);
    PUMP(discard_drain_waits); PUMP(discards_undrained);
    PUMP(launches_planned);
#undef PUMP
    printf(", \"resident_bytes\": %llu, \"errors\": %llu}}", (unsigned long long)b->pump.resident_bytes,
           (unsigned long long)b->pump.errors);
}

int main(int argc, char **argv)
{
    int steps = argc >= 3 ? atoi(argv[1]) : 0, warmup = argc >= 3 ? atoi(argv[2]) : 0;
    size_t neighbour = 0;
    bool read_mostly = false, planned = false, step_marks = false;
    bool usage = steps < 2 || warmup < 1 || warmup >= steps;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "managed") == 0)
            cache.managed = true;
        else if (strcmp(argv[i], "read_mostly") == 0)
            read_mostly = true;
        else if (strcmp(argv[i], "planned") == 0)
            planned = true;
        else if (strcmp(argv[i], "print_launches") == 0)
            print_launches = true;
        else if (strcmp(argv[i], "dead_told_early") == 0)
            dead_told_early = true;
        else if (strcmp(argv[i], "step_marks") == 0)
            step_marks = true;
        else if (strncmp(argv[i], "neighbour=", 10) == 0 && atoi(argv[i] + 10) > 0)
            neighbour = (size_t)atoi(argv[i] + 10) * MIB;
        else
            usage = true;
    }
    if (usage) {
        fprintf(stderr, "usage: steady_step STEPS WARMUP [managed] [neighbour=MIB] [read_mostly] [planned] [print_launches] [dead_told_early] [step_marks] (1 <= WARMUP < STEPS)\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice device = cuda_api_start(&api);
    if (neighbour != 0) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
        CUmemGenericAllocationHandle held;
        CHECK(cuMemCreate(&held, neighbour, &prop, 0));
    }
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    unary = kernel(module, "unary", unary_kernel, 4);
    binary = kernel(module, "binary", binary_kernel, 4);
    adam = kernel(module, "adam", adam_kernel, 5);
    to_device = kernel(module, "to_device", to_device_kernel, 3);
    to_host = kernel(module, "to_host", to_host_kernel, 3);

    float *batch_host = malloc(BATCH), *loss_host = malloc(sizeof *loss_host);
    if (batch_host == NULL || loss_host == NULL)
        return 3;
    for (int l = 0; l < LAYERS; l++) { /* the model and optimizer, initialised on the device */
        weight[l] = torch_caching_alloc(&cache, PARAM);
        grad[l] = torch_caching_alloc(&cache, PARAM);
        moment1[l] = torch_caching_alloc(&cache, PARAM);
        moment2[l] = torch_caching_alloc(&cache, PARAM);
        launch_unary(weight[l], PARAM, weight[l], PARAM);
        launch_unary(grad[l], PARAM, grad[l], PARAM);
        launch_unary(moment1[l], PARAM, moment1[l], PARAM);
        launch_unary(moment2[l], PARAM, moment2[l], PARAM);
    }
    CHECK(cuStreamSynchronize(NULL));
    for (int l = 0; read_mostly && l < LAYERS; l++) { /* the weights, written once a step by Adam */
        CUmemLocation on = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
        CHECK(cuMemAdvise(weight[l], PARAM, CU_MEM_ADVISE_SET_READ_MOSTLY, on));
    }

    static struct snapshot start, after_first, after_warmup, end;
    uint32_t loss_bits[MAX_RECORDED];
    take(&start);
    long launches_before = launches;
    struct pump_stats record;
    planned = planned && read_pump_record(&record);
    int unplanned = 0; /* steps run before the plan's first: not counted */
    for (int s = 0; s < steps + unplanned; s++) {
        for (size_t i = 0; i < BATCH / sizeof(float); i += 1024)
            batch_host[i] = (float)(s + 1) * 0.01f;
        for (int i = 0; i < COMPUTED; i++)
            batch_host[i] = (float)(s + i) * 0.01f;
        float loss = step(batch_host, loss_host);
        if (step_marks && pump_torch_trace_step != NULL)
            pump_torch_trace_step();
        if (s < MAX_RECORDED)
            memcpy(&loss_bits[s], &loss, sizeof loss);
        if (s == 0)
            take(&after_first);
        if (planned && read_pump_record(&record) && record.plan_triggers == 0) {
            if (++unplanned > PLAN_WAIT_STEPS) {
                fprintf(stderr, "error: no launch found a trigger of pumpd's plan in %d steps\n", PLAN_WAIT_STEPS);
                return 4;
            }
            continue;
        }
        planned = false;
        if (s == unplanned + warmup - 1)
            take(&after_warmup);
    }
    take(&end);
    printf("{\"launches_per_step\": %ld, \"segments\": %d, \"segment_bytes\": %zu, \"warmup\": %d, "
           "\"unplanned_steps\": %d, ",
           (launches - launches_before) / (steps + unplanned), cache.nsegments, cache.segment_size, warmup, unplanned);
    print_delta("first", &start, &after_first, 1);
    printf(", ");
    print_delta("steady", &after_warmup, &end, steps - warmup);
    printf(", \"loss_bits\": [");
    int recorded = steps + unplanned < MAX_RECORDED ? steps + unplanned : MAX_RECORDED;
    for (int s = 0; s < recorded; s++)
        printf("%s%u", s ? ", " : "", loss_bits[s]);
    printf("]}\n");
    free(batch_host);
    free(loss_host);
    return 0;
}
