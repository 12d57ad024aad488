/* selftest.c: why it exists: checks fakecuda (libcuda.so.1) on its own, before anything
 * runs on top of it: residency and fault counting, prefetch, every launch form, CUkernel
 * handles, events across streams, capture and graphs, cuGetProcAddress routing, the
 * FAKECUDA_* knobs (in child processes of itself). Prints "selftest: N passed, M failed";
 * exits non-zero on any failure. */
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

#define MiB (1024u * 1024u)
#define PAGE (64u * 1024u)

/* ---- kernels ---- */
static void k_double(void **params, const fakecuda_dims *d)
{
    (void)d;
    float *p = *(float **)params[0];
    size_t n = *(size_t *)params[1];
    fakecuda_touch(p, n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] *= 2.0f;
}

/* Like k_double, but first tells the host it has started (for the race test). */
static atomic_int race_started;
static void k_race(void **params, const fakecuda_dims *d)
{
    atomic_store(&race_started, 1);
    k_double(params, d);
}

static void k_layout(void **params, const fakecuda_dims *d)
{
    (void)params; (void)d;
}

static float *managed_filled(size_t bytes, float v)
{
    CUdeviceptr p = 0;
    if (cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS) return NULL;
    float *f = (float *)(uintptr_t)p;
    fakecuda_host_touch(f, bytes);
    for (size_t i = 0; i < bytes / sizeof *f; i++) f[i] = v;
    return f;
}

