/* selftest_launches.c: why it exists: the launch topics of fakecuda's self-test main sequence
 * (selftest.c runs them in order on what it set up): the extra form, cuLaunchKernelEx, the
 * default stream and cooperative launches; libraries, CUkernel handles and parameter info; the
 * noop kernel; and cuGetProcAddress routing (the pointer it gives is dlsym's of the ABI export,
 * per version and flags). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"
#include "selftest.h"

#define MiB (1024u * 1024u)
#define PAGE (64u * 1024u)
void selftest_launches(struct selftest_main *m)
{
    CUstream s1 = m->s1;
    CUfunction fdouble = m->fdouble, flayout = m->flayout, fnoop = m->fnoop;
    float *b = m->b;
    const size_t nbig = 16 * MiB / sizeof(float);
    void *args_b[] = { &b, (void *)&nbig };

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
    CHECK(selftest_all_equal(b, nbig, 96.0f), "extra/Ex/default/cooperative launches (b[0]=%g)", (double)b[0]);

    /* 6. libraries and CUkernel handles; parameter info */
    CUlibrary lib;
    CUkernel kern;
    CUfunction fk;
    OK(cuLibraryLoadData(&lib, "anything", NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&kern, lib, "double"));
    CHECK((void *)kern != (void *)fdouble, "CUkernel is a different handle");
    OK(cuKernelGetFunction(&fk, kern));
    CUfunction fk_again = NULL;
    OK(cuKernelGetFunction(&fk_again, kern));
    const char *fk_name = NULL;
    OK(cuFuncGetName(&fk_name, fk));
    CHECK(fk == fk_again && fk != fdouble && !strcmp(fk_name, "double"), "cuKernelGetFunction: the library's own");
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
    /* a library from a file (cuDNN's dlsym lookup) is the same library; a missing file is named */
    char path[] = "/tmp/fakecuda-selftest-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, "anything", 8) == 8 && close(fd) == 0, "a library file");
    CUlibrary file_lib;
    CUkernel file_kern;
    OK(cuLibraryLoadFromFile(&file_lib, path, NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&file_kern, file_lib, "double"));
    OK(cuLibraryUnload(file_lib));
    unlink(path);
    CHECK(cuLibraryLoadFromFile(&file_lib, path, NULL, NULL, 0, NULL, NULL, 0) == CUDA_ERROR_FILE_NOT_FOUND,
          "cuLibraryLoadFromFile of a missing file");
    /* the unversioned context names the real driver keeps exporting are the _v2 calls */
    CHECK(dlsym(RTLD_DEFAULT, "cuCtxPushCurrent") == dlsym(RTLD_DEFAULT, "cuCtxPushCurrent_v2") &&
          dlsym(RTLD_DEFAULT, "cuCtxPopCurrent") == dlsym(RTLD_DEFAULT, "cuCtxPopCurrent_v2") &&
          dlsym(RTLD_DEFAULT, "cuCtxPushCurrent") != NULL, "cuCtxPushCurrent and cuCtxPopCurrent exported");
    /* the enumerations list the same handles as the lookups by name */
    unsigned nfunc = 0, nkern = 0;
    CUmodule mod;
    OK(cuModuleLoadData(&mod, "anything"));
    CUfunction mod_double;
    OK(cuModuleGetFunction(&mod_double, mod, "double"));
    OK(cuModuleGetFunctionCount(&nfunc, mod));
    OK(cuLibraryGetKernelCount(&nkern, lib));
    CHECK(nfunc >= 2 && nfunc == nkern, "function and kernel counts (%u, %u)", nfunc, nkern);
    CUfunction *funcs = calloc(nfunc, sizeof *funcs);
    CUkernel *kerns = calloc(nkern, sizeof *kerns);
    OK(cuModuleEnumerateFunctions(funcs, nfunc, mod));
    OK(cuLibraryEnumerateKernels(kerns, nkern, lib));
    int listed = 0;
    for (unsigned i = 0; i < nfunc; i++) listed += (funcs[i] == mod_double) + 2 * (kerns[i] == kern);
    CHECK(listed == 3, "enumerated handles are the looked-up ones");
    free(funcs);
    free(kerns);
    /* an unloaded module's handles are dead, and their addresses handed out again */
    CUfunction reused = NULL;
    OK(cuModuleUnload(mod));
    CHECK(cuLaunchKernel(mod_double, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL) == CUDA_ERROR_INVALID_HANDLE,
          "an unloaded module's function is refused");
    OK(cuModuleLoadData(&mod, "anything"));
    OK(cuModuleGetFunction(&reused, mod, "layout"));
    CHECK(reused == mod_double, "a freed function's address is handed out again");
    OK(cuFuncGetParamInfo(reused, 3, &off, &size));
    OK(cuModuleUnload(mod));
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
    m->lib = lib;
}

void selftest_routing(struct selftest_main *m)
{
    CUstream s1 = m->s1;
    void *h = m->libcuda;
    float *d = m->d;

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
}
