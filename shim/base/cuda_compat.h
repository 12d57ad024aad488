/* cuda_compat.h: libpump builds with the cuda.h of CUDA 13.0 (what PyTorch's CUDA build and the
 * GPU machine carry: nvidia-cuda-runtime 13.0.96) as well as later ones, and with 12.4's
 * (nvidia-cuda-runtime-cu12 12.4.127: the first driver series with batched prefetch is 550). The names newer than the
 * header in use that pump hooks or asks for are declared here with the prototypes of CUDA 13.5's
 * cuda.h and cudaTypedefs.h (nvidia-cuda-runtime 13.5.37); pump passes their arguments through
 * unread. With a header that has them, it adds nothing. */
#ifndef PUMP_CUDA_COMPAT_H
#define PUMP_CUDA_COMPAT_H

#include <cuda.h>
#include <cudaTypedefs.h>

#if CUDA_VERSION < 12050
/* A context made with parameters (12.5); pump passes them on unread. */
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef CUresult(CUDAAPI *PFN_cuCtxCreate_v12050)(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                                   unsigned int flags, CUdevice dev);
#endif

#if CUDA_VERSION < 12080
/* Wide im2col tensor maps, a stream's device, and the packed tensor map types after
 * CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ (12). */
typedef enum CUtensorMapIm2ColWideMode_enum {
    CU_TENSOR_MAP_IM2COL_WIDE_MODE_W = 0,
    CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128
} CUtensorMapIm2ColWideMode;
typedef CUresult(CUDAAPI *PFN_cuTensorMapEncodeIm2colWide_v12080)(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void *globalAddress,
    const cuuint64_t *globalDim, const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    const cuuint32_t *elementStrides, CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill);
typedef CUresult(CUDAAPI *PFN_cuStreamGetDevice_v12080)(CUstream hStream, CUdevice *device);
#define CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B ((CUtensorMapDataType)13)
#define CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B ((CUtensorMapDataType)14)
#define CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ((CUtensorMapDataType)15)
#endif

#if CUDA_VERSION < 13000
/* Batched prefetches and discards, and a location's default pool (13.0). */
typedef CUresult(CUDAAPI *PFN_cuMemPrefetchBatchAsync_v13000)(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                               CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                               size_t numPrefetchLocs, unsigned long long flags,
                                                               CUstream hStream);
typedef CUresult(CUDAAPI *PFN_cuMemDiscardBatchAsync_v13000)(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                              unsigned long long flags, CUstream hStream);
typedef CUresult(CUDAAPI *PFN_cuMemGetDefaultMemPool_v13000)(CUmemoryPool *pool_out, CUmemLocation *location,
                                                              CUmemAllocationType type);
#define CU_MEM_ALLOCATION_TYPE_MANAGED ((CUmemAllocationType)0x2)
/* A context's synchronisation by handle (13.0). */
typedef CUresult(CUDAAPI *PFN_cuCtxSynchronize_v13000)(CUcontext ctx);
#endif

#if CUDA_VERSION < 13010
/* Stream capture to CUDA in Graphics (13.1). */
typedef struct CUstreamCigCaptureParams_st CUstreamCigCaptureParams;
typedef CUresult(CUDAAPI *PFN_cuStreamBeginCaptureToCig_v13010)(CUstream hStream,
                                                                 CUstreamCigCaptureParams *streamCigCaptureParams);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginCaptureToCig_v13010_ptsz)(
    CUstream hStream, CUstreamCigCaptureParams *streamCigCaptureParams);
typedef CUresult(CUDAAPI *PFN_cuStreamEndCaptureToCig_v13010)(CUstream hStream);
typedef CUresult(CUDAAPI *PFN_cuStreamEndCaptureToCig_v13010_ptsz)(CUstream hStream);
#endif

#if CUDA_VERSION < 13030
/* Recapture into an existing graph (13.3); the callback's status is an enum of that header. */
typedef CUresult(CUDA_CB *CUgraphRecaptureCallback)(void *data, CUgraphNode node,
                                                     const CUgraphNodeParams *originalParams,
                                                     const CUgraphNodeParams *recaptureParams, int status);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginRecaptureToGraph_v13030)(CUstream hStream, CUstreamCaptureMode mode,
                                                                     CUgraph hGraph,
                                                                     CUgraphRecaptureCallback callbackFunc,
                                                                     void *userData);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginRecaptureToGraph_v13030_ptsz)(CUstream hStream,
                                                                          CUstreamCaptureMode mode, CUgraph hGraph,
                                                                          CUgraphRecaptureCallback callbackFunc,
                                                                          void *userData);
#endif

#endif