static int all_equal(const float *f, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        if (f[i] != v) return 0;
    return 1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Host functions block until the main thread says go (or 10 s pass): no timing luck. */
static void wait_for(atomic_int *flag)
{
    for (int i = 0; i < 100000 && !atomic_load(flag); i++) {
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
}
static atomic_int go_a;
static int flag_a, flag_seen;
static void host_slow_set(void *ud) { (void)ud; wait_for(&go_a); sleep_ms(30); flag_a = 1; }
static void host_wait_race(void *ud) { (void)ud; wait_for(&race_started); }
static void host_observe(void *ud) { (void)ud; flag_seen = flag_a; }
static void host_sleep20(void *ud) { (void)ud; sleep_ms(20); }
static atomic_int go_free;
static void host_hold(void *ud) { wait_for((atomic_int *)ud); }

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
    fakecuda_register_kernel("double", k_double, 2, sz, al);
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

static int child_fail(void)
{
    CUfunction f = setup_child();
    CHECK(f != NULL, "child setup");
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 4096) == CUDA_ERROR_OUT_OF_MEMORY, "FAKECUDA_FAIL cuMemAlloc_v2=2");
    float *buf = managed_filled(PAGE, 1.0f);
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
    float *buf = managed_filled(4 * PAGE, 1.0f);
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
    float *buf = managed_filled(16 * PAGE, 1.0f);
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
              : !strcmp(argv[1], "stats")   ? child_stats()
              : !strcmp(argv[1], "devices") ? child_devices()
              : !strcmp(argv[1], "visible") ? child_visible()
              : !strcmp(argv[1], "no-concurrent") ? child_no_concurrent()
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
    CHECK(fakecuda_register_kernel("double", k_double, 2, sz2, al2) == 0, "register");
    CHECK(fakecuda_register_kernel("double", k_double, 2, sz2, al2) != 0, "duplicate refused");
    size_t szl[4] = { 1, 8, 4, 8 }, all[4] = { 1, 8, 4, 8 };
    CHECK(fakecuda_register_kernel("race", k_race, 2, sz2, al2) == 0, "register race");
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

    /* 1. faults: 16 MiB, host-filled, one kernel: 256 faults */
    const size_t big = 16 * MiB, nbig = big / sizeof(float);
    float *a = managed_filled(big, 1.0f);
    CHECK(a && ((uintptr_t)a & (2 * MiB - 1)) == 0, "managed base 2 MiB aligned");
    fakecuda_reset_stats();
    void *args_a[] = { &a, (void *)&nbig };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 128, 1, 1, 0, s1, args_a, NULL));
    OK(cuStreamSynchronize(s1));
    struct fakecuda_stats st = selftest_stats();
    CHECK(all_equal(a, nbig, 2.0f), "kernel doubled");
    CHECK(st.gpu_faults == 256, "gpu_faults %llu", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_faulted_h2d == big && st.pages_touched_by_kernels == 256 && st.kernels_run == 1 &&
              st.launches == 1, "fault counters");
    size_t fr = 0, tot = 0;
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(tot - fr == big, "cuMemGetInfo counts resident managed bytes (%zu)", tot - fr);

    /* 2. prefetch (v2 + batch): no faults */
    float *b = managed_filled(big, 3.0f);
    fakecuda_reset_stats();
    CUmemLocation dloc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)b, big / 2, dloc, 0, s1));
    CUdeviceptr bp[2] = { (CUdeviceptr)(uintptr_t)b + big / 2, (CUdeviceptr)(uintptr_t)b + 3 * big / 4 };
    size_t bs[2] = { big / 4, big / 4 }, idx0[1] = { 0 };
    OK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, s1));
    void *args_b[] = { &b, (void *)&nbig };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL));
    OK(cuStreamSynchronize(s1));
    st = selftest_stats();
    CHECK(st.gpu_faults == 0, "no faults after prefetch (%llu)", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_prefetched_h2d == big && st.bytes_prefetched_unused == 0, "prefetched %llu unused %llu",
          (unsigned long long)st.bytes_prefetched_h2d, (unsigned long long)st.bytes_prefetched_unused);
    CHECK(st.prefetch_calls == 1 && st.batch_prefetch_calls == 1, "prefetch call counters");
    CHECK(all_equal(b, nbig, 6.0f), "values after prefetched kernel");
    /* batch validation */
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, NULL) == CUDA_ERROR_INVALID_VALUE, "legacy stream");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, CU_STREAM_LEGACY) == CUDA_ERROR_INVALID_VALUE,
          "CU_STREAM_LEGACY");
    size_t idx1[1] = { 1 }, idx2[2] = { 0, 0 };
    CUmemLocation locs2[2] = { dloc, dloc };
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx1, 1, 0, s1) == CUDA_ERROR_INVALID_VALUE, "idx[0] != 0");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, locs2, idx2, 2, 0, s1) == CUDA_ERROR_INVALID_VALUE, "not increasing");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 1, s1) == CUDA_ERROR_INVALID_VALUE, "flags");
    int on_stack = 0;
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)&on_stack, 4, dloc, 0, s1) == CUDA_ERROR_INVALID_VALUE,
          "prefetch outside managed memory");
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)b, big + 1, dloc, 0, s1) == CUDA_ERROR_INVALID_VALUE,
          "prefetch past the allocation");

    /* 3. prefetched then host-touched: unused bytes and CPU faults */
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, (CUmemLocation){ .type = CU_MEM_LOCATION_TYPE_HOST }, 0,
                          s1));
    OK(cuStreamSynchronize(s1));
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().bytes_prefetched_unused == 4 * PAGE, "untouched prefetch reported as unused");
    fakecuda_host_touch(a, 4 * PAGE);
    st = selftest_stats();
    CHECK(st.cpu_faults == 4 && st.bytes_d2h == 8 * PAGE && st.bytes_prefetched_unused == 4 * PAGE,
          "cpu faults %llu d2h %llu unused %llu", (unsigned long long)st.cpu_faults,
          (unsigned long long)st.bytes_d2h, (unsigned long long)st.bytes_prefetched_unused);

    /* 3b. a discard: whole pages inside the range go nowhere and are poisoned; a partly
     * covered page keeps its place and its bytes; the legacy stream is refused */
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    fakecuda_reset_stats();
    uint64_t resident_before = selftest_stats().device_resident_bytes;
    CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)a + PAGE / 2;
    size_t dsize = 2 * PAGE;
    OK(cuMemDiscardBatchAsync(&dptr, &dsize, 1, 0, s1));
    OK(cuStreamSynchronize(s1));
    st = selftest_stats();
    CHECK(st.bytes_discarded == PAGE && st.bytes_d2h == 0 && st.device_resident_bytes == resident_before - PAGE,
          "discard: %llu discarded, %llu resident", (unsigned long long)st.bytes_discarded,
          (unsigned long long)st.device_resident_bytes);
    uint32_t word0, word1;
    memcpy(&word0, (char *)a + PAGE / 2, sizeof word0);
    memcpy(&word1, (char *)a + PAGE, sizeof word1);
    CHECK(word0 != 0xFFFFFFFFu && word1 == 0xFFFFFFFFu, "discard poisons whole pages only");
    CHECK(cuMemDiscardBatchAsync(&dptr, &dsize, 1, 0, NULL) == CUDA_ERROR_INVALID_VALUE,
          "discard on the legacy stream refused");
    fakecuda_host_touch(a, 4 * PAGE);

    /* 4. a prefetch raced by a kernel on another stream that does not wait: the prefetch
     * starts once the kernel has started, so the kernel faults on pages not yet moved */
    float *c = managed_filled(4 * big, 1.0f);
    size_t nc = 4 * big / sizeof(float);
    fakecuda_reset_stats();
    OK(cuLaunchHostFunc(s1, host_wait_race, NULL));
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)c, 4 * big, dloc, 0, s1));
    void *args_c[] = { &c, &nc };
    OK(cuLaunchKernel(frace, 1, 1, 1, 1, 1, 1, 0, s2, args_c, NULL));
    OK(cuCtxSynchronize());
    st = selftest_stats();
    CHECK(st.gpu_faults > 0, "racing kernel faults (%llu)", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_prefetched_h2d + st.bytes_faulted_h2d == 4 * big, "each page moved once");
    CHECK(all_equal(c, nc, 2.0f), "raced kernel values");

    /* 5. the extra form, cuLaunchKernelEx, default stream, cooperative */
    struct { float *p; size_t n; } packed = { b, nbig };
    size_t packed_size = sizeof packed;
    void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                      CU_LAUNCH_PARAM_END };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, NULL, extra));
    CHECK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_b, extra) == CUDA_ERROR_INVALID_VALUE,
          "params and extra both given");
    CUlaunchConfig cfg = { 1, 1, 1, 32, 1, 1, 0, s1, NULL, 0 };
    OK(cuLaunchKernelEx(&cfg, fdouble, args_b, NULL));
    OK(cuStreamSynchronize(s1)); /* s1 is non-blocking: no implicit sync with stream 0 */
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, NULL, args_b, NULL));
    OK(cuStreamSynchronize(NULL));
    OK(cuLaunchCooperativeKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_b));
    OK(cuCtxSynchronize());
    CHECK(all_equal(b, nbig, 96.0f), "extra/Ex/default/cooperative launches (b[0]=%g)", (double)b[0]);

    /* 6. libraries and CUkernel handles; parameter info */
    CUlibrary lib;
    CUkernel kern;
    CUfunction fk;
    OK(cuLibraryLoadData(&lib, "anything", NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&kern, lib, "double"));
    CHECK((void *)kern != (void *)fdouble, "CUkernel is a different handle");
    OK(cuKernelGetFunction(&fk, kern));
    CHECK(fk == fdouble, "cuKernelGetFunction");
    OK(cuLaunchKernel((CUfunction)kern, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL));
    OK(cuStreamSynchronize(s1));
    CHECK(b[0] == 192.0f, "launch through a CUkernel");
    size_t off = 0, size = 0;
    CHECK(cuFuncGetParamInfo((CUfunction)kern, 0, &off, &size) == CUDA_ERROR_INVALID_VALUE, "FuncGetParamInfo(CUkernel)");
    CHECK(cuKernelGetParamInfo((CUkernel)fdouble, 0, &off, &size) == CUDA_ERROR_INVALID_VALUE, "KernelGetParamInfo(CUfunction)");
    CHECK(cuFuncGetParamInfo(NULL, 0, &off, &size) == CUDA_ERROR_INVALID_VALUE, "FuncGetParamInfo(NULL)");
    CHECK(cuFuncGetParamInfo(fdouble, 0, NULL, &size) == CUDA_ERROR_INVALID_VALUE, "paramOffset is not optional");
    OK(cuKernelGetParamInfo(kern, 1, &off, NULL)); /* paramSize is */
    CHECK(off == sizeof(float *), "offset without the size");
    OK(cuKernelGetParamInfo(kern, 1, &off, &size));
    CHECK(off == 8 && size == 8, "kernel param 1 at 8");
    size_t offs[4], want[4] = { 0, 8, 16, 24 };
    int layout_ok = 1;
    for (int i = 0; i < 4; i++) layout_ok &= cuFuncGetParamInfo(flayout, i, &offs[i], &size) == CUDA_SUCCESS && offs[i] == want[i];
    CHECK(layout_ok, "natural layout offsets");
    CHECK(cuFuncGetParamInfo(flayout, 4, &off, &size) == CUDA_ERROR_INVALID_VALUE, "index past the end");
    const char *kname = NULL;
    OK(cuFuncGetName(&kname, fdouble));
    CHECK(kname && !strcmp(kname, "double"), "cuFuncGetName");
    OK(cuKernelGetName(&kname, kern));

    /* 7. noop kernel: the cost floor */
    uint64_t ran = selftest_stats().kernels_run;
    OK(cuLaunchKernel(fnoop, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL));
    CHECK(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL) == CUDA_ERROR_INVALID_HANDLE, "null handle");
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().kernels_run == ran, "noop enqueues nothing");

    /* 8. events across streams */
    CUevent ev, never, t0, t1;
    OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&never, 0));
    OK(cuEventCreate(&t0, 0));
    OK(cuEventCreate(&t1, 0));
    OK(cuEventQuery(never));
    OK(cuStreamWaitEvent(s2, never, 0));
    OK(cuLaunchHostFunc(s1, host_slow_set, NULL));
    OK(cuEventRecord(ev, s1));
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY, "event pending");
    OK(cuStreamWaitEvent(s2, ev, 0));
    OK(cuLaunchHostFunc(s2, host_observe, NULL));
    atomic_store(&go_a, 1);
    OK(cuStreamSynchronize(s2));
    CHECK(flag_seen == 1, "s2 waited for s1's event");
    OK(cuEventSynchronize(ev));
    OK(cuEventRecord(t0, s3));
    OK(cuLaunchHostFunc(s3, host_sleep20, NULL));
    OK(cuEventRecord(t1, s3));
    OK(cuEventSynchronize(t1));
    float ms = 0;
    OK(cuEventElapsedTime(&ms, t0, t1));
    CHECK(ms >= 19.0f && ms < 2000.0f, "elapsed %.3f ms", (double)ms);
    CHECK(cuEventElapsedTime(&ms, ev, t1) == CUDA_ERROR_INVALID_HANDLE, "timing disabled");

    /* 9. capture: a captured launch runs only when the graph is launched */
    CUstreamCaptureStatus cs;
    CUgraph g;
    CUgraphExec ge;
    float *d = managed_filled(PAGE, 1.0f);
    size_t nd = PAGE / sizeof(float);
    void *args_d[] = { &d, &nd };
    CHECK(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "legacy stream cannot capture");
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuStreamIsCapturing(s1, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capturing");
    ran = selftest_stats().kernels_run;
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_d, NULL));
    cuuint64_t cid = 0;
    CUgraph cg = NULL;
    const CUgraphNode *deps = NULL;
    size_t ndeps = 0;
    OK(cuStreamGetCaptureInfo(s1, &cs, &cid, &cg, &deps, NULL, &ndeps));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && cg && ndeps == 1, "capture info");
    OK(cuStreamEndCapture(s1, &g));
    OK(cuStreamIsCapturing(s1, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "capture ended");
    OK(cuCtxSynchronize());
    CHECK(selftest_stats().kernels_run == ran && d[0] == 1.0f, "captured launch did not run");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s1));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(all_equal(d, nd, 4.0f), "graph launched twice (d[0]=%g)", (double)d[0]);
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));

    /* 10. a stream joins a capture by waiting on an event recorded in it */
    CUevent fork_ev, join_ev;
    OK(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_d, NULL));
    OK(cuEventRecord(fork_ev, s1));
    OK(cuStreamWaitEvent(s2, fork_ev, 0));
    OK(cuStreamIsCapturing(s2, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "s2 joined the capture");
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s2, args_d, NULL));
    OK(cuEventRecord(join_ev, s2));
    OK(cuStreamWaitEvent(s1, join_ev, 0));
    OK(cuStreamEndCapture(s1, &g));
    OK(cuStreamIsCapturing(s2, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "s2 left the capture");
    OK(cuCtxSynchronize());
    CHECK(d[0] == 4.0f, "joined launches captured, not run");
    size_t nn = 0;
    OK(cuGraphGetNodes(g, NULL, &nn));
    CHECK(nn == 2, "graph has %zu nodes", nn);
    CUgraphNode nodes[2];
    CUDA_KERNEL_NODE_PARAMS kp;
    OK(cuGraphGetNodes(g, nodes, &nn));
    OK(cuGraphKernelNodeGetParams(nodes[1], &kp));
    CHECK(kp.func == fdouble && *(float **)kp.kernelParams[0] == d, "kernel node params");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s3));
    OK(cuStreamSynchronize(s3));
    CHECK(all_equal(d, nd, 16.0f), "joined graph ran both kernels");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));
    /* a prefetch into a capture invalidates it */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)d, PAGE, dloc, 0, s1) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "prefetch in capture");
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated capture");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL, "capture mode exchanged");
    /* potentially unsafe calls (cuEventQuery) under a capture: allowed in relaxed mode,
     * prohibited in global mode, which invalidates the capture */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuEventQuery(ev));
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    CHECK(cuEventQuery(ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "event query in global mode");
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL,
          "capture invalidated by an unsafe call");
    OK(cuEventQuery(ev));
    OK(cuThreadExchangeStreamCaptureMode(&mode));

    /* 10b. graphs built by hand: kernel nodes, a child graph (copied into its node),
     * instantiation with params, and an exec's kernel node or whole graph updated */
    float *e = managed_filled(PAGE, 1.0f), *e2 = managed_filled(PAGE, 1.0f);
    void *args_e[] = { &e, &nd }, *args_e2[] = { &e2, &nd };
    CUDA_KERNEL_NODE_PARAMS np = { .func = fdouble, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                   .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1, .kernelParams = args_e };
    CUgraph inner_graph, outer, got;
    CUgraphNode kn, kn_outer, cn;
    CUgraphNodeType nt;
    OK(cuGraphCreate(&inner_graph, 0));
    OK(cuGraphAddKernelNode(&kn, inner_graph, NULL, 0, &np));
    OK(cuGraphCreate(&outer, 0));
    OK(cuGraphAddKernelNode(&kn_outer, outer, NULL, 0, &np));
    OK(cuGraphAddChildGraphNode(&cn, outer, &kn_outer, 1, inner_graph));
    OK(cuGraphDestroy(inner_graph));
    OK(cuGraphNodeGetType(cn, &nt));
    OK(cuGraphChildGraphNodeGetGraph(cn, &got));
    OK(cuGraphGetNodes(got, NULL, &nn));
    CHECK(nt == CU_GRAPH_NODE_TYPE_GRAPH && nn == 1, "child graph node");
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = { .hUploadStream = s1 };
    OK(cuGraphInstantiateWithParams(&ge, outer, &ip));
    CHECK(ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS, "instantiate result");
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(all_equal(e, nd, 4.0f), "parent and child kernels ran");
    np.kernelParams = args_e2;
    OK(cuGraphExecKernelNodeSetParams(ge, kn_outer, &np));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(all_equal(e, nd, 8.0f) && all_equal(e2, nd, 2.0f), "exec kernel node set params");
    CUgraphExecUpdateResultInfo ui;
    OK(cuGraphCreate(&inner_graph, 0));
    OK(cuGraphAddKernelNode(&kn, inner_graph, NULL, 0, &np));
    CHECK(cuGraphExecUpdate(ge, inner_graph, &ui) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
              ui.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, "update with another topology");
    OK(cuGraphAddKernelNode(&kn, inner_graph, &kn, 1, &np));
    OK(cuGraphExecUpdate(ge, inner_graph, &ui));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(ui.result == CU_GRAPH_EXEC_UPDATE_SUCCESS && all_equal(e, nd, 8.0f) && all_equal(e2, nd, 8.0f),
          "exec update");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(inner_graph));
    OK(cuGraphDestroy(outer));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)e));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)e2));

    /* 11. cuGetProcAddress routing: pointers identical to dlsym of the ABI export */
    struct { const char *sym; int ver; cuuint64_t flags; const char *abi; } routes[] = {
        { "cuLaunchKernel", 12000, 0, "cuLaunchKernel" },
        { "cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz" },
        { "cuMemPrefetchAsync", 8000, 0, "cuMemPrefetchAsync" },
        { "cuMemPrefetchAsync", 12020, 0, "cuMemPrefetchAsync_v2" },
        { "cuMemPrefetchAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemPrefetchAsync_v2_ptsz" },
        { "cuMemPrefetchAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemPrefetchAsync_ptsz" },
        { "cuMemAlloc", 3020, 0, "cuMemAlloc_v2" },
        { "cuGetProcAddress", 11030, 0, "cuGetProcAddress" },
        { "cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2" },
        { "cuStreamBeginCapture", 10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamBeginCapture_v2_ptsz" },
        { "cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3" },
        { "cuMemPrefetchBatchAsync", 13000, 0, "cuMemPrefetchBatchAsync" },
        { "cuFuncGetParamInfo", 12040, 0, "cuFuncGetParamInfo" },
        { "cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2" },
        { "cuGraphInstantiate", 12000, 0, "cuGraphInstantiate_v2" }, /* as NVIDIA's 535 and 550 drivers */
        { "cuGraphInstantiateWithParams", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
          "cuGraphInstantiateWithParams_ptsz" },
        { "cuLaunchHostFunc", 13010, 0, "cuLaunchHostFunc" }, /* _v2 is 13010, above driver 13000 */
    };
    int routes_ok = 1;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult qs;
        CUresult r = cuGetProcAddress(routes[i].sym, &p, routes[i].ver, routes[i].flags, &qs);
        void *want_p = dlsym(h, routes[i].abi);
        if (r != CUDA_SUCCESS || !p || p != want_p || qs != CU_GET_PROC_ADDRESS_SUCCESS) {
            routes_ok = 0;
            fprintf(stderr, "route %s/%d/%llu: got %p want %s=%p\n", routes[i].sym, routes[i].ver,
                    (unsigned long long)routes[i].flags, p, routes[i].abi, want_p);
        }
    }
    CHECK(routes_ok, "cuGetProcAddress routes");
    void *p = (void *)1;
    CUdriverProcAddressQueryResult qs;
    OK(cuGetProcAddress("cuNoSuchThing", &p, 13000, 0, &qs));
    CHECK(p == NULL && qs == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown symbol");
    OK(cuGetProcAddress("cuMemPrefetchBatchAsync", &p, 12080, 0, &qs));
    CHECK(p == NULL && qs == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "version not sufficient");
    /* per-thread stream asked below the first _ptsz version: none (NVIDIA's 535 and 550) */
    OK(cuGetProcAddress("cuLaunchKernel", &p, 6000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &qs));
    CHECK(p == NULL && qs == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "no _ptsz before 7000");
    CUresult (*legacy_gpa)(const char *, void **, int, cuuint64_t) =
        (CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(h, "cuGetProcAddress");
    CHECK(legacy_gpa && legacy_gpa("cuMemAllocManaged", &p, 11030, 0) == CUDA_SUCCESS &&
              p == dlsym(h, "cuMemAllocManaged"), "4-argument cuGetProcAddress");
    /* the v1 prefetch ABI (CU_DEVICE_CPU = host) through its own export */
    CUresult (*pf1)(CUdeviceptr, size_t, CUdevice, CUstream) =
        (CUresult(*)(CUdeviceptr, size_t, CUdevice, CUstream))dlsym(h, "cuMemPrefetchAsync");
    CHECK(pf1 && pf1((CUdeviceptr)(uintptr_t)d, PAGE, CU_DEVICE_CPU, s1) == CUDA_SUCCESS, "v1 prefetch to host");
    CHECK(pf1 && pf1((CUdeviceptr)(uintptr_t)d, PAGE, 7, s1) == CUDA_ERROR_INVALID_DEVICE, "v1 bad device");
    OK(cuStreamSynchronize(s1));

    /* 12. pointers, plain and stream-ordered memory */
    unsigned int is_managed = 7;
    CUdeviceptr start = 0;
    size_t range = 0;
    int ordinal = -1;
    CUdeviceptr inner = (CUdeviceptr)(uintptr_t)a + 12345;
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, inner));
    OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner));
    OK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inner));
    OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inner));
    CHECK(is_managed == 1 && start == (CUdeviceptr)(uintptr_t)a && range == big && ordinal == 0, "pointer attributes");
    CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)(uintptr_t)&on_stack) ==
              CUDA_ERROR_INVALID_VALUE, "unknown pointer");
    CUdeviceptr plain = 0, async = 0, base = 0;
    OK(cuMemAlloc(&plain, 1000));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
    CHECK(is_managed == 0 && plain % 256 == 0, "plain allocation");
    OK(cuMemGetAddressRange(&base, &range, plain + 10));
    CHECK(base == plain && range == 1000, "address range");
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(cuMemGetAddressRange(&base, &range, async) == CUDA_ERROR_NOT_FOUND, "freed in stream order");
    CUipcMemHandle ipc;
    OK(cuIpcGetMemHandle(&ipc, plain));
    CHECK(cuIpcGetMemHandle(&ipc, (CUdeviceptr)(uintptr_t)a) == CUDA_ERROR_INVALID_VALUE, "no IPC of managed memory");
    OK(cuMemFree(plain));
    CHECK(cuMemFree(plain) == CUDA_ERROR_INVALID_VALUE, "double free refused");

    /* 12b. memory pools: the managed default pool gives managed memory that faults */
    CUmemoryPool pinned_pool = NULL, managed_pool = NULL, current = NULL, own = NULL;
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    OK(cuMemGetDefaultMemPool(&pinned_pool, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
    OK(cuMemGetDefaultMemPool(&managed_pool, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(pinned_pool && managed_pool && pinned_pool != managed_pool && current == pinned_pool, "default pools");
    OK(cuDeviceGetDefaultMemPool(&current, dev));
    CHECK(current == pinned_pool, "device default pool is the pinned one");
    CHECK(cuMemGetDefaultMemPool(&current, &dev0, CU_MEM_ALLOCATION_TYPE_INVALID) == CUDA_ERROR_INVALID_VALUE,
          "pool type checked");
    CUdeviceptr pooled = 0;
    OK(cuMemAllocFromPoolAsync(&pooled, 4 * PAGE, managed_pool, s1));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, pooled));
    CHECK(is_managed == 1 && pooled % (2 * MiB) == 0, "managed pool memory is managed");
    OK(cuStreamSynchronize(s1));
    fakecuda_reset_stats();
    float *pf = (float *)(uintptr_t)pooled;
    size_t npf = 4 * PAGE / sizeof(float);
    fakecuda_host_touch(pf, 4 * PAGE);
    for (size_t i = 0; i < npf; i++) pf[i] = 1.0f;
    void *args_pf[] = { &pf, &npf };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_pf, NULL));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().gpu_faults == 4 && all_equal(pf, npf, 2.0f), "managed pool memory faults like managed memory");
    /* stream-ordered reuse: while its free has not run, the memory goes to the next allocation
       of the same size from the same pool on the same stream, its pages where they were */
    uint64_t resident_with_pooled = selftest_stats().device_resident_bytes;
    OK(cuLaunchHostFunc(s1, host_hold, &go_free)); /* the frees below wait behind it */
    OK(cuMemFreeAsync(pooled, s1));
    CHECK(cuMemFreeAsync(pooled, s1) == CUDA_ERROR_INVALID_VALUE, "stream-ordered double free refused");
    CUdeviceptr again = 0, other = 0;
    OK(cuMemAllocFromPoolAsync(&other, 4 * PAGE, managed_pool, s2));
    CHECK(other != pooled, "no reuse on another stream");
    OK(cuMemAllocFromPoolAsync(&again, 4 * PAGE, managed_pool, s1));
    CHECK(again == pooled && selftest_stats().allocations_reused == 1, "reused on the same stream");
    OK(cuMemFreeAsync(again, s1));
    OK(cuMemAllocFromPoolAsync(&again, 2 * PAGE, managed_pool, s1));
    CHECK(again != pooled, "no reuse for another size");
    OK(cuMemFreeAsync(again, s1));
    OK(cuMemFreeAsync(other, s2));
    atomic_store(&go_free, 1);
    OK(cuStreamSynchronize(s1));
    OK(cuStreamSynchronize(s2));
    CHECK(selftest_stats().device_resident_bytes == resident_with_pooled - 4 * PAGE &&
              cuMemGetAddressRange(&base, &range, pooled) == CUDA_ERROR_NOT_FOUND,
          "a free that ran gave the memory back");
    CUmemPoolProps props = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = dev0 };
    OK(cuMemPoolCreate(&own, &props));
    OK(cuDeviceSetMemPool(dev, own));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(current == own, "current pool set");
    CHECK(cuDeviceSetMemPool(dev, managed_pool) == CUDA_ERROR_INVALID_VALUE, "a managed pool cannot be current");
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, async));
    CHECK(is_managed == 0, "pinned pool memory is plain");
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamSynchronize(s1)); /* its bytes are free before 12c counts free memory */
    OK(cuMemPoolDestroy(own));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(current == pinned_pool, "destroying the current pool restores the default");
    CHECK(cuMemPoolDestroy(pinned_pool) == CUDA_ERROR_INVALID_VALUE, "a default pool cannot be destroyed");

    /* 12c. cuMemCreate: physical device memory, by handle */
    CUmemAllocationProp vmm = { .type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = dev0 };
    CUmemGenericAllocationHandle phys = 0;
    OK(cuMemGetInfo(&fr, &tot));
    size_t free_before = fr;
    CHECK(cuMemCreate(&phys, 4096, &vmm, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemCreate granularity");
    OK(cuMemCreate(&phys, 2 * MiB, &vmm, 0));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(free_before - fr == 2 * MiB, "cuMemCreate counts against the device");
    OK(cuMemRelease(phys));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == free_before, "cuMemRelease gives it back");

    /* 13. teardown */
    OK(cuMemFree((CUdeviceptr)(uintptr_t)a));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)b));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)c));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)d));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == tot, "all device memory free again");
    /* in a capture, stream-ordered allocation and free are accepted (graph-owned memory is kept, so it comes last) */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamEndCapture(s1, &g));
    OK(cuGraphDestroy(g));
    OK(cuStreamSynchronize(s1));
    OK(cuEventDestroy(ev));
    OK(cuEventDestroy(never));
    OK(cuEventDestroy(t0));
    OK(cuEventDestroy(t1));
    OK(cuEventDestroy(fork_ev));
    OK(cuEventDestroy(join_ev));
    OK(cuStreamDestroy(s1));
    OK(cuStreamDestroy(s2));
    OK(cuStreamDestroy(s3));
    OK(cuLibraryUnload(lib));
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
    for (const struct selftest_driver_mode *m = selftest_driver_modes; m->name; m++)
        CHECK(run_child(m->name, m->env, NULL) == 0, "%s child", m->name);
    CHECK(run_child("driver-cost", "FAKECUDA_IOCTL_THREAD=nobody", NULL) == 2, "bad FAKECUDA_IOCTL_THREAD refused");
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
