/* routing.c: how driver lookups are answered, checked one by one. Under pump
 * (LD_PRELOAD or linked in) every hooked lookup must give pump's hook for
 * exactly the ABI variant the driver chose; everything else must be the
 * driver's (or libc's) own answer. Prints "routing: N passed, M failed".
 *
 *   routing pump|bare
 */
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>

int rtld_next_from_a(void);

static int passed, failed;

static void expect(int ok, const char *what)
{
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "FAILED: %s\n", what);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "pump") && strcmp(argv[1], "bare"))) {
        fprintf(stderr, "usage: routing pump|bare\n");
        return 2;
    }
    int under_pump = strcmp(argv[1], "pump") == 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL)
        return 4;
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    expect(gpa != NULL, "dlsym(libcuda, cuGetProcAddress_v2)");
    if (gpa == NULL)
        return 1;

    /* Where a pointer lives and under which exported name: pump's hooks are
     * exported under the driver's ABI names, outside libcuda. */
    Dl_info driver;
    if (!dladdr(dlsym(lib, "cuCtxGetCurrent"), &driver))
        return 1;
    struct {
        const char *symbol;
        int version;
        cuuint64_t flags;
        const char *abi; /* the variant the driver must pick */
        int hooked;
    } cases[] = {
        {"cuLaunchKernel", 4000, 0, "cuLaunchKernel", 1},
        {"cuLaunchKernel", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz", 1},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel", 1},
        {"cuLaunchKernelEx", 11060, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchKernelEx_ptsz", 1},
        {"cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel", 1},
        {"cuGraphLaunch", 10000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuGraphLaunch_ptsz", 1},
        {"cuMemAllocManaged", 6000, 0, "cuMemAllocManaged", 1},
        {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2", 1},
        {"cuMemFree", 13000, 0, "cuMemFree_v2", 1},
        {"cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz", 1},
        {"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync", 1},
        {"cuMemAllocFromPoolAsync", 11020, 0, "cuMemAllocFromPoolAsync", 1},
        {"cuStreamSynchronize", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamSynchronize_ptsz", 1},
        {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize", 1},
        {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2", 1},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress", 1},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 1},
        {"cuMemPrefetchAsync", 12020, 0, "cuMemPrefetchAsync_v2", 0},
        {"cuMemPrefetchAsync", 8000, 0, "cuMemPrefetchAsync", 0},
        {"cuCtxGetCurrent", 4000, 0, "cuCtxGetCurrent", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status;
        int want_pump = under_pump && cases[i].hooked;
        char what[200];
        snprintf(what, sizeof what, "cuGetProcAddress(%s, %d, flags %llu) is %s's %s", cases[i].symbol,
                 cases[i].version, (unsigned long long)cases[i].flags, want_pump ? "pump" : "the driver",
                 cases[i].abi);
        CUresult r = gpa(cases[i].symbol, &fn, cases[i].version, cases[i].flags, &status);
        Dl_info where;
        int found = r == CUDA_SUCCESS && fn != NULL && dladdr(fn, &where) && where.dli_sname != NULL;
        expect(found && strcmp(where.dli_sname, cases[i].abi) == 0 &&
                   (where.dli_fbase == driver.dli_fbase) == !want_pump,
               what);
        /* Triton's way, dlsym on the libcuda handle, gives the same pointer. */
        snprintf(what, sizeof what, "dlsym(libcuda, %s) agrees", cases[i].abi);
        expect(found && dlsym(lib, cases[i].abi) == fn, what);
    }

    /* A symbol newer than the driver: NULL, as the driver says. */
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult status;
    expect(gpa("cuNoSuchFunction", &fn, 13000, 0, &status) == CUDA_SUCCESS && fn == NULL,
           "unknown symbol gives NULL");
    dlerror();
    expect(dlsym(lib, "cuNoSuchFunction") == NULL && dlerror() != NULL, "dlsym miss keeps dlerror");
    expect(dlsym(RTLD_DEFAULT, "cuNoSuchFunction") == NULL, "RTLD_DEFAULT miss");
    /* Lookups pump does not own are untouched. */
    expect(dlsym(RTLD_DEFAULT, "strlen") == (void *)strlen, "dlsym(strlen)");
    expect(rtld_next_from_a() == 2, "RTLD_NEXT resolves relative to the caller");

    printf("routing: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
