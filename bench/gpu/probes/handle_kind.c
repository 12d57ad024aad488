/* handle_kind.c: which kind of handle a program's kernel launches carry, and what the driver's
 * two parameter-info calls answer on each (issue 27, risk 3).  Built as libcuda.so.1 in a
 * directory of its own and put first on LD_LIBRARY_PATH, it stands in for the real driver
 * named by HANDLE_PROBE_DRIVER, and hands out its own wrappers of the calls that make handles
 * (cuLibraryGetKernel gives a CUkernel; cuModuleGetFunction and cuKernelGetFunction give a
 * CUfunction) and of the launch calls: by name and through cuGetProcAddress (both forms).
 *
 * Every other symbol is the real driver's: handle_kind.py links this library against the
 * driver's full path (DT_NEEDED), so the dynamic linker finds whatever this library does not
 * define in the driver, in dlsym on this library's handle as in a program linked against it.
 * CUDA runtimes reach the driver through cuGetProcAddress, but PyTorch's own driver calls
 * (c10's DriverAPI) dlopen libcuda.so.1 and dlsym names such as cuDevicePrimaryCtxGetState:
 * a stand-in exporting only the lookups failed PyTorch's CUDA start on the first H100 run.
 * handle_kind.py checks, before the program runs, that every export of the driver resolves.
 *
 * At exit it writes one JSON object to HANDLE_PROBE_OUT: handles made per origin, launches per
 * kind of handle (kernel, function, or unknown: made before or outside these calls), and for
 * each of the first MAX_DESCRIBED launched handles its name and both calls' answers
 * (cuFuncGetParamInfo on the handle as launched; cuKernelGetParamInfo where it came from
 * cuLibraryGetKernel): the CUresult of index 0 and the offsets and sizes of every parameter. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define TABLE 16384         /* handles remembered: open addressing, power of two */
#define MAX_DESCRIBED 128   /* launched handles whose parameter info is asked */
#define MAX_PARAMS 64       /* parameters listed per handle */

enum origin { UNKNOWN, KERNEL, FUNCTION_OF_MODULE, FUNCTION_OF_KERNEL, ORIGINS };
static const char *const origin_name[ORIGINS] = {"unknown", "cuLibraryGetKernel", "cuModuleGetFunction",
                                                 "cuKernelGetFunction"};

struct handle {
    uintptr_t key;
    enum origin origin;
    int described; /* index into described[] + 1, 0 when not described */
};

struct answer {
    CUresult first; /* index 0's CUresult */
    int count;      /* parameters answered before the first error */
    size_t offset[MAX_PARAMS], size[MAX_PARAMS];
};

struct description {
    char name[160];
    enum origin origin;
    unsigned long long launches;
    struct answer func, kernel;
    int kernel_asked;
};

static void *driver;
static PFN_cuDriverGetVersion_v2020 real_version;
static PFN_cuGetProcAddress_v11030 real_v1;
static PFN_cuGetProcAddress_v12000 real_v2;
static PFN_cuLibraryGetKernel_v12000 real_library_get_kernel;
static PFN_cuModuleGetFunction_v2000 real_module_get_function;
static PFN_cuKernelGetFunction_v12000 real_kernel_get_function;
static PFN_cuLaunchKernel_v4000 real_launch;
static PFN_cuLaunchKernel_v7000_ptsz real_launch_ptsz;
static PFN_cuLaunchKernelEx_v11060 real_launch_ex;
static PFN_cuLaunchKernelEx_v11060_ptsz real_launch_ex_ptsz;
static PFN_cuFuncGetParamInfo_v12040 func_param_info;
static PFN_cuKernelGetParamInfo_v12040 kernel_param_info;
static PFN_cuFuncGetName_v12030 func_get_name;
static PFN_cuKernelGetName_v12030 kernel_get_name;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle handles[TABLE];
static struct description described[MAX_DESCRIBED];
static int n_described;
static unsigned long long made[ORIGINS], launches[ORIGINS], table_full;

