/* unbound_driver.c: why it exists: a driver linked without -Bsymbolic, as the issue "What
 * a real job would hit today" (item 9) describes, built as libcuda.so.1 in a directory of
 * its own. Its references to its own exports go through the PLT and GOT, so with pump
 * preloaded they bind to pump's hooks: cuGetProcAddress answers with pump's hooks, and
 * cuMemAllocManaged's call to cuMemGetInfo_v2 lands in pump's hook while pump's
 * cuMemAllocManaged hook is running. Just enough of a driver for tests/c/unbound.c:
 * one device, host memory standing in for managed memory. Never built with
 * -fvisibility=hidden or -Bsymbolic (that is the point). */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define DEVICE_MEMORY ((size_t)1 << 30)

static size_t in_use;
static int context_tag;
static int foreign_answers; /* internal memory queries answered by someone else's view */

/* How many of cuMemAllocManaged's own memory queries did not reach this driver's
 * function (an interposer's view of memory came back instead). */
EXPORT int unbound_driver_foreign_answers(void)
{
    return __atomic_load_n(&foreign_answers, __ATOMIC_RELAXED);
}

EXPORT CUresult cuInit(unsigned int flags)
{
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    *version = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    *count = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    *device = 0;
    return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* A device with concurrent managed access (what managed_all asks), nothing else. */
EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device)
{
    *value = attribute == CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS;
    return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    *ctx = (CUcontext)&context_tag;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    *device = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    size_t used = __atomic_load_n(&in_use, __ATOMIC_RELAXED);
    if (free_bytes != NULL)
        *free_bytes = DEVICE_MEMORY - used;
    if (total_bytes != NULL)
        *total_bytes = DEVICE_MEMORY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    size_t free_bytes, total_bytes;
    CUresult r = cuMemGetInfo_v2(&free_bytes, &total_bytes); /* through the PLT: pump's hook */
    if (r != CUDA_SUCCESS)
        return r;
    if (total_bytes != DEVICE_MEMORY)
        __atomic_add_fetch(&foreign_answers, 1, __ATOMIC_RELAXED);
    if (bytesize == 0 || bytesize > free_bytes)
        return bytesize == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
    void *p = calloc(1, bytesize);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&in_use, bytesize, __ATOMIC_RELAXED);
    *dptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    free((void *)dptr);
    return CUDA_SUCCESS;
}

/* The driver's 4- and 5-argument lookups (cuda.h maps cuGetProcAddress to _v2). */
EXPORT CUresult lookup_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");
EXPORT CUresult lookup_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) __asm__("cuGetProcAddress_v2");

CUresult lookup_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                   CUdriverProcAddressQueryResult *status)
{
    (void)flags;
    /* Each address below is taken through the GOT: pump's hook where pump has one. */
    const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuInit", (void *)&cuInit},
        {"cuDriverGetVersion", (void *)&cuDriverGetVersion},
        {"cuDeviceGetCount", (void *)&cuDeviceGetCount},
        {"cuDeviceGet", (void *)&cuDeviceGet},
        {"cuDeviceGetAttribute", (void *)&cuDeviceGetAttribute},
        {"cuCtxGetCurrent", (void *)&cuCtxGetCurrent},
        {"cuCtxGetDevice", (void *)&cuCtxGetDevice},
        {"cuMemGetInfo", (void *)&cuMemGetInfo_v2},
        {"cuMemAllocManaged", (void *)&cuMemAllocManaged},
        {"cuMemFree", (void *)&cuMemFree_v2},
        {"cuGetProcAddress", version >= 12000 ? (void *)&lookup_v2 : (void *)&lookup_v1},
    };
    *pfn = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, symbol) == 0)
            *pfn = table[i].fn;
    if (status != NULL)
        *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

CUresult lookup_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return lookup_v2(symbol, pfn, version, flags, NULL);
}
