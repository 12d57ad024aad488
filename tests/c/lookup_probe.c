/* lookup_probe.c: why it exists: tests/test_real_libcuda.py asks, against NVIDIA's real
 * libcuda (and fakecuda), what the driver answers to each lookup and what the program
 * gets from the same lookup, with or without pump. Each line of stdin is a request:
 *   q SYMBOL VERSION FLAGS   cuGetProcAddress_v2 and the 4-argument form
 *   d NAME                   dlsym(libcuda, NAME) and dlsym(RTLD_DEFAULT, NAME)
 * and each answer is one JSON line. A pointer is named by where it lives: "driver:NAME"
 * (an export of libcuda.so.1), "driver:+0xOFFSET" (inside it, not exported), "pump:NAME"
 * (one of pump's hooks), "other:FILE:NAME", or null. The driver's own answers come
 * through glibc's dlsym, which pump does not interpose. Built twice: plain (pump
 * preloaded, or bare) and linked with the shim's objects (PUMP_PROBE_LINKED), which
 * also prints the real function each hook wraps. First and last lines: the driver's
 * version and cuInit's answer as the program sees them, then what a few hooked entry
 * points answer with no device (the program's view of pump standing aside). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PUMP_PROBE_LINKED
#include "hooks.h"
#endif

typedef void *(*dlsym_fn)(void *, const char *);

static void *driver;
static dlsym_fn glibc_dlsym;

/* glibc's own dlsym, from libc's handle (libdl's before glibc 2.34). */
static dlsym_fn find_glibc_dlsym(void)
{
    static const char *const where[][2] = {{"libc.so.6", "GLIBC_2.34"}, {"libdl.so.2", "GLIBC_2.2.5"},
                                           {"libdl.so.2", "GLIBC_2.17"}};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        void *lib = dlopen(where[i][0], RTLD_NOW | RTLD_NOLOAD);
        dlsym_fn fn = lib != NULL ? (dlsym_fn)dlvsym(lib, "dlsym", where[i][1]) : NULL;
        if (fn != NULL)
            return fn;
    }
    return NULL;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

/* Prints a pointer's name as a JSON value. */
static void print_where(void *ptr)
{
    if (ptr == NULL) {
        printf("null");
        return;
    }
#ifdef PUMP_PROBE_LINKED
    for (int i = 0; i < PUMP_HOOK_COUNT; i++)
        if (pump_hooks[i].hook == ptr) {
            printf("\"pump:%s\"", pump_hooks[i].name);
            return;
        }
#endif
    Dl_info info;
    if (!dladdr(ptr, &info) || info.dli_fname == NULL) {
        printf("\"unknown\"");
        return;
    }
    const char *file = base_name(info.dli_fname);
    const char *name = info.dli_saddr == ptr ? info.dli_sname : NULL;
    Dl_info drv;
    void *cu_init = glibc_dlsym(driver, "cuInit");
    if (cu_init != NULL && dladdr(cu_init, &drv) && drv.dli_fbase == info.dli_fbase) {
        if (name != NULL)
            printf("\"driver:%s\"", name);
        else
            printf("\"driver:+0x%lx\"", (unsigned long)((char *)ptr - (char *)info.dli_fbase));
    } else if (strncmp(file, "libpump", 7) == 0 && name != NULL) {
        printf("\"pump:%s\"", name);
    } else {
        printf("\"other:%s:%s\"", file, name != NULL ? name : "?");
    }
}

static void query(const char *symbol, int version, cuuint64_t flags, PFN_cuGetProcAddress_v12000 real,
                  PFN_cuGetProcAddress_v12000 program_v2, PFN_cuGetProcAddress_v11030 program_v1)
{
    void *fn = NULL, *fn_v2 = NULL, *fn_v1 = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS, status_v2 = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = real(symbol, &fn, version, flags, &status);
    CUresult r2 = program_v2(symbol, &fn_v2, version, flags, &status_v2);
    CUresult r1 = program_v1 != NULL ? program_v1(symbol, &fn_v1, version, flags) : CUDA_ERROR_NOT_FOUND;
    printf("{\"q\": [\"%s\", %d, %llu], \"rc\": %d, \"status\": %d, \"driver\": ", symbol, version,
           (unsigned long long)flags, (int)r, (int)status);
    print_where(fn);
    printf(", \"rc_v2\": %d, \"status_v2\": %d, \"program_v2\": ", (int)r2, (int)status_v2);
    print_where(fn_v2);
    printf(", \"rc_v1\": %d, \"program_v1\": ", (int)r1);
    print_where(program_v1 != NULL ? fn_v1 : NULL);
    printf("}\n");
}

static void lookup(const char *name)
{
    printf("{\"d\": \"%s\", \"driver\": ", name);
    print_where(glibc_dlsym(driver, name));
    printf(", \"program\": ");
    print_where(dlsym(driver, name));
    printf(", \"default\": ");
    print_where(dlsym(RTLD_DEFAULT, name));
    printf("}\n");
}

