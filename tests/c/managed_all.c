/* managed_all.c: a program written for device memory, for the tests of
 * PUMP_MANAGED_ALL (tests/test_managed_all.py): cuMemAlloc, stream-ordered
 * allocations (on a normal stream, in a capture, from its own pools), memory
 * queries, cuMemCreate and IPC handles. Each mode prints one JSON line.
 *
 *   managed_all device ROUNDS       two 64 MiB cuMemAlloc buffers, ROUNDS kernels over each
 *   managed_all async               cuMemAllocAsync on a stream and in a capture; the program's own pools
 *   managed_all info                cuMemGetInfo before and after a 64 MiB cuMemAlloc
 *   managed_all fill KIND MIB       64 MiB allocations until MIB or an error; KIND: alloc (cuMemAlloc),
 *                                   async (cuMemAllocAsync), pool (the program's own managed pool)
 *   managed_all unmanageable        cuMemCreate and cuIpcGetMemHandle, twice each
 *   managed_all two KIND MIB        (FAKECUDA_DEVICES=2) MIB of 64 MiB buffers on device 0, then on
 *                                   device 1, a memory query on each; device 0's freed while device 1
 *                                   is current, and both queried again. KIND: alloc (cuMemAlloc),
 *                                   async (cuMemAllocAsync with the other device's context current)
 */
#include <string.h>

#include "cuda_api.h"

#define CHUNK ((size_t)64 << 20)

static CUdevice device;
static CUfunction inc;
static CUstream stream;

static int is_managed(CUdeviceptr p)
{
    unsigned int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    return (int)managed;
}

