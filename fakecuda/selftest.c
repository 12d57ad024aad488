/* selftest.c: why it exists: checks fakecuda (libcuda.so.1) on its own, before anything
 * runs on top of it. Its main sets up a context, kernels and streams, runs the main sequence's
 * topics in order (memory, launches, events, capture and graphs, cuGetProcAddress routing:
 * selftest_memory.c, selftest_launches.c, selftest_graphs.c), tears down, and runs the
 * FAKECUDA_* knobs' checks and the other files' child modes in child processes of itself.
 * Prints "selftest: N passed, M failed"; exits non-zero on any failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"
#include "selftest.h"

int passed, failed;

#define PAGE (64u * 1024u)

/* ---- kernels and helpers the topics share ---- */
void selftest_k_double(void **params, const fakecuda_dims *d)
{
    (void)d;
    float *p = *(float **)params[0];
    size_t n = *(size_t *)params[1];
    fakecuda_touch(p, n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] *= 2.0f;
}

static void k_layout(void **params, const fakecuda_dims *d)
{
    (void)params; (void)d;
}

float *selftest_managed_filled(size_t bytes, float v)
{
    CUdeviceptr p = 0;
    if (cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS) return NULL;
    float *f = (float *)(uintptr_t)p;
    fakecuda_host_touch(f, bytes);
    for (size_t i = 0; i < bytes / sizeof *f; i++) f[i] = v;
    return f;
}

int selftest_all_equal(const float *f, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        if (f[i] != v) return 0;
    return 1;
}

void selftest_wait_for(atomic_int *flag)
{
    for (int i = 0; i < 100000 && !atomic_load(flag); i++) {
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
}

/* ---- child modes (run with knobs in the environment) ---- */
static int run_child(const char *mode, const char *env1, const char *env2)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (env1) putenv((char *)env1);
        if (env2) putenv((char *)env2);
        execl("/proc/self/exe", "selftest", mode, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static CUfunction setup_child(void)
{
    size_t sz[2] = { sizeof(float *), sizeof(size_t) }, al[2] = { _Alignof(float *), _Alignof(size_t) };
    fakecuda_register_kernel("double", selftest_k_double, 2, sz, al);
    CUcontext c;
    CUmodule m;
    CUfunction f = NULL;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuModuleLoadData(&m, "x") ||
        cuModuleGetFunction(&f, m, "double"))
        return NULL;
    return f;
}

static int child_version(void)
{
    CUfunction f = setup_child();
    CHECK(f != NULL, "child setup");
    int v = 0;
    OK(cuDriverGetVersion(&v));
    CHECK(v == 12000, "driver version %d", v);
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    OK(cuGetProcAddress("cuFuncGetParamInfo", &p, 12040, 0, &st));
    CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "ParamInfo hidden at 12000");
    OK(cuGetProcAddress("cuMemPrefetchAsync", &p, 13000, 0, &st));
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(h && p == dlsym(h, "cuMemPrefetchAsync"), "prefetch falls back to v1 at driver 12000");
    CUresult (*pi)(CUfunction, size_t, size_t *, size_t *) =
        (CUresult(*)(CUfunction, size_t, size_t *, size_t *))dlsym(h, "cuFuncGetParamInfo");
    size_t off, size;
    CHECK(pi && pi(f, 0, &off, &size) == CUDA_ERROR_NOT_SUPPORTED, "dlsym'd ParamInfo not supported");
    CUresult (*discard)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream))dlsym(h, "cuMemDiscardBatchAsync");
    CUdeviceptr dp = 0;
    size_t dsize = PAGE;
    CHECK(discard && discard(&dp, &dsize, 1, 0, NULL) == CUDA_ERROR_NOT_SUPPORTED, "no discard before CUDA 13");
    return failed ? 1 : 0;
}

/* FAKECUDA_PARAM_INFO_OTHER_KIND=garbage: the other kind's parameter info answers success
 * with one 4-byte parameter; each kind's own call is unchanged. */
