/* host_calls.c: the host time of each driver call pump makes at a launch, on the driver at
 * hand (host_calls.py builds and runs it). fakecuda charges these calls figures read from
 * A100 profiler traces of the runtime's calls, at the traces' 1 us resolution
 * (fakecuda/fakecuda_model.h): under a budget they are most of the time pump adds to
 * the launching thread (bench-steady), so the real driver's figures replace them.
 *
 * Each call is timed in rounds of back-to-back calls on one thread (CLOCK_MONOTONIC around
 * the round), the median and smallest round per call reported; launches (an empty kernel,
 * JIT-compiled from PTX) in rounds short enough never to fill the launch queue, synchronised
 * between rounds and outside the clock. The calls are looked up with cuGetProcAddress for
 * the headers' CUDA version, as the runtime does. Prints one JSON line.
 *
 *   host_calls [ROUNDS] [CALLS_PER_ROUND]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#define DRIVER(X)                                                                                  \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)   \
    X(cuCtxGetCurrent) X(cuStreamCreate) X(cuEventCreate) X(cuEventRecord) X(cuStreamWaitEvent)    \
    X(cuEventQuery) X(cuStreamQuery) X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)   \
    X(cuPointerGetAttribute) X(cuMemAllocManaged) X(cuModuleLoadData) X(cuModuleGetFunction)       \
    X(cuLaunchKernel) X(cuStreamSynchronize)

#define FIELD(name) __typeof__(name) *name;
static struct { DRIVER(FIELD) } cu;

static const char PTX[] = ".version 6.0\n.target sm_60\n.address_size 64\n"
                          ".visible .entry pump_empty()\n{\n    ret;\n}\n";

static int fail(const char *what, CUresult r)
{
    printf("{\"probe\": \"host_calls\", \"finding\": \"%s failed: CUresult %d\"}\n", what, (int)r);
    return 1;
}

#define CHECK(call)                                 \
    do {                                            \
        CUresult r_ = (call);                       \
        if (r_ != CUDA_SUCCESS) return fail(#call, r_); \
    } while (0)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The state the timed calls use. */
static CUstream stream, other;
static CUevent event;
static CUfunction empty;
static CUdeviceptr managed;

enum call { CTX_GET_CURRENT, STREAM_IS_CAPTURING, EXCHANGE_CAPTURE_MODE, EVENT_QUERY, STREAM_QUERY,
            EVENT_RECORD, STREAM_WAIT_EVENT, POINTER_GET_ATTRIBUTE, LAUNCH_KERNEL, CALLS };
static const char *const names[CALLS] = {
    "cuCtxGetCurrent", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode", "cuEventQuery",
    "cuStreamQuery", "cuEventRecord", "cuStreamWaitEvent", "cuPointerGetAttribute", "cuLaunchKernel"};

