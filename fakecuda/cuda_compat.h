/* cuda_compat.h: why it exists: fakecuda builds with the cuda.h of CUDA 13.0 (what PyTorch's
 * CUDA build pins: nvidia-cuda-runtime 13.0.96) as well as later ones. Names newer than the
 * header in use are declared here with the values and prototypes of CUDA 13.5's cuda.h and
 * cudaTypedefs.h (nvidia-cuda-runtime 13.5.37), under the release that brought them. Included by
 * fakecuda_internal.h and selftest.h; with a header that has them, it adds nothing. */
#ifndef FAKECUDA_CUDA_COMPAT_H
#define FAKECUDA_CUDA_COMPAT_H

#include <cuda.h>

#if CUDA_VERSION < 13010
/* CUmemPool_attribute after CU_MEMPOOL_ATTR_USED_MEM_HIGH (8), in 13.5's order. */
#define CU_MEMPOOL_ATTR_ALLOCATION_TYPE ((CUmemPool_attribute)9)
#define CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES ((CUmemPool_attribute)10)
#define CU_MEMPOOL_ATTR_LOCATION_ID ((CUmemPool_attribute)11)
#define CU_MEMPOOL_ATTR_LOCATION_TYPE ((CUmemPool_attribute)12)
#define CU_MEMPOOL_ATTR_MAX_POOL_SIZE ((CUmemPool_attribute)13)
#define CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED ((CUmemPool_attribute)14)
#define CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID ((CUmemPool_attribute)15)

/* cuLaunchHostFunc_v2 (13.1: a host function with a synchronisation mode). */
CUresult CUDAAPI cuLaunchHostFunc_v2(CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode);
CUresult CUDAAPI cuLaunchHostFunc_v2_ptsz(CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode);
typedef CUresult(CUDAAPI *PFN_cuLaunchHostFunc_v13010)(CUstream hStream, CUhostFn fn, void *userData,
                                                        unsigned int syncMode);
typedef CUresult(CUDAAPI *PFN_cuLaunchHostFunc_v13010_ptsz)(CUstream hStream, CUhostFn fn, void *userData,
                                                             unsigned int syncMode);
#endif

#if CUDA_VERSION < 13020
/* A kernel's parameter count (13.2). */
CUresult CUDAAPI cuFuncGetParamCount(CUfunction func, size_t *paramCount);
CUresult CUDAAPI cuKernelGetParamCount(CUkernel kernel, size_t *paramCount);
typedef CUresult(CUDAAPI *PFN_cuFuncGetParamCount_v13020)(CUfunction func, size_t *paramCount);
typedef CUresult(CUDAAPI *PFN_cuKernelGetParamCount_v13020)(CUkernel kernel, size_t *paramCount);
#endif

#endif