static int child_other_kind(void)
{
    CUfunction f = setup_child();
    CHECK(f != NULL, "child setup");
    CUlibrary lib;
    CUkernel kern;
    OK(cuLibraryLoadData(&lib, "x", NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&kern, lib, "double"));
    size_t off = 1, size = 0;
    OK(cuFuncGetParamInfo((CUfunction)kern, 0, &off, &size));
    CHECK(off == 0 && size == 4, "garbage layout of a CUkernel asked as a CUfunction");
    CHECK(cuFuncGetParamInfo((CUfunction)kern, 1, &off, &size) == CUDA_ERROR_INVALID_VALUE, "one parameter only");
    OK(cuKernelGetParamInfo((CUkernel)(void *)f, 0, &off, &size));
    CHECK(off == 0 && size == 4, "garbage layout of a CUfunction asked as a CUkernel");
    OK(cuKernelGetParamInfo(kern, 1, &off, &size));
    CHECK(off == 8 && size == 8, "the right call is unchanged");
    return failed ? 1 : 0;
}

static int child_fail(void)
{
    CUfunction f = setup_child();
    CHECK(f != NULL, "child setup");
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 4096) == CUDA_ERROR_OUT_OF_MEMORY, "FAKECUDA_FAIL cuMemAlloc_v2=2");
    float *buf = selftest_managed_filled(PAGE, 1.0f);
    size_t n = PAGE / sizeof(float);
    void *args[] = { &buf, &n };
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL) == CUDA_ERROR_LAUNCH_FAILED,
          "FAKECUDA_FAIL cuLaunchKernel=CUDA_ERROR_LAUNCH_FAILED");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*lk)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **, void **) = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                    unsigned, unsigned, CUstream, void **, void **))
        dlsym(h, "cuLaunchKernel_ptsz");
    CHECK(lk && lk(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS, "ptsz form unaffected");
    OK(cuCtxSynchronize());
    CHECK(buf[0] == 2.0f, "ptsz launch ran");
    return failed ? 1 : 0;
}

static int child_stats(void)
{
    CUfunction f = setup_child();
    if (!f) return 1;
    float *buf = selftest_managed_filled(4 * PAGE, 1.0f);
    size_t n = 4 * PAGE / sizeof(float);
    void *args[] = { &buf, &n };
    cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    /* exits without synchronizing: the stats writer must not hang on a busy stream */
    return 0;
}

/* CUDA_VISIBLE_DEVICES=2,0,x,1 on three devices: two visible, in that order, each with
 * its own device's UUID; set but empty: none. */
static int child_visible(void)
{
    int n = -1;
    if (strcmp(getenv("CUDA_VISIBLE_DEVICES"), "") == 0) {
        CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE, "CUDA_VISIBLE_DEVICES= leaves no device");
        return failed ? 1 : 0;
    }
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    CHECK(n == 2, "CUDA_VISIBLE_DEVICES=2,0,x,1 shows %d devices", n);
    CUuuid uuid;
    OK(cuDeviceGetUuid(&uuid, 0));
    CHECK(uuid.bytes[15] == 2, "ordinal 0 is device 2 (%d)", uuid.bytes[15]);
    OK(cuDeviceGetUuid(&uuid, 1));
    CHECK(uuid.bytes[15] == 0, "ordinal 1 is device 0 (%d)", uuid.bytes[15]);
    CUdevice d;
    CHECK(cuDeviceGet(&d, 2) == CUDA_ERROR_INVALID_DEVICE, "ordinal 2 is not visible");
    return failed ? 1 : 0;
}

