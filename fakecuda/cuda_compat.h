/* cuda_compat.h: why it exists: fakecuda builds with the cuda.h of CUDA 13.0 (what PyTorch's
 * CUDA build pins: nvidia-cuda-runtime 13.0.96) as well as later ones, and with CUDA 12's from
 * 12.4 (issue 43 item 3). Names newer than the header in use are declared here with the values
 * and prototypes of CUDA 13.5's cuda.h and cudaTypedefs.h (nvidia-cuda-runtime 13.5.37), under
 * the release that brought them (where a 12.x header lacks a name its PFN's version gives, under
 * the first release whose header has it). A struct a later release grew is written through a
 * layout of its own where it is answered (context_extras.c's CUdevSmResource). Included by
 * fakecuda_internal.h and selftest.h; with a header that has them, it adds nothing. */
#ifndef FAKECUDA_CUDA_COMPAT_H
#define FAKECUDA_CUDA_COMPAT_H

#include <cuda.h>
#include <cudaTypedefs.h>

#if CUDA_VERSION < 12050
/* Context creation parameters (CUDA in graphics), a context's events, a stream's green context
 * (12.5). */
typedef enum CUcigDataType_enum {
    CIG_DATA_TYPE_D3D12_COMMAND_QUEUE = 0x1,
    CIG_DATA_TYPE_NV_BLOB = 0x2,
} CUcigDataType;
typedef struct CUctxCigParam_st {
    CUcigDataType sharedDataType;
    void *sharedData;
} CUctxCigParam;
typedef struct CUctxCreateParams_st {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;
#define CU_LIMIT_CIG_ENABLED 0x08
CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent);
CUresult CUDAAPI cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent);
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
typedef CUresult(CUDAAPI *PFN_cuCtxCreate_v12050)(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                                   unsigned int flags, CUdevice dev);
typedef CUresult(CUDAAPI *PFN_cuCtxRecordEvent_v12050)(CUcontext hCtx, CUevent hEvent);
typedef CUresult(CUDAAPI *PFN_cuCtxWaitEvent_v12050)(CUcontext hCtx, CUevent hEvent);
typedef CUresult(CUDAAPI *PFN_cuStreamGetCtx_v12050)(CUstream hStream, CUcontext *pctx, CUgreenCtx *pGreenCtx);
typedef PFN_cuStreamGetCtx_v12050 PFN_cuStreamGetCtx_v12050_ptsz;
#endif

#if CUDA_VERSION < 12080
/* Wide im2col tensor maps, the packed data types after CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ (12)
 * and the swizzles of 32 and 64-byte atoms, a stream's device, event times with the _v2 rule
 * (12.8). */
typedef enum CUtensorMapIm2ColWideMode_enum {
    CU_TENSOR_MAP_IM2COL_WIDE_MODE_W = 0,
    CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128
} CUtensorMapIm2ColWideMode;
#define CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B 13 /* int, as an enumerator is */
#define CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B 14
#define CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B 15
#define CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B 4 /* after CU_TENSOR_MAP_SWIZZLE_128B (3) */
#define CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B_FLIP_8B 5
#define CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B 6
CUresult CUDAAPI cuTensorMapEncodeIm2colWide(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void *globalAddress,
    const cuuint64_t *globalDim, const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t *elementStrides, CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill);
CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice *device);
CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device);
CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
typedef CUresult(CUDAAPI *PFN_cuTensorMapEncodeIm2colWide_v12080)(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void *globalAddress,
    const cuuint64_t *globalDim, const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t *elementStrides, CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill);
typedef CUresult(CUDAAPI *PFN_cuStreamGetDevice_v12080)(CUstream hStream, CUdevice *device);
typedef PFN_cuStreamGetDevice_v12080 PFN_cuStreamGetDevice_v12080_ptsz;
typedef CUresult(CUDAAPI *PFN_cuEventElapsedTime_v12080)(float *pMilliseconds, CUevent hStart, CUevent hEnd);
#endif

