/* selftest_copies.c: why it exists: fakecuda's self-test of cuMemcpy* and cuMemsetD*, in a
 * child process of its own (selftest.c runs it): values copied and set, managed operands on
 * the device side faulting to the device, a managed operand on the host side coming back to
 * the host, invalid operands refused, and each call's host cost counted. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#include "fakecuda.h"
#include "selftest.h"

#define PAGE (64u * 1024u)
#define PAGES 8u
#define BYTES ((size_t)PAGES * PAGE)

static CUdeviceptr managed_on_host(void)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_GLOBAL));
    fakecuda_host_touch((void *)(uintptr_t)p, BYTES);
    memset((void *)(uintptr_t)p, 0, BYTES);
    return p;
}

static uint64_t calls(const char *entry)
{
    struct fakecuda_entry_cost c = { 0, 0, 0 };
    fakecuda_get_entry_cost(entry, &c);
    return c.calls;
}

int selftest_child_copies(void)
{
    CUcontext ctx;
    CUstream s;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) {
        CHECK(0, "child setup");
        return 1;
    }
    static uint32_t host[BYTES / 4];
    CUdeviceptr m = managed_on_host(), plain = 0;
    OK(cuMemAlloc(&plain, BYTES));

    /* A memset of managed memory runs on the device: every page faults there. */
    fakecuda_reset_stats();
    OK(cuMemsetD32(m, 0x3f800000u, BYTES / 4));
    struct fakecuda_stats st = selftest_stats();
    CHECK(st.gpu_faults == PAGES && st.device_resident_bytes == BYTES, "memset faults %llu, resident %llu",
          (unsigned long long)st.gpu_faults, (unsigned long long)st.device_resident_bytes);
    CHECK(((float *)(uintptr_t)m)[PAGES * PAGE / 4 - 1] == 1.0f, "memset value");
    CHECK(calls("memset") == 1, "memset charged");

    /* DtoH reads the managed source on the device: no fault now (it is there); to the host
     * buffer, which is not managed. */
    fakecuda_reset_stats();
    OK(cuMemcpyDtoH(host, m, BYTES));
    CHECK(selftest_stats().gpu_faults == 0 && host[7] == 0x3f800000u, "DtoH from device-resident managed memory");
    CHECK(calls("memcpy") == 1, "memcpy charged");

    /* HtoD with a managed host-side source: the host reads it, its pages come back. */
    fakecuda_reset_stats();
    OK(cuMemcpyHtoD(plain, (const void *)(uintptr_t)m, BYTES));
    st = selftest_stats();
    CHECK(st.cpu_faults == PAGES && st.device_resident_bytes == 0, "managed host-side source back on the host (%llu)",
          (unsigned long long)st.cpu_faults);
    CHECK(((uint32_t *)(uintptr_t)plain)[3] == 0x3f800000u, "HtoD value");

    /* cuMemcpyAsync, unified addressing: a managed destination is the device side. */
    fakecuda_reset_stats();
    OK(cuMemsetD8Async(plain, 7, BYTES, s));
    OK(cuMemcpyAsync(m, plain, BYTES, s));
    OK(cuStreamSynchronize(s));
    st = selftest_stats();
    CHECK(st.gpu_faults == PAGES && ((unsigned char *)(uintptr_t)m)[BYTES - 1] == 7, "async copy into managed (%llu)",
          (unsigned long long)st.gpu_faults);
    OK(cuMemsetD16Async(m, 0x0102, BYTES / 2, s));
    OK(cuMemcpyDtoDAsync(plain, m, BYTES, s));
    OK(cuStreamSynchronize(s));
    CHECK(((uint16_t *)(uintptr_t)plain)[5] == 0x0102, "D16 memset and DtoD");

    /* Refused: a host pointer where device memory is needed, a range past the allocation. */
    CHECK(cuMemsetD8((CUdeviceptr)(uintptr_t)host, 0, 16) == CUDA_ERROR_INVALID_VALUE, "memset of host memory");
    CHECK(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)host, host, 16) == CUDA_ERROR_INVALID_VALUE, "HtoD to host memory");
    CHECK(cuMemcpyDtoD(plain, m + PAGE, BYTES) == CUDA_ERROR_INVALID_VALUE, "past the allocation's end");
    OK(cuMemFree(plain));
    OK(cuMemFree(m));
    OK(cuStreamDestroy(s));
    return failed ? 1 : 0;
}