static CUresult one(enum call which)
{
    CUcontext ctx;
    CUstreamCaptureStatus status;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    unsigned int is_managed;
    switch (which) {
    case CTX_GET_CURRENT: return cu.cuCtxGetCurrent(&ctx);
    case STREAM_IS_CAPTURING: return cu.cuStreamIsCapturing(stream, &status);
    /* pump relaxes and restores the mode around its calls: one exchange here, two there */
    case EXCHANGE_CAPTURE_MODE: return cu.cuThreadExchangeStreamCaptureMode(&mode);
    case EVENT_QUERY: return cu.cuEventQuery(event);
    case STREAM_QUERY: return cu.cuStreamQuery(other);
    case EVENT_RECORD: return cu.cuEventRecord(event, stream);
    case STREAM_WAIT_EVENT: return cu.cuStreamWaitEvent(other, event, 0);
    case POINTER_GET_ATTRIBUTE: return cu.cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed);
    case LAUNCH_KERNEL: return cu.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Median and smallest ns per call over the rounds; the streams drained between rounds. */
static CUresult time_call(enum call which, int rounds, int per_round, double *median, double *least)
{
    double *per_call = calloc((size_t)rounds, sizeof *per_call);
    if (per_call == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < rounds && r == CUDA_SUCCESS; i++) {
        double start = now_ns();
        for (int n = 0; n < per_round && r == CUDA_SUCCESS; n++)
            r = one(which);
        per_call[i] = (now_ns() - start) / per_round;
        if (r == CUDA_SUCCESS)
            r = cu.cuStreamSynchronize(stream);
        if (r == CUDA_SUCCESS)
            r = cu.cuStreamSynchronize(other);
    }
    qsort(per_call, (size_t)rounds, sizeof *per_call, by_value);
    *median = per_call[rounds / 2];
    *least = per_call[0];
    free(per_call);
    return r;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 21, per_round = argc > 2 ? atoi(argv[2]) : 256;
    if (rounds < 1 || per_round < 1 || per_round > 512) {
        fprintf(stderr, "usage: host_calls [ROUNDS >= 1] [CALLS_PER_ROUND 1..512]\n");
        return 2;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == NULL) {
        printf("{\"probe\": \"host_calls\", \"finding\": \"libcuda.so.1 does not load\"}\n");
        return 1;
    }
    __typeof__(cuGetProcAddress) *get_proc = (__typeof__(cuGetProcAddress) *)dlsym(driver, "cuGetProcAddress_v2");
    if (get_proc == NULL)
        return fail("dlsym(cuGetProcAddress_v2)", CUDA_ERROR_NOT_FOUND);
    __typeof__(cuDriverGetVersion) *driver_version = (__typeof__(cuDriverGetVersion) *)dlsym(driver, "cuDriverGetVersion");
    int version = 0;
    if (driver_version == NULL)
        return fail("dlsym(cuDriverGetVersion)", CUDA_ERROR_NOT_FOUND);
    CHECK(driver_version(&version));
    /* the forms of the older of the headers and the driver, as the runtime asks */
    int asked = version < CUDA_VERSION ? version : CUDA_VERSION;
    CUdriverProcAddressQueryResult found;
#define LOOKUP(name) CHECK(get_proc(#name, (void **)&cu.name, asked, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    DRIVER(LOOKUP)
    /* fakecuda runs no PTX: its kernels are registered host functions, here one that does nothing */
    int (*register_noop)(const char *, unsigned, const size_t *, const size_t *) =
        (int (*)(const char *, unsigned, const size_t *, const size_t *))dlsym(driver, "fakecuda_register_noop_kernel");
    if (register_noop != NULL && register_noop("pump_empty", 0, NULL, NULL) != 0)
        return fail("fakecuda_register_noop_kernel", CUDA_ERROR_UNKNOWN);
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CHECK(cu.cuInit(0));
    CHECK(cu.cuDeviceGet(&device, 0));
    CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, device));
    CHECK(cu.cuCtxSetCurrent(ctx));
    CHECK(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cu.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CHECK(cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    CHECK(cu.cuMemAllocManaged(&managed, (size_t)2 << 20, CU_MEM_ATTACH_GLOBAL));
    CHECK(cu.cuModuleLoadData(&module, PTX));
    CHECK(cu.cuModuleGetFunction(&empty, module, "pump_empty"));
    CHECK(cu.cuEventRecord(event, stream));
    CHECK(cu.cuStreamSynchronize(stream));
    printf("{\"probe\": \"host_calls\", \"driver_version\": %d, \"headers_version\": %d, \"rounds\": %d, "
           "\"calls_per_round\": %d, \"fakecuda\": %s, \"ns_per_call\": {",
           version, CUDA_VERSION, rounds, per_round, register_noop != NULL ? "true" : "false");
    for (int which = 0; which < CALLS; which++) {
        double median, least;
        (void)time_call((enum call)which, 2, per_round, &median, &least); /* warm: first calls */
        CUresult r = time_call((enum call)which, rounds, per_round, &median, &least);
        if (r != CUDA_SUCCESS)
            printf("%s\"%s\": {\"refused\": %d}", which ? ", " : "", names[which], (int)r);
        else
            printf("%s\"%s\": {\"median\": %.1f, \"min\": %.1f}", which ? ", " : "", names[which], median, least);
    }
    printf("}}\n");
    return 0;
}