static void launch_inc(CUdeviceptr buffer, size_t bytes)
{
    uint64_t n = bytes / sizeof(float);
    void *params[] = {&buffer, &n};
    CHECK(cuLaunchKernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
}

/* Every float of the buffer equals `value` (read by the host, as after a copy back). */
static int all_equal(CUdeviceptr buffer, size_t bytes, float value)
{
    const float *x = (const float *)(uintptr_t)buffer;
    api.host_touch(x, bytes);
    for (size_t i = 0; i < bytes / sizeof(float); i++)
        if (x[i] != value)
            return 0;
    return 1;
}

static int mode_device(int rounds)
{
    CUdeviceptr buffer[2];
    int managed[2];
    for (int b = 0; b < 2; b++) {
        CHECK(cuMemAlloc(&buffer[b], CHUNK));
        managed[b] = is_managed(buffer[b]);
        float *x = (float *)(uintptr_t)buffer[b];
        api.host_touch(x, CHUNK);
        for (size_t i = 0; i < CHUNK / sizeof(float); i++)
            x[i] = (float)((i + (size_t)b) % 7);
    }
    api.reset_stats();
    for (int r = 0; r < rounds; r++)
        for (int b = 0; b < 2; b++)
            launch_inc(buffer[b], CHUNK);
    CHECK(cuCtxSynchronize());
    struct fakecuda_stats s;
    api.get_stats(&s);
    double checksum = 0;
    for (int b = 0; b < 2; b++) {
        const float *x = (const float *)(uintptr_t)buffer[b];
        api.host_touch(x, CHUNK);
        for (size_t i = 0; i < CHUNK / sizeof(float); i++)
            checksum += (double)x[i] * (double)(b + 1);
        CHECK(cuMemFree(buffer[b]));
    }
    printf("{\"managed\": [%d, %d], \"checksum\": %.1f, \"gpu_faults\": %llu, \"kernels_run\": %llu}\n", managed[0],
           managed[1], checksum, (unsigned long long)s.gpu_faults, (unsigned long long)s.kernels_run);
    return 0;
}

static CUmemoryPool create_pool(CUmemAllocationType type)
{
    CUmemPoolProps props = {.allocType = type, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    return pool;
}

static int mode_async(void)
{
    const size_t bytes = (size_t)8 << 20;
    CUdeviceptr a;
    CHECK(cuMemAllocAsync(&a, bytes, stream));
    int managed = is_managed(a);
    launch_inc(a, bytes);  /* the memory is zero, as fakecuda maps it */
    CHECK(cuStreamSynchronize(stream));
    int values_ok = all_equal(a, bytes, 1.0f);
    CHECK(cuMemFreeAsync(a, stream));
    CHECK(cuStreamSynchronize(stream));

    /* In a capture the allocation becomes the graph's: it stays as asked. */
    CUdeviceptr captured;
    CUgraph graph;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocAsync(&captured, 4096, stream));
    int captured_managed = is_managed(captured);
    CHECK(cuMemFreeAsync(captured, stream));
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphDestroy(graph));

    /* The program's own managed pool, and its own pool made the device's current one. */
    CUmemoryPool own_managed = create_pool(CU_MEM_ALLOCATION_TYPE_MANAGED);
    CUdeviceptr from_own;
    CHECK(cuMemAllocFromPoolAsync(&from_own, bytes, own_managed, stream));
    int own_pool_managed = is_managed(from_own);
    CHECK(cuMemFreeAsync(from_own, stream));
    CUmemoryPool chosen = create_pool(CU_MEM_ALLOCATION_TYPE_PINNED);
    CHECK(cuDeviceSetMemPool(device, chosen));
    CUdeviceptr from_chosen;
    CHECK(cuMemAllocAsync(&from_chosen, 4096, stream));
    int chosen_pool_managed = is_managed(from_chosen);
    CHECK(cuMemFreeAsync(from_chosen, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolDestroy(chosen));
    CHECK(cuMemPoolDestroy(own_managed));
    printf("{\"managed\": %d, \"values_ok\": %d, \"captured_managed\": %d, \"own_pool_managed\": %d, "
           "\"chosen_pool_managed\": %d}\n",
           managed, values_ok, captured_managed, own_pool_managed, chosen_pool_managed);
    return 0;
}

static int mode_info(void)
{
    size_t free0, total0, free1, total1;
    CHECK(cuMemGetInfo(&free0, &total0));
    CUdeviceptr a;
    CHECK(cuMemAlloc(&a, CHUNK));
    CHECK(cuMemGetInfo(&free1, &total1));
    CHECK(cuMemFree(a));
    printf("{\"free0\": %zu, \"total0\": %zu, \"free1\": %zu, \"total1\": %zu}\n", free0, total0, free1, total1);
    return 0;
}

static int mode_fill(const char *kind, size_t mib)
{
    CUmemoryPool pool = strcmp(kind, "pool") == 0 ? create_pool(CU_MEM_ALLOCATION_TYPE_MANAGED) : NULL;
    if (pool == NULL && strcmp(kind, "alloc") != 0 && strcmp(kind, "async") != 0) {
        fprintf(stderr, "managed_all: fill KIND is alloc, async or pool, not %s\n", kind);
        return 2;
    }
    enum { MAX_CHUNKS = 256 };
    CUdeviceptr chunk[MAX_CHUNKS];
    size_t count = 0;
    CUresult r = CUDA_SUCCESS;
    while (count < MAX_CHUNKS && (count + 1) * (CHUNK >> 20) <= mib) {
        r = pool != NULL             ? cuMemAllocFromPoolAsync(&chunk[count], CHUNK, pool, stream)
            : strcmp(kind, "async") == 0 ? cuMemAllocAsync(&chunk[count], CHUNK, stream)
                                         : cuMemAlloc(&chunk[count], CHUNK);
        if (r != CUDA_SUCCESS)
            break;
        count++;
    }
    for (size_t i = 0; i < count; i++)
        CHECK(strcmp(kind, "alloc") == 0 ? cuMemFree(chunk[i]) : cuMemFreeAsync(chunk[i], stream));
    CHECK(cuStreamSynchronize(stream));
    if (pool != NULL)
        CHECK(cuMemPoolDestroy(pool));
    printf("{\"allocated_mib\": %zu, \"result\": %d}\n", count * (CHUNK >> 20), (int)r);
    return 0;
}

static int mode_unmanageable(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    int vmm[2], ipc[2];
    for (int i = 0; i < 2; i++) {
        CUmemGenericAllocationHandle handle;
        vmm[i] = (int)cuMemCreate(&handle, (size_t)2 << 20, &prop, 0);
        if (vmm[i] == CUDA_SUCCESS)
            CHECK(cuMemRelease(handle));
    }
    CUdeviceptr shared;
    CHECK(cuMemAlloc(&shared, CHUNK));
    for (int i = 0; i < 2; i++) {
        CUipcMemHandle handle;
        ipc[i] = (int)cuIpcGetMemHandle(&handle, shared);
    }
    CHECK(cuMemFree(shared));
    printf("{\"vmm\": [%d, %d], \"ipc\": [%d, %d]}\n", vmm[0], vmm[1], ipc[0], ipc[1]);
    return 0;
}

/* A process that uses two GPUs (DataParallel, device_map="auto") fills each. KIND alloc:
 * cuMemAlloc with the device's context current; async: cuMemAllocAsync on a stream of the
 * device's context while the other device's context is current (the memory is the stream's
 * device's), freed the same way. */
static int mode_two(const char *kind, size_t mib)
{
    enum { MAX_CHUNKS = 16 };
    int async = strcmp(kind, "async") == 0;
    if (!async && strcmp(kind, "alloc") != 0) {
        fprintf(stderr, "managed_all: two KIND is alloc or async, not %s\n", kind);
        return 2;
    }
    CUcontext ctx[2];
    CUstream streams[2];
    CUdeviceptr chunk[2][MAX_CHUNKS];
    size_t count[2] = {0, 0}, free_mib[2], total_mib[2], free_after_mib[2], free_bytes, total_bytes;
    CUresult r[2] = {CUDA_SUCCESS, CUDA_SUCCESS};
    for (int d = 0; d < 2; d++) {
        CUdevice dev;
        CHECK(cuDeviceGet(&dev, d));
        CHECK(cuDevicePrimaryCtxRetain(&ctx[d], dev));
        CHECK(cuCtxSetCurrent(ctx[d]));
        CHECK(cuStreamCreate(&streams[d], CU_STREAM_NON_BLOCKING));
    }
    for (int d = 0; d < 2; d++) {
        CHECK(cuCtxSetCurrent(ctx[async ? 1 - d : d]));
        while (count[d] < MAX_CHUNKS && (count[d] + 1) * (CHUNK >> 20) <= mib) {
            CUdeviceptr *next = &chunk[d][count[d]];
            r[d] = async ? cuMemAllocAsync(next, CHUNK, streams[d]) : cuMemAlloc(next, CHUNK);
            if (r[d] != CUDA_SUCCESS)
                break;
            count[d]++;
        }
        if (d == 0) {  /* resident on device 0: a cap of device 1 taken from device 0's free memory would show */
            for (size_t i = 0; i < count[0]; i++)
                launch_inc(chunk[0][i], CHUNK);
            CHECK(cuStreamSynchronize(stream));
        }
        CHECK(cuCtxSetCurrent(ctx[d]));
        CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
        free_mib[d] = free_bytes >> 20;
        total_mib[d] = total_bytes >> 20;
    }
    /* device 1 is current: the memory is device 0's */
    for (size_t i = 0; i < count[0]; i++)
        CHECK(async ? cuMemFreeAsync(chunk[0][i], streams[0]) : cuMemFree(chunk[0][i]));
    CHECK(cuStreamSynchronize(streams[0]));
    for (int d = 1; d >= 0; d--) {
        CHECK(cuCtxSetCurrent(ctx[d]));
        CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
        free_after_mib[d] = free_bytes >> 20;
    }
    for (size_t i = 0; i < count[1]; i++)
        CHECK(async ? cuMemFreeAsync(chunk[1][i], streams[1]) : cuMemFree(chunk[1][i]));
    CHECK(cuStreamSynchronize(streams[1]));
    printf("{\"allocated_mib\": [%zu, %zu], \"result\": [%d, %d], \"free_mib\": [%zu, %zu], \"total_mib\": [%zu, %zu], "
           "\"free_after_mib\": [%zu, %zu]}\n",
           count[0] * (CHUNK >> 20), count[1] * (CHUNK >> 20), (int)r[0], (int)r[1], free_mib[0], free_mib[1],
           total_mib[0], total_mib[1], free_after_mib[0], free_after_mib[1]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: managed_all device ROUNDS | async | info | fill KIND MIB | unmanageable | two KIND MIB\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    device = cuda_api_start(&api);
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    if (api.register_kernel("inc", inc_kernel, 2, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&inc, module, "inc"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const char *mode = argv[1];
    if (strcmp(mode, "device") == 0 && argc == 3)
        return mode_device(atoi(argv[2]));
    if (strcmp(mode, "async") == 0)
        return mode_async();
    if (strcmp(mode, "info") == 0)
        return mode_info();
    if (strcmp(mode, "fill") == 0 && argc == 4)
        return mode_fill(argv[2], (size_t)atol(argv[3]));
    if (strcmp(mode, "unmanageable") == 0)
        return mode_unmanageable();
    if (strcmp(mode, "two") == 0 && argc == 4)
        return mode_two(argv[2], (size_t)atol(argv[3]));
    fprintf(stderr, "managed_all: unknown mode %s (or its arguments)\n", mode);
    return 2;
}
