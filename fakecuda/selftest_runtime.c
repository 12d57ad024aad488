/* selftest_runtime.c: why it exists: fakecuda's self-test of what the CUDA runtime and its
 * libraries need beyond the driver API pump uses (issue 26), in a child process of its own with
 * FAKECUDA_PERSONA=h100-sxm-80gb (selftest.c runs it): the persona's answers, export tables
 * (context-local storage and its destructors, an unmodelled slot and an unknown id counted), the
 * context queries and limits, peer access, function attributes and occupancy, stream memory
 * operations in stream order, 2D copies, cuLink*'s refusals, cuPointerGetAttributes and
 * page-locked host memory. The
 * table sizes and the integrity check are checked against the real drivers and recomputed in
 * tests/test_export_tables.py. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"
#include "selftest.h"

typedef CUresult (*cls_put_fn)(CUcontext, void *, void *, void (*)(CUcontext, void *, void *));
typedef CUresult (*cls_get_fn)(void **, CUcontext, void *);
typedef CUresult (*cls_delete_fn)(CUcontext, void *);

static const CUuuid CLS = {{(char)0xc6, (char)0x93, 0x33, 0x6e, 0x11, 0x21, (char)0xdf, 0x11, (char)0xa8, (char)0xc3,
                            0x68, (char)0xf3, 0x55, (char)0xd8, (char)0x95, (char)0x93}};
static const CUuuid TOOLS_TLS = {{0x42, (char)0xd8, 0x5a, (char)0x81, 0x23, (char)0xf6, (char)0xcb, 0x47, (char)0x82,
                                  (char)0x98, (char)0xf6, (char)0xe7, (char)0x8a, 0x3a, (char)0xec, (char)0xdc}};
static const CUuuid CUDART = {{0x6b, (char)0xd5, (char)0xfb, 0x6c, 0x5b, (char)0xf4, (char)0xe7, 0x4a, (char)0x89,
                               (char)0x87, (char)0xd9, 0x39, 0x12, (char)0xfd, (char)0x9d, (char)0xf9}};

static int dtor_calls;
static void *dtor_value;
static void cls_dtor(CUcontext c, void *key, void *value)
{
    (void)c; (void)key;
    dtor_calls++;
    dtor_value = value;
}

static void tables(CUcontext ctx)
{
    const void *t = NULL;
    OK(cuGetExportTable(&t, &CLS));
    void *const *slots = t;
    cls_put_fn put = (cls_put_fn)slots[0];
    cls_delete_fn del = (cls_delete_fn)slots[1];
    cls_get_fn get = (cls_get_fn)slots[2];
    CHECK(slots[3] == NULL, "context-local storage ends with NULL");
    int key1, key2;
    void *v = NULL;
    CHECK(get(&v, ctx, &key1) == CUDA_ERROR_INVALID_HANDLE, "an absent key");
    OK(put(ctx, &key1, (void *)0x1234, NULL));
    OK(get(&v, NULL, &key1)); /* NULL: the current context */
    CHECK(v == (void *)0x1234, "get what was put");
    OK(del(ctx, &key1));
    CHECK(get(&v, ctx, &key1) == CUDA_ERROR_INVALID_HANDLE, "deleted");
    OK(put(ctx, &key2, (void *)0x5678, cls_dtor));
    OK(cuDevicePrimaryCtxReset(0));
    CHECK(dtor_calls == 1 && dtor_value == (void *)0x5678, "the destructor ran at the reset (%d)", dtor_calls);
    CHECK(get(&v, ctx, &key2) == CUDA_ERROR_INVALID_HANDLE, "entries go with the reset");

    /* An unmodelled slot is counted and refused; so is an unknown id. */
    uint64_t slots_before = fakecuda_not_found_count(2), ids_before = fakecuda_not_found_count(1);
    OK(cuGetExportTable(&t, &CUDART));
    CHECK(((CUresult(*)(void))((void *const *)t)[3])() == CUDA_ERROR_NOT_SUPPORTED, "unmodelled slot refused");
    CHECK(fakecuda_not_found_count(2) == slots_before + 1, "and counted");
    CUuuid unknown = {{1, 2, 3}};
    t = (const void *)1;
    CHECK(cuGetExportTable(&t, &unknown) == CUDA_ERROR_INVALID_VALUE && t == NULL, "unknown id refused");
    CHECK(fakecuda_not_found_count(1) == ids_before + 1, "and counted");
}