static void *own(const char *name)
{
    return driver != NULL ? dlsym(driver, name) : NULL;
}

static void load(void)
{
    const char *path = getenv("HANDLE_PROBE_DRIVER");
    driver = path != NULL ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (driver == NULL) {
        fprintf(stderr, "handle_kind: HANDLE_PROBE_DRIVER=%s: %s\n", path ? path : "(unset)", dlerror());
        return;
    }
    real_v1 = (PFN_cuGetProcAddress_v11030)own("cuGetProcAddress");
    real_v2 = (PFN_cuGetProcAddress_v12000)own("cuGetProcAddress_v2");
    real_version = (PFN_cuDriverGetVersion_v2020)own("cuDriverGetVersion");
    real_library_get_kernel = (PFN_cuLibraryGetKernel_v12000)own("cuLibraryGetKernel");
    real_module_get_function = (PFN_cuModuleGetFunction_v2000)own("cuModuleGetFunction");
    real_kernel_get_function = (PFN_cuKernelGetFunction_v12000)own("cuKernelGetFunction");
    real_launch = (PFN_cuLaunchKernel_v4000)own("cuLaunchKernel");
    real_launch_ptsz = (PFN_cuLaunchKernel_v7000_ptsz)own("cuLaunchKernel_ptsz");
    real_launch_ex = (PFN_cuLaunchKernelEx_v11060)own("cuLaunchKernelEx");
    real_launch_ex_ptsz = (PFN_cuLaunchKernelEx_v11060_ptsz)own("cuLaunchKernelEx_ptsz");
    func_param_info = (PFN_cuFuncGetParamInfo_v12040)own("cuFuncGetParamInfo");
    kernel_param_info = (PFN_cuKernelGetParamInfo_v12040)own("cuKernelGetParamInfo");
    func_get_name = (PFN_cuFuncGetName_v12030)own("cuFuncGetName");
    kernel_get_name = (PFN_cuKernelGetName_v12030)own("cuKernelGetName");
}

/* The slot of key (lock held): its entry, or a free one; NULL when the table is full. */
static struct handle *slot(uintptr_t key)
{
    size_t i = (key >> 4) * 0x9E3779B97F4A7C15ull & (TABLE - 1);
    for (size_t n = 0; n < TABLE; n++, i = (i + 1) & (TABLE - 1))
        if (handles[i].key == key || handles[i].key == 0)
            return &handles[i];
    return NULL;
}

static void remember(const void *handle, enum origin origin)
{
    pthread_mutex_lock(&lock);
    made[origin]++;
    struct handle *h = slot((uintptr_t)handle);
    if (h == NULL)
        table_full++;
    else if (h->key == 0)
        *h = (struct handle){(uintptr_t)handle, origin, 0};
    pthread_mutex_unlock(&lock);
}

typedef CUresult (*param_info_fn)(void *handle, size_t index, size_t *offset, size_t *size);

static void ask(param_info_fn fn, void *handle, struct answer *a)
{
    a->first = CUDA_ERROR_NOT_SUPPORTED; /* this driver has no such call (before CUDA 12.4) */
    if (fn == NULL)
        return;
    for (size_t i = 0; i < MAX_PARAMS; i++) {
        size_t offset = 0, size = 0;
        CUresult r = fn(handle, i, &offset, &size);
        if (i == 0)
            a->first = r;
        if (r != CUDA_SUCCESS)
            break;
        a->offset[a->count] = offset;
        a->size[a->count++] = size;
    }
}

/* Counts a launch of f; the first launch of each of the first MAX_DESCRIBED handles asks its
 * name and parameter info (driver calls, made with the lock released). */