static int child_devices(void)
{
    CUfunction f = setup_child();
    CHECK(f != NULL, "child setup");
    int n = 0;
    OK(cuDeviceGetCount(&n));
    CHECK(n == 2, "FAKECUDA_DEVICES=2 gives %d", n);
    size_t total = 0;
    CUdevice d1;
    OK(cuDeviceGet(&d1, 1));
    OK(cuDeviceTotalMem(&total, d1));
    CHECK(total == 4ull << 30, "FAKECUDA_DEVICE_MEMORY=4G gives %zu", total);
    float *buf = selftest_managed_filled(16 * PAGE, 1.0f);
    CUmemLocation l = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1 };
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)buf, 16 * PAGE, l, 0, NULL));
    OK(cuCtxSynchronize());
    CUcontext c1;
    size_t fr, tot;
    CHECK(fakecuda_contexts_created(1) == 0, "no context on device 1 yet");
    OK(cuDevicePrimaryCtxRetain(&c1, 1));
    OK(cuDevicePrimaryCtxRetain(&c1, 1));
    CHECK(fakecuda_contexts_created(1) == 1, "one primary activation (%d)", fakecuda_contexts_created(1));
    OK(cuDevicePrimaryCtxRelease(1));
    OK(cuCtxPushCurrent(c1));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(tot - fr == 16 * PAGE, "device 1 holds the prefetched pages (%zu)", tot - fr);
    OK(cuCtxPopCurrent(&c1));
    fakecuda_reset_stats();
    size_t cnt = 16 * PAGE / sizeof(float);
    void *args[] = { &buf, &cnt };
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    OK(cuCtxSynchronize());
    CHECK(selftest_stats().gpu_faults == 16, "device 0 kernel faults on device 1 pages");
    return failed ? 1 : 0;
}