static void persona(void)
{
    char name[64];
    int v;
    size_t total;
    OK(cuDeviceGetName(name, sizeof name, 0));
    CHECK(strcmp(name, "NVIDIA H100 80GB HBM3") == 0, "name %s", name);
    OK(cuDeviceTotalMem(&total, 0));
    CHECK(total == 85017755648ull, "total %zu", total);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 0));
    CHECK(v == 52428800, "L2 %d", v);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0));
    CHECK(v == 2, "PCI bus %d", v);
    OK(cuDeviceGetPCIBusId(name, sizeof name, 0));
    CHECK(strcmp(name, "0000:02:00.0") == 0, "PCI bus id %s", name);
}

static void context_queries(CUcontext ctx)
{
    int least = 1, greatest = 1, can = 1;
    OK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CHECK(least == 0 && greatest == -5, "priority range %d %d", least, greatest);
    size_t value = 0;
    OK(cuCtxGetLimit(&value, CU_LIMIT_STACK_SIZE));
    CHECK(value == 1024, "stack %zu", value);
    OK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 16u << 20));
    OK(cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE));
    CHECK(value == 16u << 20, "heap %zu", value);
    CHECK(cuCtxSetLimit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 3) == CUDA_ERROR_INVALID_VALUE, "granularity 3");
    CHECK(cuCtxGetLimit(&value, CU_LIMIT_MAX) == CUDA_ERROR_UNSUPPORTED_LIMIT, "an unknown limit");
    unsigned api = 0;
    OK(cuCtxGetApiVersion(NULL, &api));
    CHECK(api == 3020, "the current context's API version %u", api);
    OK(cuCtxGetApiVersion(ctx, &api));
    CHECK(cuCtxGetApiVersion(ctx, NULL) == CUDA_ERROR_INVALID_VALUE, "no version pointer");
    value = 7;
    OK(cuCtxGetLimit(&value, CU_LIMIT_CIG_ENABLED));
    CHECK(value == 0, "not a CIG context (%zu)", value);
    CHECK(cuCtxSetLimit(CU_LIMIT_CIG_ENABLED, 1) == CUDA_ERROR_INVALID_VALUE, "CIG_ENABLED is query-only");
    OK(cuDeviceCanAccessPeer(&can, 0, 0));
    CHECK(can == 0, "a device is not its own peer");
    CHECK(cuCtxEnablePeerAccess(ctx, 0) == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access to itself");
    CHECK(cuCtxDisablePeerAccess(ctx) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "disable what was never enabled");
}

/* Clusters on the H100: 8 portable, 16 once non-portable sizes are allowed, the required size
 * where one is set; the number of clusters is the resident blocks over the size. */
static void clusters(CUfunction f)
{
    CUlaunchAttribute dim = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, .value.clusterDim = {4, 1, 1}};
    CUlaunchConfig c = {.gridDimX = 132, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256, .blockDimY = 1,
                        .blockDimZ = 1, .attrs = &dim, .numAttrs = 1};
    int size = 0, n = 0;
    OK(cuOccupancyMaxPotentialClusterSize(&size, f, &c));
    CHECK(size == 8, "portable cluster size %d", size);
    OK(cuOccupancyMaxActiveClusters(&n, f, &c));
    CHECK(n == 8 * 132 / 4, "clusters of 4 blocks of 256: %d", n);
    dim.value.clusterDim.x = 16;
    CHECK(cuOccupancyMaxActiveClusters(&n, f, &c) == CUDA_ERROR_INVALID_CLUSTER_SIZE, "16 is not portable");
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    OK(cuOccupancyMaxPotentialClusterSize(&size, f, &c));
    CHECK(size == 16, "non-portable cluster size %d", size);
    OK(cuOccupancyMaxActiveClusters(&n, f, &c));
    CHECK(n == 8 * 132 / 16, "clusters of 16: %d", n);
    c.numAttrs = 0;
    CHECK(cuOccupancyMaxActiveClusters(&n, f, &c) == CUDA_ERROR_INVALID_CLUSTER_SIZE, "no cluster size at all");
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 2));
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, 1));
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH, 1));
    OK(cuOccupancyMaxPotentialClusterSize(&size, f, &c));
    CHECK(size == 2, "the required size %d", size);
    OK(cuOccupancyMaxActiveClusters(&n, f, &c));
    CHECK(n == 8 * 132 / 2, "the required size's clusters: %d", n);
    c.numAttrs = 1;
    CHECK(cuOccupancyMaxActiveClusters(&n, f, &c) == CUDA_ERROR_INVALID_CLUSTER_SIZE, "16 is not the required 2");
    CHECK(cuOccupancyMaxPotentialClusterSize(&size, f, NULL) == CUDA_ERROR_INVALID_VALUE, "no config");
}