/* What hooked entry points answer a program on a machine without a GPU. */
static void standing_aside(void)
{
    PFN_cuInit_v2000 init = (PFN_cuInit_v2000)dlsym(driver, "cuInit");
    PFN_cuMemAllocManaged_v6000 alloc_managed = (PFN_cuMemAllocManaged_v6000)dlsym(driver, "cuMemAllocManaged");
    PFN_cuMemAlloc_v3020 alloc = (PFN_cuMemAlloc_v3020)dlsym(driver, "cuMemAlloc_v2");
    PFN_cuMemGetInfo_v3020 info = (PFN_cuMemGetInfo_v3020)dlsym(driver, "cuMemGetInfo_v2");
    PFN_cuCtxSynchronize_v2000 sync = (PFN_cuCtxSynchronize_v2000)dlsym(driver, "cuCtxSynchronize");
    PFN_cuLaunchKernel_v4000 launch = (PFN_cuLaunchKernel_v4000)dlsym(driver, "cuLaunchKernel");
    if (!init || !alloc_managed || !alloc || !info || !sync || !launch) {
        printf("{\"aside\": null}\n");
        return;
    }
    CUdeviceptr p = 0;
    size_t free_bytes = 0, total_bytes = 0;
    int r_init = init(0);
    int r_managed = alloc_managed(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL);
    int r_alloc = alloc(&p, 1 << 20);
    int r_info = info(&free_bytes, &total_bytes);
    int r_sync = sync();
    int r_launch = launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("{\"aside\": {\"cuInit\": %d, \"cuMemAllocManaged\": %d, \"cuMemAlloc_v2\": %d, \"cuMemGetInfo_v2\": %d, "
           "\"cuCtxSynchronize\": %d, \"cuLaunchKernel\": %d, \"cuInit_again\": %d}}\n",
           r_init, r_managed, r_alloc, r_info, r_sync, r_launch, init(0));
}

int main(void)
{
    glibc_dlsym = find_glibc_dlsym();
    driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (glibc_dlsym == NULL || driver == NULL) {
        fprintf(stderr, "lookup_probe: %s\n", glibc_dlsym == NULL ? "glibc's dlsym not found" : dlerror());
        return 4;
    }
    PFN_cuGetProcAddress_v12000 real = (PFN_cuGetProcAddress_v12000)glibc_dlsym(driver, "cuGetProcAddress_v2");
    PFN_cuGetProcAddress_v12000 program_v2 = (PFN_cuGetProcAddress_v12000)dlsym(driver, "cuGetProcAddress_v2");
    PFN_cuGetProcAddress_v11030 program_v1 = (PFN_cuGetProcAddress_v11030)dlsym(driver, "cuGetProcAddress");
    PFN_cuDriverGetVersion_v2020 version = (PFN_cuDriverGetVersion_v2020)dlsym(driver, "cuDriverGetVersion");
    int driver_version = 0;
    if (real == NULL || program_v2 == NULL || version == NULL || version(&driver_version) != CUDA_SUCCESS) {
        fprintf(stderr, "lookup_probe: the driver lacks cuGetProcAddress_v2 or cuDriverGetVersion\n");
        return 4;
    }
    printf("{\"driver_version\": %d}\n", driver_version);
    char line[512], symbol[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        int v;
        unsigned long long flags;
        if (sscanf(line, "q %255s %d %llu", symbol, &v, &flags) == 3)
            query(symbol, v, flags, real, program_v2, program_v1);
        else if (sscanf(line, "d %255s", symbol) == 1)
            lookup(symbol);
        else if (line[0] != '\n') {
            fprintf(stderr, "lookup_probe: bad request: %s", line);
            return 2;
        }
    }
#ifdef PUMP_PROBE_LINKED
    /* What each hook forwards to (resolved by now: the lookups went through pump). */
    for (int i = 0; i < PUMP_HOOK_COUNT; i++) {
        printf("{\"hook\": \"%s\", \"wraps\": ", pump_hooks[i].name);
        print_where(pump_real[i]);
        printf("}\n");
    }
    /* pump's own calls, those a wrong answer would deadlock or mislead. */
    const struct {
        const char *name;
        void *fn;
    } own[] = {
        {"mem_get_info", (void *)pump_driver.mem_get_info},
        {"ctx_get_current", (void *)pump_driver.ctx_get_current},
        {"ctx_get_device", (void *)pump_driver.ctx_get_device},
        {"stream_create", (void *)pump_driver.stream_create},
        {"event_record", (void *)pump_driver.event_record},
        {"stream_wait_event", (void *)pump_driver.stream_wait_event},
        {"prefetch_v1", (void *)pump_driver.prefetch_v1},
        {"prefetch_v2", (void *)pump_driver.prefetch_v2},
        {"prefetch_batch", (void *)pump_driver.prefetch_batch},
        {"func_param_info", (void *)pump_driver.func_param_info},
        {"kernel_param_info", (void *)pump_driver.kernel_param_info},
        {"pointer_get_attribute", (void *)pump_driver.pointer_get_attribute},
        {"graph_kernel_node_get_params", (void *)pump_driver.graph_kernel_node_get_params},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        printf("{\"own\": \"%s\", \"is\": ", own[i].name);
        print_where(own[i].fn);
        printf("}\n");
    }
#endif
    standing_aside();
    return 0;
}