static int child_no_concurrent(void)
{
    CHECK(setup_child() != NULL, "child setup");
    int v = -1;
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0));
    CHECK(v == 0, "FAKECUDA_CONCURRENT_MANAGED=0 gives %d", v);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0));
    CHECK(v == 1, "managed memory itself still there");
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        for (const struct selftest_driver_mode *m = selftest_driver_modes; m->name; m++)
            if (!strcmp(argv[1], m->name)) return m->run();
        int r = !strcmp(argv[1], "version") ? child_version()
              : !strcmp(argv[1], "fail")    ? child_fail()
              : !strcmp(argv[1], "other-kind") ? child_other_kind()
              : !strcmp(argv[1], "stats")   ? child_stats()
              : !strcmp(argv[1], "devices") ? child_devices()
              : !strcmp(argv[1], "visible") ? child_visible()
              : !strcmp(argv[1], "no-concurrent") ? child_no_concurrent()
              : !strcmp(argv[1], "pinned-unregistered") ? selftest_child_pinned_unregistered()
                                            : 2;
        if (r == 1) fprintf(stderr, "child %s: %d failed\n", argv[1], failed);
        return r;
    }

    /* before cuInit */
    int count = -1, ver = 0;
    CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED, "NOT_INITIALIZED before cuInit");
    OK(cuDriverGetVersion(&ver));
    CHECK(ver == 13000, "default driver version %d", ver);
    void *gpa = NULL;
    OK(cuGetProcAddress("cuGetProcAddress", &gpa, 12000, 0, NULL));
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(h && gpa == dlsym(h, "cuGetProcAddress_v2"), "cuGetProcAddress works before cuInit");

    size_t sz2[2] = { sizeof(float *), sizeof(size_t) }, al2[2] = { _Alignof(float *), _Alignof(size_t) };
    CHECK(fakecuda_register_kernel("double", selftest_k_double, 2, sz2, al2) == 0, "register");
    CHECK(fakecuda_register_kernel("double", selftest_k_double, 2, sz2, al2) != 0, "duplicate refused");
    size_t szl[4] = { 1, 8, 4, 8 }, all[4] = { 1, 8, 4, 8 };
    CHECK(fakecuda_register_kernel("race", selftest_k_race, 2, sz2, al2) == 0, "register race");
    CHECK(fakecuda_register_kernel("layout", k_layout, 4, szl, all) == 0, "register layout");
    CHECK(fakecuda_register_noop_kernel("noop", 2, sz2, al2) == 0, "register noop");

    OK(cuInit(0));
    OK(cuDeviceGetCount(&count));
    CHECK(count == 1, "one device by default");
    CUdevice dev;
    OK(cuDeviceGet(&dev, 0));
    int cma = 0;
    OK(cuDeviceGetAttribute(&cma, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev));
    CHECK(cma == 1, "concurrent managed access");
    char name[64];
    OK(cuDeviceGetName(name, sizeof name, dev));
    /* fakecuda's own device is an H100 in every attribute (persona.c): none a runtime divides by is 0 */
    int threads = 0, l2 = 0, sms = 0, clock = 0, cc = 0;
    OK(cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev));
    OK(cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev));
    OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    OK(cuDeviceGetAttribute(&clock, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
    OK(cuDeviceGetAttribute(&cc, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(threads == 2048 && l2 == 52428800 && sms == 132 && clock == 1980000 && cc == 9,
          "the own device's attributes are the H100's (%d %d %d %d %d)", threads, l2, sms, clock, cc);
    CHECK(strncmp(name, "fakecuda device ", 16) == 0, "its own name %s", name);
    CUcontext ctx = NULL, cur = NULL;
    CHECK(cuMemAllocManaged(&(CUdeviceptr){ 0 }, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_INVALID_CONTEXT,
          "no context, no allocation");
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuCtxGetCurrent(&cur));
    CHECK(cur == ctx, "current context");

    CUmodule mod;
    CUfunction fdouble, frace, flayout, fnoop, missing;
    OK(cuModuleLoadData(&mod, "anything"));
    OK(cuModuleGetFunction(&fdouble, mod, "double"));
    OK(cuModuleGetFunction(&flayout, mod, "layout"));
    OK(cuModuleGetFunction(&frace, mod, "race"));
    OK(cuModuleGetFunction(&fnoop, mod, "noop"));
    CHECK(cuModuleGetFunction(&missing, mod, "nope") == CUDA_ERROR_NOT_FOUND, "unknown kernel");

    CUstream s1, s2, s3;
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
    struct selftest_main seq = { .libcuda = h, .dev = dev, .fdouble = fdouble, .frace = frace, .flayout = flayout,
                               .fnoop = fnoop, .s1 = s1, .s2 = s2, .s3 = s3 };
    selftest_managed(&seq);        /* 1-4 */
    selftest_launches(&seq);       /* 5-7 */
    selftest_events(&seq);         /* 8 */
    selftest_capture(&seq);        /* 9 */
    selftest_capture_join(&seq);   /* 10 */
    selftest_graphs_by_hand(&seq); /* 10b */
    selftest_routing(&seq);        /* 11 */
    selftest_memory(&seq);         /* 12 */
    selftest_clock(&seq);          /* 12b */

    /* 13. teardown */
    size_t fr = 0, tot = 0;
    CUgraph g;
    CUdeviceptr async = 0;
    OK(cuMemFree((CUdeviceptr)(uintptr_t)seq.a));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)seq.b));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)seq.c));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)seq.d));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == tot, "all device memory free again");
    /* in a capture, stream-ordered allocation and free are accepted (graph-owned memory is kept, so it comes last) */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamEndCapture(s1, &g));
    OK(cuGraphDestroy(g));
    OK(cuStreamSynchronize(s1));
    OK(cuEventDestroy(seq.ev));
    OK(cuEventDestroy(seq.never));
    OK(cuEventDestroy(seq.t0));
    OK(cuEventDestroy(seq.t1));
    OK(cuEventDestroy(seq.fork_ev));
    OK(cuEventDestroy(seq.join_ev));
    OK(cuStreamDestroy(s1));
    OK(cuStreamDestroy(s2));
    OK(cuStreamDestroy(s3));
    OK(cuLibraryUnload(seq.lib));
    OK(cuModuleUnload(mod));
    OK(cuDevicePrimaryCtxRelease(dev));

    /* 14. a child forked after cuInit cannot use CUDA (and writes no stats) */
    pid_t kid = fork();
    if (kid == 0) {
        int n = 0;
        _exit(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED && cuInit(0) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
    }
    int kst = 1;
    waitpid(kid, &kst, 0);
    CHECK(WIFEXITED(kst) && WEXITSTATUS(kst) == 0, "forked child refused");

    /* 15. knobs, in child processes */
    CHECK(run_child("version", "FAKECUDA_DRIVER_VERSION=12000", NULL) == 0, "FAKECUDA_DRIVER_VERSION child");
    CHECK(run_child("fail", "FAKECUDA_FAIL=cuMemAlloc_v2=2,cuLaunchKernel=CUDA_ERROR_LAUNCH_FAILED", NULL) == 0,
          "FAKECUDA_FAIL child");
    CHECK(run_child("devices", "FAKECUDA_DEVICES=2", "FAKECUDA_DEVICE_MEMORY=4G") == 0, "FAKECUDA_DEVICES child");
    CHECK(run_child("visible", "FAKECUDA_DEVICES=3", "CUDA_VISIBLE_DEVICES=2,0,x,1") == 0,
          "CUDA_VISIBLE_DEVICES child");
    CHECK(run_child("visible", "FAKECUDA_DEVICES=3", "CUDA_VISIBLE_DEVICES=") == 0, "empty CUDA_VISIBLE_DEVICES child");
    CHECK(run_child("no-concurrent", "FAKECUDA_CONCURRENT_MANAGED=0", NULL) == 0, "FAKECUDA_CONCURRENT_MANAGED child");
    CHECK(run_child("other-kind", "FAKECUDA_PARAM_INFO_OTHER_KIND=garbage", NULL) == 0,
          "FAKECUDA_PARAM_INFO_OTHER_KIND child");
    CHECK(run_child("other-kind", "FAKECUDA_PARAM_INFO_OTHER_KIND=nonsense", NULL) == 2,
          "bad FAKECUDA_PARAM_INFO_OTHER_KIND refused");
    for (const struct selftest_driver_mode *m = selftest_driver_modes; m->name; m++)
        CHECK(run_child(m->name, m->env, NULL) == 0, "%s child", m->name);
    CHECK(run_child("driver-cost", "FAKECUDA_IOCTL_THREAD=nobody", NULL) == 2, "bad FAKECUDA_IOCTL_THREAD refused");
    CHECK(run_child("faults-batch-one", "FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT=1", "FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD=100") == 0,
          "batches of one fault, prefetcher's threshold 100");
    CHECK(run_child("faults", "FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD=101", NULL) == 2, "threshold over 100 refused");
    CHECK(run_child("faults", "FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS=0", NULL) == 2, "min_faults 0 refused");
    CHECK(run_child("pool-prefetch", "FAKECUDA_POOL_PREFETCH=maybe", NULL) == 2, "bad FAKECUDA_POOL_PREFETCH refused");
    CHECK(run_child("pool-prefetch", "FAKECUDA_POOL_REUSE=maybe", NULL) == 2, "bad FAKECUDA_POOL_REUSE refused");
    CHECK(run_child("discard-fill-none", "FAKECUDA_DISCARD_FILL=zero", NULL) == 2, "bad FAKECUDA_DISCARD_FILL refused");
    CHECK(run_child("pool-prefetch-refuse-after", "FAKECUDA_POOL_PREFETCH_REFUSE_AFTER=-1", NULL) == 2,
          "bad FAKECUDA_POOL_PREFETCH_REFUSE_AFTER refused");
    char path[] = "/tmp/fakecuda-selftest-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    char env[sizeof path + 32];
    snprintf(env, sizeof env, "FAKECUDA_STATS=%s", path);
    CHECK(fd >= 0 && run_child("stats", env, NULL) == 0, "FAKECUDA_STATS child");
    char json[1024] = { 0 };
    FILE *f = fopen(path, "r");
    if (f) {
        size_t got = fread(json, 1, sizeof json - 1, f);
        json[got] = '\0';
        fclose(f);
    }
    unlink(path);
    CHECK(strstr(json, "\"launches\": 1") && strstr(json, "\"gpu_faults\": ") &&
              strstr(json, "\"batch_prefetch_calls\": 0,"), "stats JSON: %s", json);

    printf("selftest: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