static void attributes(void)
{
    size_t sz[1] = {8}, al[1] = {8};
    CHECK(fakecuda_register_noop_kernel("occupancy", 1, sz, al) == 0, "register");
    CUmodule m;
    CUfunction f;
    OK(cuModuleLoadData(&m, "x"));
    OK(cuModuleGetFunction(&f, m, "occupancy"));
    int v = 0, n = 0, grid = 0, block = 0;
    OK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f));
    CHECK(v == 90, "binary version %d", v);
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 232448));
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 232449) == CUDA_ERROR_INVALID_VALUE,
          "past the opt-in limit");
    OK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
    CHECK(v == 232448, "set %d", v);
    /* 256 threads: 2048 / 256 = 8 by threads, 65536 / (256 * 32) = 8 by registers. */
    OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 256, 0));
    CHECK(n == 8, "256 threads: %d blocks", n);
    /* 64 threads, 100 KB each: 233472 / (102400 + 1024 reserved) = 2 by shared memory. */
    OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, 64, 102400));
    CHECK(n == 2, "100 KB blocks: %d", n);
    OK(cuOccupancyMaxPotentialBlockSize(&grid, &block, f, NULL, 0, 0));
    CHECK(block == 1024 && grid == 2 * 132, "potential %d x %d", grid, block);
    clusters(f);
    OK(cuModuleUnload(m));
}

static void stream_ops(CUstream s)
{
    CUdeviceptr flag, out, grid2d;
    OK(cuMemAlloc(&flag, 8));
    OK(cuMemAlloc(&out, 8));
    *(volatile uint32_t *)(uintptr_t)flag = 0;
    *(volatile uint32_t *)(uintptr_t)out = 0;
    OK(cuStreamWaitValue32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cuStreamWriteValue32(s, out, 7, 0));
    usleep(50000); /* time for the worker to get past the wait, were it not holding */
    CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY, "the wait holds the stream");
    CHECK(*(volatile uint32_t *)(uintptr_t)out == 0, "the write waits behind it");
    __atomic_store_n((uint32_t *)(uintptr_t)flag, 1, __ATOMIC_RELEASE);
    OK(cuStreamSynchronize(s));
    CHECK(*(volatile uint32_t *)(uintptr_t)out == 7, "written once the wait held");
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = out;
    op.writeValue.value = 9;
    OK(cuStreamBatchMemOp(s, 1, &op, 0));
    OK(cuStreamSynchronize(s));
    CHECK(*(volatile uint32_t *)(uintptr_t)out == 9, "batch write");
    CHECK(cuStreamWriteValue32(s, out + 1, 1, 0) == CUDA_ERROR_INVALID_VALUE, "misaligned");
    uint32_t host = 0;
    CHECK(cuStreamWriteValue32(s, (CUdeviceptr)(uintptr_t)&host, 1, 0) == CUDA_ERROR_INVALID_VALUE, "host memory");

    /* 3 rows of 8 bytes from a packed host buffer into rows 16 bytes apart. */
    OK(cuMemAlloc(&grid2d, 64));
    memset((void *)(uintptr_t)grid2d, 0, 64);
    char src[24];
    for (int i = 0; i < 24; i++) src[i] = (char)(i + 1);
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = src;
    c.srcPitch = 8;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = grid2d;
    c.dstPitch = 16;
    c.WidthInBytes = 8;
    c.Height = 3;
    OK(cuMemcpy2DAsync(&c, s));
    OK(cuStreamSynchronize(s));
    const char *d = (const char *)(uintptr_t)grid2d;
    CHECK(d[0] == 1 && d[7] == 8 && d[8] == 0 && d[16] == 9 && d[39] == 24, "2D rows");
    c.dstPitch = 4;
    CHECK(cuMemcpy2DAsync(&c, s) == CUDA_ERROR_INVALID_VALUE, "a row wider than its pitch");

    /* cuPointerGetAttributes: plain memory, and a pointer that is not CUDA's (zeroed, success). */
    unsigned type = 0;
    int ordinal = -1;
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[2] = {&type, &ordinal};
    OK(cuPointerGetAttributes(2, attrs, data, out));
    CHECK(type == CU_MEMORYTYPE_DEVICE && ordinal == 0, "plain memory's attributes");
    OK(cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)&host));
    CHECK(type == 0 && ordinal == 0, "not CUDA's: zeroed");
    OK(cuMemFree(flag));
    OK(cuMemFree(out));
    OK(cuMemFree(grid2d));
}

