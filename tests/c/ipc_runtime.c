/* ipc_runtime.c: a stand-in for the shared CUDA runtime, built as
 * libcudart.so.13: cudaMalloc reaches cuMemAlloc from inside the runtime,
 * through a frame of its own, so the driver's caller is the runtime and the
 * library that called cudaMalloc is further up the stack (as with NVIDIA's
 * libcudart, which on fakecuda cannot get past initialisation). */
#include <cuda.h>
#include <stdint.h>

__attribute__((noinline)) static int device_alloc(void **ptr, size_t size)
{
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, size);
    *ptr = (void *)(uintptr_t)p;
    __asm__ volatile("" ::: "memory"); /* no tail call: this frame stays on the stack */
    return r == CUDA_SUCCESS ? 0 : 2;  /* cudaErrorMemoryAllocation */
}

__attribute__((visibility("default"))) int cudaMalloc(void **ptr, size_t size)
{
    int r = device_alloc(ptr, size);
    __asm__ volatile("" ::: "memory");
    return r;
}
