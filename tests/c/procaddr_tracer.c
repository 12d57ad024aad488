/* procaddr_tracer.c: why it exists: to learn which (symbol, version, flags) lookups a
 * CUDA runtime makes, the runtime is run over this library, built as libcuda.so.1 in a
 * directory of its own. It loads the driver named by PUMP_TRACE_DRIVER, forwards every
 * cuGetProcAddress to it and appends "symbol version flags" lines to PUMP_TRACE_OUT.
 * Asked for cuGetProcAddress itself it answers with its own, since the runtime makes
 * all later lookups through that pointer (research/INTERPOSITION.md 1.1).
 * tests/test_real_libcuda.py uses the lines as the runtimes' lookups. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static void *driver;
static PFN_cuDriverGetVersion_v2020 real_version;
static PFN_cuGetProcAddress_v11030 real_v1;
static PFN_cuGetProcAddress_v12000 real_v2;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void load(void)
{
    const char *path = getenv("PUMP_TRACE_DRIVER");
    driver = path != NULL ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (driver == NULL) {
        fprintf(stderr, "procaddr_tracer: PUMP_TRACE_DRIVER=%s: %s\n", path ? path : "(unset)", dlerror());
        return;
    }
    real_v1 = (PFN_cuGetProcAddress_v11030)dlsym(driver, "cuGetProcAddress");
    real_v2 = (PFN_cuGetProcAddress_v12000)dlsym(driver, "cuGetProcAddress_v2");
    real_version = (PFN_cuDriverGetVersion_v2020)dlsym(driver, "cuDriverGetVersion");
}

/* The CUDA 13 runtime asks for the driver's version by name before any lookup. */
EXPORT CUresult cuDriverGetVersion(int *version)
{
    pthread_once(&once, load);
    return real_version != NULL ? real_version(version) : CUDA_ERROR_NOT_INITIALIZED;
}

/* Exported under the driver's names (cuda.h maps cuGetProcAddress to _v2). */
EXPORT CUresult trace_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");
EXPORT CUresult trace_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) __asm__("cuGetProcAddress_v2");

static void record(const char *symbol, int version, cuuint64_t flags, void **pfn)
{
    const char *path = getenv("PUMP_TRACE_OUT");
    if (path != NULL && symbol != NULL) {
        pthread_mutex_lock(&out_lock);
        FILE *out = fopen(path, "a");
        if (out != NULL) {
            fprintf(out, "%s %d %llu\n", symbol, version, (unsigned long long)flags);
            fclose(out);
        }
        pthread_mutex_unlock(&out_lock);
    }
    if (pfn != NULL && *pfn != NULL) {
        if (*pfn == (void *)real_v1)
            *pfn = (void *)&trace_v1;
        else if (*pfn == (void *)real_v2)
            *pfn = (void *)&trace_v2;
    }
}

CUresult trace_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    pthread_once(&once, load);
    if (real_v1 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real_v1(symbol, pfn, version, flags);
    record(symbol, version, flags, r == CUDA_SUCCESS ? pfn : NULL);
    return r;
}

CUresult trace_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                  CUdriverProcAddressQueryResult *status)
{
    pthread_once(&once, load);
    if (real_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real_v2(symbol, pfn, version, flags, status);
    record(symbol, version, flags, r == CUDA_SUCCESS ? pfn : NULL);
    return r;
}