#if CUDA_VERSION < 12090
/* The driver's log (12.9). */
typedef enum CUlogLevel_enum {
    CU_LOG_LEVEL_ERROR = 0,
    CU_LOG_LEVEL_WARNING = 1
} CUlogLevel;
typedef struct CUlogsCallbackEntry_st *CUlogsCallbackHandle;
typedef void(CUDA_CB *CUlogsCallback)(void *data, CUlogLevel logLevel, char *message, size_t length);
typedef unsigned int CUlogIterator;
CUresult CUDAAPI cuLogsRegisterCallback(CUlogsCallback callbackFunc, void *userData,
                                        CUlogsCallbackHandle *callback_out);
CUresult CUDAAPI cuLogsUnregisterCallback(CUlogsCallbackHandle callback);
CUresult CUDAAPI cuLogsCurrent(CUlogIterator *iterator_out, unsigned int flags);
CUresult CUDAAPI cuLogsDumpToFile(CUlogIterator *iterator, const char *pathToFile, unsigned int flags);
CUresult CUDAAPI cuLogsDumpToMemory(CUlogIterator *iterator, char *buffer, size_t *size, unsigned int flags);
typedef CUresult(CUDAAPI *PFN_cuLogsRegisterCallback_v12090)(CUlogsCallback callbackFunc, void *userData,
                                                             CUlogsCallbackHandle *callback);
typedef CUresult(CUDAAPI *PFN_cuLogsUnregisterCallback_v12090)(CUlogsCallbackHandle callback);
typedef CUresult(CUDAAPI *PFN_cuLogsCurrent_v12090)(CUlogIterator *iterator, unsigned int flags);
typedef CUresult(CUDAAPI *PFN_cuLogsDumpToFile_v12090)(CUlogIterator *iterator, const char *pathToFile,
                                                       unsigned int flags);
typedef CUresult(CUDAAPI *PFN_cuLogsDumpToMemory_v12090)(CUlogIterator *iterator, char *buffer, size_t *size,
                                                         unsigned int flags);
#endif

#if CUDA_VERSION < 13000
/* Batched prefetches and discards, a location's default pool, the context calls by handle, a
 * green context's id (13.0). */
#define CU_MEM_ALLOCATION_TYPE_MANAGED ((CUmemAllocationType)0x2)
CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *prefetchLocs,
                                         size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags,
                                         CUstream hStream);
CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                              CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                              size_t numPrefetchLocs, unsigned long long flags, CUstream hStream);
CUresult CUDAAPI cuMemDiscardBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count, unsigned long long flags,
                                        CUstream hStream);
CUresult CUDAAPI cuMemDiscardBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                             unsigned long long flags, CUstream hStream);
CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type);
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx);
CUresult CUDAAPI cuGreenCtxGetId(CUgreenCtx greenCtx, unsigned long long *greenCtxId);
typedef CUresult(CUDAAPI *PFN_cuMemPrefetchBatchAsync_v13000)(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                               CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                               size_t numPrefetchLocs, unsigned long long flags,
                                                               CUstream hStream);
typedef PFN_cuMemPrefetchBatchAsync_v13000 PFN_cuMemPrefetchBatchAsync_v13000_ptsz;
typedef CUresult(CUDAAPI *PFN_cuMemDiscardBatchAsync_v13000)(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                              unsigned long long flags, CUstream hStream);
typedef PFN_cuMemDiscardBatchAsync_v13000 PFN_cuMemDiscardBatchAsync_v13000_ptsz;
typedef CUresult(CUDAAPI *PFN_cuMemGetDefaultMemPool_v13000)(CUmemoryPool *pool_out, CUmemLocation *location,
                                                              CUmemAllocationType type);
typedef CUresult(CUDAAPI *PFN_cuCtxGetDevice_v13000)(CUdevice *device, CUcontext ctx);
typedef CUresult(CUDAAPI *PFN_cuCtxSynchronize_v13000)(CUcontext ctx);
typedef CUresult(CUDAAPI *PFN_cuGreenCtxGetId_v12090)(CUgreenCtx greenCtx, unsigned long long *greenCtxId);
#endif

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