static void launched(CUfunction f)
{
    pthread_mutex_lock(&lock);
    struct handle *h = slot((uintptr_t)f);
    enum origin origin = h != NULL && h->key == (uintptr_t)f ? h->origin : UNKNOWN;
    launches[origin]++;
    int index = -1;
    if (h != NULL && h->key == 0)
        *h = (struct handle){(uintptr_t)f, UNKNOWN, 0};
    if (h != NULL && h->described == 0 && n_described < MAX_DESCRIBED) {
        index = n_described++;
        h->described = index + 1;
        described[index].origin = origin;
    } else if (h != NULL && h->described > 0) {
        described[h->described - 1].launches++;
    }
    pthread_mutex_unlock(&lock);
    if (index < 0)
        return;
    struct description *d = &described[index];
    const char *name = NULL;
    if (origin == KERNEL && kernel_get_name != NULL)
        kernel_get_name(&name, (CUkernel)f);
    else if (origin != KERNEL && func_get_name != NULL)
        func_get_name(&name, f);
    snprintf(d->name, sizeof d->name, "%s", name != NULL ? name : "?");
    ask((param_info_fn)func_param_info, f, &d->func);
    if (origin == KERNEL) {
        d->kernel_asked = 1;
        ask((param_info_fn)kernel_param_info, f, &d->kernel);
    }
    pthread_mutex_lock(&lock);
    d->launches++;
    pthread_mutex_unlock(&lock);
}

/* The wrappers, exported under the driver's names (a program that dlsyms them by name gets
 * them, as one that asks cuGetProcAddress does); a call this driver lacks is not found. */
#define LAUNCH_ARGS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                    unsigned shared, CUstream s, void **params, void **extra
EXPORT CUresult w_library_get_kernel(CUkernel *k, CUlibrary lib, const char *name) __asm__("cuLibraryGetKernel");
EXPORT CUresult w_module_get_function(CUfunction *f, CUmodule mod, const char *name) __asm__("cuModuleGetFunction");
EXPORT CUresult w_kernel_get_function(CUfunction *f, CUkernel k) __asm__("cuKernelGetFunction");
EXPORT CUresult w_launch(LAUNCH_ARGS) __asm__("cuLaunchKernel");
EXPORT CUresult w_launch_ptsz(LAUNCH_ARGS) __asm__("cuLaunchKernel_ptsz");
EXPORT CUresult w_launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
    __asm__("cuLaunchKernelEx");
EXPORT CUresult w_launch_ex_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
    __asm__("cuLaunchKernelEx_ptsz");

