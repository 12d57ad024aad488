/* carve_race.c: why it exists: a caching allocator's memory handed out again in other
 * extents on one thread while another launches kernels over it, under a budget: PyTorch's
 * allocator splits and merges its blocks on whichever thread allocates (the Python thread, the
 * autograd thread) while the other launches. Each tensor carved over freed ones replaces their
 * records and takes over their residency (shim/lookup/ranges.c replace_locked, residency_blocks.c
 * pump_blocks_replace), under the range table's writer lock and the residency shape lock, while
 * the launch rule decides under the residency locks and evicts to hold the budget. The real
 * client (tests/test_real_client*.py) cannot hold such a race to a sanitizer run; this program
 * runs plain, under ASan+UBSan and under TSan (tests/test_residency.py).
 *
 *   carve_race ROUNDS
 *
 * One 16 MiB managed segment. The carving thread cuts it into 1 MiB slots and, ROUNDS times
 * over every slot, reports to libpump's bridge (pump_torch_trace) a tensor at a pseudo-random
 * extent inside a free slot or spanning two free neighbours, or the free of a live one, one
 * change per launch made (it keeps pace, not step). The launching thread launches ROUNDS x 16
 * kernels, each reading a tensor live when it was picked
 * (the carver may free it and carve its memory anew before the launch: the scan then finds
 * what is there) and counting itself in a ledger of its own (another managed allocation),
 * synchronising every 32 launches. Only the ledger is written: the checksum is the bare run's
 * whatever the interleaving. Prints {"checksum": C, "gpu_faults": N}. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "cuda_api.h"
#include "torch_caching.h"

#define SEGMENT ((size_t)16 << 20)
#define SLOTS 16
#define SLOT (SEGMENT / SLOTS)

static CUcontext context;
static CUdeviceptr segment, ledger;
static CUfunction read_and_count;
static int rounds;
static atomic_int launched;  /* the carver keeps pace with the launches: one change each */

/* The live tensors, which the carver changes and the launcher picks from. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { CUdeviceptr p; size_t bytes; int slots; } live[SLOTS];
static int owner[SLOTS];  /* the slot whose tensor holds each slot, -1: free */

#define LEDGER 64

static uint64_t next(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

static void report(int event, CUdeviceptr p, size_t bytes)
{
    if (pump_torch_trace != NULL)
        pump_torch_trace(event, p, bytes, 0, NULL);
}

/* Reads (tensor, n floats) and adds 1 to ledger[k]. */
static void read_and_count_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *tensor = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    float *counts = arg_floats(params, 2);
    uint64_t k = arg_u64(params, 3);
    if (n > 0)
        api.touch(tensor, n * sizeof *tensor);
    api.touch(&counts[k], sizeof *counts);
    counts[k] += 1.0f;
}

static void *carve(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    uint64_t state = 7;
    for (int i = 0; i < rounds * SLOTS; i++) {
        while (atomic_load(&launched) < i)
            sched_yield();
        int s = (int)(next(&state) % SLOTS);
        pthread_mutex_lock(&table_lock);
        if (owner[s] >= 0) {  /* its tensor is freed */
            int t = owner[s];
            report(PUMP_TORCH_TENSOR_FREE, live[t].p, live[t].bytes);
            for (int k = 0; k < live[t].slots; k++)
                owner[t + k] = -1;
        } else {
            int slots = s + 1 < SLOTS && owner[s + 1] < 0 && next(&state) % 3 == 0 ? 2 : 1;
            size_t room = (size_t)slots * SLOT;
            size_t start = next(&state) % (room / 512) * 512;
            size_t bytes = 512 + next(&state) % ((room - start) / 512) * 512;
            live[s].p = segment + s * SLOT + start;
            live[s].bytes = bytes;
            live[s].slots = slots;
            for (int k = 0; k < slots; k++)
                owner[s + k] = s;
            report(PUMP_TORCH_TENSOR_ALLOC, live[s].p, bytes);
        }
        pthread_mutex_unlock(&table_lock);
    }
    pthread_mutex_lock(&table_lock);
    for (int s = 0; s < SLOTS; s++)
        if (owner[s] == s)
            report(PUMP_TORCH_TENSOR_FREE, live[s].p, live[s].bytes);
    pthread_mutex_unlock(&table_lock);
    return NULL;
}

/* A tensor live now (a whole slot's start if none is), picked by `pick`. */
static void pick_tensor(uint64_t pick, CUdeviceptr *p, uint64_t *n)
{
    pthread_mutex_lock(&table_lock);
    int s = (int)(pick % SLOTS), found = -1;
    for (int k = 0; k < SLOTS && found < 0; k++)
        if (owner[(s + k) % SLOTS] == (s + k) % SLOTS)
            found = (s + k) % SLOTS;
    *p = found >= 0 ? live[found].p : ledger;
    *n = found >= 0 ? live[found].bytes / sizeof(float) : 0;
    pthread_mutex_unlock(&table_lock);
}

int main(int argc, char **argv)
{
    rounds = argc == 2 ? atoi(argv[1]) : 0;
    if (rounds < 1 || rounds > 100000) {
        fprintf(stderr, "usage: carve_race ROUNDS (1..100000)\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice dev = cuda_api_start(&api);
    CHECK(api.primary_ctx_retain(&context, dev));
    CHECK(api.ctx_set_current(context));
    const size_t sizes[] = {8, 8, 8, 8}, aligns[] = {8, 8, 8, 8};
    if (api.register_kernel("read_and_count", read_and_count_kernel, 4, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&read_and_count, module, "read_and_count"));
    CHECK(api.mem_alloc_managed(&segment, SEGMENT, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&ledger, LEDGER * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    api.host_touch((void *)(uintptr_t)ledger, LEDGER * sizeof(float));
    memset((void *)(uintptr_t)ledger, 0, LEDGER * sizeof(float));
    memset(owner, -1, sizeof owner);

    pthread_t carver;
    if (pthread_create(&carver, NULL, carve, NULL) != 0) {
        fprintf(stderr, "error: pthread_create\n");
        return 3;
    }
    uint64_t state = 11;
    for (int i = 0; i < rounds * SLOTS; i++) {
        CUdeviceptr p;
        uint64_t n, k = (uint64_t)i % LEDGER;
        pick_tensor(next(&state), &p, &n);
        void *params[] = {&p, &n, &ledger, &k};
        CHECK(cuLaunchKernel(read_and_count, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        atomic_store(&launched, i + 1);
        if (i % 32 == 31)
            CHECK(cuCtxSynchronize());
    }
    CHECK(cuCtxSynchronize());
    pthread_join(carver, NULL);

    const float *counts = (const float *)(uintptr_t)ledger;
    api.host_touch(counts, LEDGER * sizeof(float));
    double checksum = 0;
    for (int k = 0; k < LEDGER; k++)
        checksum += (double)counts[k] * (k + 1);
    CHECK(api.mem_free(ledger));
    CHECK(api.mem_free(segment));
    struct fakecuda_stats st;
    api.get_stats(&st);
    printf("{\"checksum\": %.1f, \"gpu_faults\": %llu}\n", checksum, (unsigned long long)st.gpu_faults);
    return 0;
}
