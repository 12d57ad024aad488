/* cuda_api.h: the driver functions the C test programs call, reached one of
 * two ways, as real programs reach them:
 *   - linked: the program is linked against libcuda (-lcuda) and calls the
 *     exported symbols (what LD_PRELOAD interposes directly);
 *   - procaddr: the program dlopens libcuda.so.1, dlsym's cuGetProcAddress_v2
 *     and asks it for everything else, exactly as nvcc's default static CUDA
 *     runtime does (optionally asking for per-thread-default-stream variants,
 *     as `--default-stream per-thread` builds do).
 * The fakecuda test API (kernel registration, touches, stats) comes along.
 */
#ifndef PUMP_TEST_CUDA_API_H
#define PUMP_TEST_CUDA_API_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "fakecuda.h"

struct cuda_api {
    PFN_cuInit_v2000 init;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    PFN_cuCtxSetCurrent_v4000 ctx_set_current;
    PFN_cuMemAllocManaged_v6000 mem_alloc_managed;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuStreamSynchronize_v2000 stream_synchronize;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuLibraryLoadData_v12000 library_load_data;
    PFN_cuLibraryGetKernel_v12000 library_get_kernel;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuLaunchKernelEx_v11060 launch_kernel_ex;
    PFN_cuLaunchCooperativeKernel_v9000 launch_cooperative_kernel;
    PFN_cuStreamBeginCapture_v10010 stream_begin_capture;
    PFN_cuStreamEndCapture_v10000 stream_end_capture;
    PFN_cuGraphInstantiateWithFlags_v11040 graph_instantiate;
    PFN_cuGraphLaunch_v10000 graph_launch;
    PFN_cuEventCreate_v2000 event_create;
    PFN_cuEventRecord_v2000 event_record;
    PFN_cuStreamWaitEvent_v3020 stream_wait_event;
    int (*register_kernel)(const char *, fakecuda_kernel_fn, unsigned, const size_t *, const size_t *);
    int (*register_noop_kernel)(const char *, unsigned, const size_t *, const size_t *);
    void (*touch)(const void *, size_t);
    void (*host_touch)(const void *, size_t);
    void (*get_stats)(struct fakecuda_stats *);
    void (*reset_stats)(void);
    uint64_t (*thread_host_ns)(void); /* the driver time charged to the calling thread */
};


#ifdef PUMP_TEST_PROCADDR
/* Returns 0, or 4 when there is no driver (as cudart reports
 * cudaErrorInsufficientDriver). */
static inline int cuda_api_load(struct cuda_api *api, int per_thread)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL)
        return 4;
    PFN_cuGetProcAddress_v12000 bootstrap = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    if (bootstrap == NULL)
        return 4;
    /* Like cudart: everything else through the cuGetProcAddress it returns. */
    PFN_cuGetProcAddress_v12000 gpa = NULL;
    CUdriverProcAddressQueryResult status;
    CHECK(bootstrap("cuGetProcAddress", (void **)&gpa, 12000, 0, &status));
    cuuint64_t stream_flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#define GET(field, name, version, flags)                                            \
    do {                                                                            \
        CHECK(gpa(name, (void **)&api->field, version, flags, &status));            \
        if (api->field == NULL) {                                                   \
            fprintf(stderr, "error: cuGetProcAddress(%s) gave NULL\n", name);        \
            exit(3);                                                                \
        }                                                                           \
    } while (0)
    GET(init, "cuInit", 2000, 0);
    GET(device_get, "cuDeviceGet", 2000, 0);
    GET(primary_ctx_retain, "cuDevicePrimaryCtxRetain", 7000, 0);
    GET(ctx_set_current, "cuCtxSetCurrent", 4000, 0);
    GET(mem_alloc_managed, "cuMemAllocManaged", 6000, 0);
    GET(mem_alloc, "cuMemAlloc", 3020, 0);
    GET(mem_free, "cuMemFree", 3020, 0);
    GET(stream_create, "cuStreamCreate", 2000, 0);
    GET(stream_synchronize, "cuStreamSynchronize", 7000, stream_flags);
    GET(ctx_synchronize, "cuCtxSynchronize", 2000, 0);
    GET(module_load_data, "cuModuleLoadData", 2000, 0);
    GET(module_get_function, "cuModuleGetFunction", 2000, 0);
    GET(library_load_data, "cuLibraryLoadData", 12000, 0);
    GET(library_get_kernel, "cuLibraryGetKernel", 12000, 0);
    GET(launch_kernel, "cuLaunchKernel", 7000, stream_flags);
    GET(launch_kernel_ex, "cuLaunchKernelEx", 11060, stream_flags);
    GET(launch_cooperative_kernel, "cuLaunchCooperativeKernel", 9000, stream_flags);
    GET(stream_begin_capture, "cuStreamBeginCapture", 10010, stream_flags);
    GET(stream_end_capture, "cuStreamEndCapture", 10000, stream_flags);
    GET(graph_instantiate, "cuGraphInstantiateWithFlags", 11040, 0);
    GET(graph_launch, "cuGraphLaunch", 10000, stream_flags);
    GET(event_create, "cuEventCreate", 2000, 0);
    GET(event_record, "cuEventRecord", 7000, stream_flags);
    GET(stream_wait_event, "cuStreamWaitEvent", 7000, stream_flags);