CUresult w_library_get_kernel(CUkernel *k, CUlibrary lib, const char *name)
{
    pthread_once(&once, load);
    if (real_library_get_kernel == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real_library_get_kernel(k, lib, name);
    if (r == CUDA_SUCCESS)
        remember(*k, KERNEL);
    return r;
}

CUresult w_module_get_function(CUfunction *f, CUmodule mod, const char *name)
{
    pthread_once(&once, load);
    if (real_module_get_function == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real_module_get_function(f, mod, name);
    if (r == CUDA_SUCCESS)
        remember(*f, FUNCTION_OF_MODULE);
    return r;
}

CUresult w_kernel_get_function(CUfunction *f, CUkernel k)
{
    pthread_once(&once, load);
    if (real_kernel_get_function == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real_kernel_get_function(f, k);
    if (r == CUDA_SUCCESS)
        remember(*f, FUNCTION_OF_KERNEL);
    return r;
}

CUresult w_launch(LAUNCH_ARGS)
{
    pthread_once(&once, load);
    if (real_launch == NULL)
        return CUDA_ERROR_NOT_FOUND;
    launched(f);
    return real_launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}

CUresult w_launch_ptsz(LAUNCH_ARGS)
{
    pthread_once(&once, load);
    if (real_launch_ptsz == NULL)
        return CUDA_ERROR_NOT_FOUND;
    launched(f);
    return real_launch_ptsz(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}

CUresult w_launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    pthread_once(&once, load);
    if (real_launch_ex == NULL)
        return CUDA_ERROR_NOT_FOUND;
    launched(f);
    return real_launch_ex(config, f, params, extra);
}

CUresult w_launch_ex_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    pthread_once(&once, load);
    if (real_launch_ex_ptsz == NULL)
        return CUDA_ERROR_NOT_FOUND;
    launched(f);
    return real_launch_ex_ptsz(config, f, params, extra);
}

EXPORT CUresult trace_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");
EXPORT CUresult trace_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) __asm__("cuGetProcAddress_v2");

/* A driver pointer handed out: ours in its place where we wrap it. */
static void substitute(void **pfn)
{
    if (pfn == NULL || *pfn == NULL)
        return;
    const struct { void *real, *wrapper; } pairs[] = {
        {(void *)real_v1, (void *)&trace_v1}, {(void *)real_v2, (void *)&trace_v2},
        {(void *)real_library_get_kernel, (void *)&w_library_get_kernel},
        {(void *)real_module_get_function, (void *)&w_module_get_function},
        {(void *)real_kernel_get_function, (void *)&w_kernel_get_function},
        {(void *)real_launch, (void *)&w_launch}, {(void *)real_launch_ptsz, (void *)&w_launch_ptsz},
        {(void *)real_launch_ex, (void *)&w_launch_ex}, {(void *)real_launch_ex_ptsz, (void *)&w_launch_ex_ptsz},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (pairs[i].real != NULL && *pfn == pairs[i].real) {
            *pfn = pairs[i].wrapper;
            return;
        }
}

CUresult trace_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    pthread_once(&once, load);
    if (real_v1 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real_v1(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS)
        substitute(pfn);
    return r;
}

CUresult trace_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    pthread_once(&once, load);
    if (real_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS)
        substitute(pfn);
    return r;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    pthread_once(&once, load);
    return real_version != NULL ? real_version(version) : CUDA_ERROR_NOT_INITIALIZED;
}

static void write_answer(FILE *out, const char *key, const struct answer *a)
{
    fprintf(out, "\"%s\": {\"first_result\": %d, \"params\": [", key, (int)a->first);
    for (int i = 0; i < a->count; i++)
        fprintf(out, "%s[%zu, %zu]", i ? ", " : "", a->offset[i], a->size[i]);
    fprintf(out, "]}");
}

static void json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(out, "\\u%04x", *s);
        else
            fputc(*s, out);
    fputc('"', out);
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("HANDLE_PROBE_OUT");
    FILE *out = path != NULL ? fopen(path, "w") : NULL;
    if (out == NULL)
        return;
    pthread_mutex_lock(&lock);
    fprintf(out, "{\"driver_loaded\": %s, \"table_full\": %llu, \"made\": {", driver ? "true" : "false", table_full);
    for (int o = 1; o < ORIGINS; o++)
        fprintf(out, "%s\"%s\": %llu", o > 1 ? ", " : "", origin_name[o], made[o]);
    fprintf(out, "}, \"launches_by_origin\": {");
    for (int o = 0; o < ORIGINS; o++)
        fprintf(out, "%s\"%s\": %llu", o ? ", " : "", origin_name[o], launches[o]);
    fprintf(out, "}, \"described\": [");
    for (int i = 0; i < n_described; i++) {
        const struct description *d = &described[i];
        fprintf(out, "%s{\"name\": ", i ? ", " : "");
        json_string(out, d->name);
        fprintf(out, ", \"origin\": \"%s\", \"launches\": %llu, ", origin_name[d->origin], d->launches);
        write_answer(out, "cuFuncGetParamInfo", &d->func);
        if (d->kernel_asked) {
            fprintf(out, ", ");
            write_answer(out, "cuKernelGetParamInfo", &d->kernel);
        }
        fprintf(out, "}");
    }
    fprintf(out, "]}\n");
    pthread_mutex_unlock(&lock);
    fclose(out);
}
