/* passed_discard.c: a tensor of PyTorch's caching allocator freed on a device the job's memory
 * exceeds, discarded once the GPU has passed its free, and its memory handed out again at once
 * and written by the host once its stream is synchronised (tests/test_passed_discards.py): the
 * discard must come before, or its drop lands on the write. One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): values (real kernels are
 * no-ops on fakecuda), a discard still running when the program's stream says it is done, the
 * sanitizer builds.
 *
 *   passed_discard ROUNDS
 *
 * Managed segments (the caching allocator over cuMemAllocManaged), on the legacy stream: two
 * 24 MiB ballast tensors and a 16 MiB one, each filled by a kernel every round, over a 64 MiB
 * device (FAKECUDA_DEVICE_MEMORY), so that pump's launch rule evicts there. Per round the 16 MiB
 * tensor is filled and freed, the stream synchronised (the GPU has passed the free), a 2 MiB
 * tensor allocated (its hook makes the discard: passed_discards.h), and the 16 MiB asked for
 * again: the same memory. Once its stream is synchronised the host writes the round's value into
 * its last 64 KiB (fakecuda's discard drops a run's pages in address order: the end comes last),
 * and reads them back after every stream is done: every word the round's value, or the
 * tensor's stream did not wait for the discard.
 */
#include <string.h>

#include "torch_program.h"

#define BALLAST ((size_t)24 << 20)
#define DEAD ((size_t)16 << 20)
#define SMALL ((size_t)2 << 20)
#define TAIL ((size_t)64 << 10) /* what the host writes: the end, which a discard's drop reaches last */
#define SEGMENT ((size_t)96 << 20)
#define MAX_ROUNDS 64

static struct torch_caching cache = {.segment_size = SEGMENT, .managed = true, .report = true};
static CUfunction fill;

/* p[i] = value for every 1024th word of (p, n words, value). */
static void fill_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    uint32_t *p = *(uint32_t **)params[0];
    uint64_t n = *(uint64_t *)params[1];
    uint32_t value = *(uint32_t *)params[2];
    api.touch(p, n * sizeof *p);
    for (uint64_t i = 0; i < n; i += 1024)
        p[i] = value;
}

static void fill_tensor(CUdeviceptr p, size_t bytes, uint32_t value)
{
    uint64_t n = bytes / sizeof(uint32_t);
    void *params[] = {&p, &n, &value};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
}

int main(int argc, char **argv)
{
    int rounds = argc == 2 ? atoi(argv[1]) : 0;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: passed_discard ROUNDS(1..%d)\n", MAX_ROUNDS);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    const size_t sizes[] = {8, 8, 4}, aligns[] = {8, 8, 4};
    if (api.register_kernel("fill", fill_kernel, 3, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CHECK(cuModuleGetFunction(&fill, module, "fill"));
    CUdeviceptr ballast[2] = {torch_caching_alloc(&cache, BALLAST), torch_caching_alloc(&cache, BALLAST)};
    uint64_t wrong = 0;
    for (int r = 0; r < rounds; r++) {
        fill_tensor(ballast[0], BALLAST, 1);
        fill_tensor(ballast[1], BALLAST, 2);
        CUdeviceptr dead = torch_caching_alloc(&cache, DEAD);
        fill_tensor(dead, DEAD, 3);
        torch_caching_free(&cache, dead, DEAD);
        CHECK(cuStreamSynchronize(NULL));
        CUdeviceptr small = torch_caching_alloc(&cache, SMALL);
        CUdeviceptr again = torch_caching_alloc(&cache, DEAD);
        if (again != dead) {
            fprintf(stderr, "error: the caching allocator handed out other memory\n");
            return 3;
        }
        uint32_t value = 100 + (uint32_t)r;
        CHECK(cuStreamSynchronize(NULL));  /* the tensor's stream done: the host may write it */
        uint32_t *tail = (uint32_t *)(uintptr_t)(again + DEAD - TAIL);
        for (size_t i = 0; i < TAIL / sizeof(uint32_t); i++)
            tail[i] = value;
        CHECK(cuCtxSynchronize());  /* every stream, pump's too: a discard not waited for has landed */
        api.host_touch(tail, TAIL);
        for (size_t i = 0; i < TAIL / sizeof(uint32_t); i++)
            wrong += tail[i] != value;
        torch_caching_free(&cache, again, DEAD);
        torch_caching_free(&cache, small, SMALL);
    }
    struct fakecuda_stats st;
    api.get_stats(&st);
    printf("{\"wrong_words\": %llu, \"bytes_discarded\": %llu, \"discard_races\": %llu}\n",
           (unsigned long long)wrong, (unsigned long long)st.bytes_discarded, (unsigned long long)st.discard_races);
    return 0;
}