#undef GET
    /* The fakecuda test API is not a driver entry point: plain dlsym. */
    *(void **)&api->register_kernel = dlsym(lib, "fakecuda_register_kernel");
    *(void **)&api->register_noop_kernel = dlsym(lib, "fakecuda_register_noop_kernel");
    *(void **)&api->touch = dlsym(lib, "fakecuda_touch");
    *(void **)&api->host_touch = dlsym(lib, "fakecuda_host_touch");
    *(void **)&api->get_stats = dlsym(lib, "fakecuda_get_stats");
    *(void **)&api->reset_stats = dlsym(lib, "fakecuda_reset_stats");
    *(void **)&api->thread_host_ns = dlsym(lib, "fakecuda_thread_host_ns");
    if (api->register_kernel == NULL || api->get_stats == NULL) {
        fprintf(stderr, "error: libcuda.so.1 is not fakecuda\n");
        exit(3);
    }
    return 0;
}
#else
static inline int cuda_api_load(struct cuda_api *api, int per_thread)
{
    (void)per_thread;
    *api = (struct cuda_api){
        .init = cuInit,
        .device_get = cuDeviceGet,
        .primary_ctx_retain = cuDevicePrimaryCtxRetain,
        .ctx_set_current = cuCtxSetCurrent,
        .mem_alloc_managed = cuMemAllocManaged,
        .mem_alloc = cuMemAlloc,
        .mem_free = cuMemFree,
        .stream_create = cuStreamCreate,
        .stream_synchronize = cuStreamSynchronize,
        .ctx_synchronize = cuCtxSynchronize,
        .module_load_data = cuModuleLoadData,
        .module_get_function = cuModuleGetFunction,
        .library_load_data = cuLibraryLoadData,
        .library_get_kernel = cuLibraryGetKernel,
        .launch_kernel = cuLaunchKernel,
        .launch_kernel_ex = cuLaunchKernelEx,
        .launch_cooperative_kernel = cuLaunchCooperativeKernel,
        .stream_begin_capture = cuStreamBeginCapture,
        .stream_end_capture = cuStreamEndCapture,
        .graph_instantiate = cuGraphInstantiateWithFlags,
        .graph_launch = cuGraphLaunch,
        .event_create = cuEventCreate,
        .event_record = cuEventRecord,
        .stream_wait_event = cuStreamWaitEvent,
        .register_kernel = fakecuda_register_kernel,
        .register_noop_kernel = fakecuda_register_noop_kernel,
        .touch = fakecuda_touch,
        .host_touch = fakecuda_host_touch,
        .get_stats = fakecuda_get_stats,
        .reset_stats = fakecuda_reset_stats,
        .thread_host_ns = fakecuda_thread_host_ns,
    };
    return 0;
}
#endif

/* The program's driver functions (one set per program or library). */
static struct cuda_api api;

/* A kernel several programs use: x[i] += 1 over (float *x, uint64_t n). */
__attribute__((unused)) static void inc_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = *(float **)params[0];
    uint64_t n = *(uint64_t *)params[1];
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] += 1.0f;
}

/* Kernels and helpers several programs use, over (pointer, ..., n) arguments. */
__attribute__((unused)) static float *arg_floats(void **params, int i) { return *(float **)params[i]; }
__attribute__((unused)) static uint64_t arg_u64(void **params, int i) { return *(uint64_t *)params[i]; }

/* x[i] *= factor over (float *x, uint64_t n, float factor). */
__attribute__((unused)) static void scale_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    float factor = *(float *)params[2];
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] *= factor;
}

/* c[i] = a[i] + b[i] over (const float *a, const float *b, float *c, uint64_t n). */
__attribute__((unused)) static void add_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *a = arg_floats(params, 0), *b = arg_floats(params, 1);
    float *c = arg_floats(params, 2);
    uint64_t n = arg_u64(params, 3);
    api.touch(a, n * sizeof *a);
    api.touch(b, n * sizeof *b);
    api.touch(c, n * sizeof *c);
    for (uint64_t i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

/* x[i] = base + i % 7 over (float *x, uint64_t n, float base). */
__attribute__((unused)) static void pattern_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    float base = *(float *)params[2];
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] = base + (float)(i % 7);
}

/* *out = the sum of x over (const float *x, uint64_t n, double *out). */
__attribute__((unused)) static void sum_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    double *out = *(double **)params[2];
    api.touch(x, n * sizeof *x);
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += x[i];
    *out = s;
}

/* The host writes n floats of managed memory (after its CPU faults). */
__attribute__((unused)) static void host_fill(float *x, size_t n, float base)
{
    api.host_touch(x, n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = base + (float)(i % 1024) * 0.25f;
}

/* A kernel registered with fakecuda and looked up as a CUfunction of a loaded module
 * (made in the current context). */
__attribute__((unused)) static CUfunction cuda_api_kernel(const char *name, fakecuda_kernel_fn fn, unsigned nparams,
                                                          const size_t *sizes, const size_t *aligns)
{
    if (api.register_kernel(name, fn, nparams, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        exit(3);
    }
    CUmodule module;
    CUfunction f;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&f, module, name));
    return f;
}

/* cuInit, device `ordinal`'s primary context made current. */
static inline CUdevice cuda_api_start_on(struct cuda_api *api, int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(api->init(0));
    CHECK(api->device_get(&dev, ordinal));
    CHECK(api->primary_ctx_retain(&ctx, dev));
    CHECK(api->ctx_set_current(ctx));
    return dev;
}

static inline CUdevice cuda_api_start(struct cuda_api *api)
{
    return cuda_api_start_on(api, 0);
}

#endif