static void host_memory(void)
{
    void *p = NULL, *q = NULL;
    CUdeviceptr d = 0;
    unsigned flags = 0, type = 0;
    CHECK(cuMemHostAlloc(&p, 4096, 0x80) == CUDA_ERROR_INVALID_VALUE, "an unknown flag");
    OK(cuMemHostAlloc(&p, 1 << 20, CU_MEMHOSTALLOC_PORTABLE));
    OK(cuMemHostGetFlags(&flags, (char *)p + 100));
    CHECK(flags == CU_MEMHOSTALLOC_PORTABLE, "flags %u", flags);
    OK(cuMemHostGetDevicePointer(&d, (char *)p + 64, 0));
    CHECK(d == (CUdeviceptr)(uintptr_t)p + 64, "unified addressing: the same address");
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p));
    CHECK(type == CU_MEMORYTYPE_HOST, "pinned memory's type is the host's (%u)", type);
    CHECK(cuMemFreeHost((char *)p + 4096) == CUDA_ERROR_INVALID_VALUE, "free inside, not at the base");
    CHECK(cuMemHostRegister((char *)p + 4096, 4096, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "overlap");
    OK(cuMemFreeHost(p));
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) ==
              CUDA_ERROR_INVALID_VALUE, "freed");
    static char buf[8192];
    OK(cuMemHostRegister(buf, sizeof buf, CU_MEMHOSTREGISTER_PORTABLE));
    OK(cuMemAllocHost(&q, 64));
    CHECK(cuMemHostUnregister(q) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "allocated, not registered");
    OK(cuMemHostUnregister(buf));
    CHECK(cuMemHostUnregister(buf) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "twice");
    OK(cuMemFreeHost(q));
}

static void link_refusals(void)
{
    CUlinkState st;
    char ptx[] = ".version 8.0";
    OK(cuLinkCreate(0, NULL, NULL, &st));
    CHECK(cuLinkAddData(st, CU_JIT_INPUT_PTX, ptx, sizeof ptx, "a.ptx", 0, NULL, NULL) ==
              CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX needs the JIT");
    CHECK(cuLinkAddData(st, CU_JIT_INPUT_CUBIN, ptx, sizeof ptx, "a.cubin", 0, NULL, NULL) == CUDA_ERROR_NOT_SUPPORTED,
          "linking is not modelled");
    void *cubin;
    size_t size;
    CHECK(cuLinkComplete(st, &cubin, &size) == CUDA_ERROR_NOT_SUPPORTED, "nothing to complete");
    OK(cuLinkDestroy(st));
}

int selftest_child_runtime(void)
{
    const void *t = NULL;
    OK(cuGetExportTable(&t, &TOOLS_TLS)); /* before cuInit, as the drivers answer */
    uint64_t id = 1;
    CHECK(((CUresult(*)(uint64_t *))((void *const *)t)[2])(&id) == CUDA_ERROR_NOT_INITIALIZED, "tools TLS before init");
    CUcontext ctx;
    CUstream s;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) {
        fprintf(stderr, "FAIL runtime: setup\n");
        return 1;
    }
    CHECK(((CUresult(*)(uint64_t *))((void *const *)t)[2])(&id) == CUDA_SUCCESS && id == 0, "tools TLS: no tool id");
    persona();
    context_queries(ctx);
    attributes();
    stream_ops(s);
    link_refusals();
    host_memory();
    OK(cuStreamDestroy(s));
    tables(ctx); /* resets the primary context: last */
    return failed ? 1 : 0;
}
