/* procaddr.c: why it exists: cuGetProcAddress (the 4-argument 11.3 form and the 12.0
 * _v2 form) over a table of (base name, minimum CUDA version, ABI export, per-thread
 * variant). Each entry's pointer is a hidden alias of the export itself, so it is the
 * same address dlsym(handle, "<ABI export>") gives: interposers match hooks by identity.
 * Each entry is also checked at compile time against cudaTypedefs.h's PFN_ typedef. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* X(base, min version, ABI export, is the per-thread-stream variant, PFN type) */
#define FC_PROC_TABLE(X)                                                                              \
    X(cuGetProcAddress, 11030, cuGetProcAddress, 0, PFN_cuGetProcAddress_v11030)                      \
    X(cuGetProcAddress, 12000, cuGetProcAddress_v2, 0, PFN_cuGetProcAddress_v12000)                   \
    X(cuInit, 2000, cuInit, 0, PFN_cuInit_v2000)                                                      \
    X(cuDriverGetVersion, 2020, cuDriverGetVersion, 0, PFN_cuDriverGetVersion_v2020)                  \
    X(cuGetErrorString, 6000, cuGetErrorString, 0, PFN_cuGetErrorString_v6000)                        \
    X(cuGetErrorName, 6000, cuGetErrorName, 0, PFN_cuGetErrorName_v6000)                              \
    X(cuDeviceGet, 2000, cuDeviceGet, 0, PFN_cuDeviceGet_v2000)                                       \
    X(cuDeviceGetCount, 2000, cuDeviceGetCount, 0, PFN_cuDeviceGetCount_v2000)                        \
    X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute, 0, PFN_cuDeviceGetAttribute_v2000)            \
    X(cuDeviceGetName, 2000, cuDeviceGetName, 0, PFN_cuDeviceGetName_v2000)                           \
    X(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId, 0, PFN_cuDeviceGetPCIBusId_v4010) \
    X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2, 0, PFN_cuDeviceTotalMem_v3020)                     \
    X(cuDeviceGetUuid, 9020, cuDeviceGetUuid, 0, PFN_cuDeviceGetUuid_v9020)                           \
    X(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2, 0, PFN_cuDeviceGetUuid_v11040)                      \
    X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain, 0, PFN_cuDevicePrimaryCtxRetain_v7000) \
    X(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease, 0, PFN_cuDevicePrimaryCtxRelease_v7000) \
    X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2, 0, PFN_cuDevicePrimaryCtxRelease_v11000) \
    X(cuMemcpy, 4000, cuMemcpy, 0, PFN_cuMemcpy_v4000) \
    X(cuMemcpy, 7000, cuMemcpy_ptds, 1, PFN_cuMemcpy_v7000_ptds) \
    X(cuMemcpyAsync, 4000, cuMemcpyAsync, 0, PFN_cuMemcpyAsync_v4000) \
    X(cuMemcpyAsync, 7000, cuMemcpyAsync_ptsz, 1, PFN_cuMemcpyAsync_v7000_ptsz) \
    X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, 0, PFN_cuMemcpyHtoD_v3020) \
    X(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds, 1, PFN_cuMemcpyHtoD_v7000_ptds) \
    X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, 0, PFN_cuMemcpyDtoH_v3020) \
    X(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds, 1, PFN_cuMemcpyDtoH_v7000_ptds) \
    X(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2, 0, PFN_cuMemcpyDtoD_v3020) \
    X(cuMemcpyDtoD, 7000, cuMemcpyDtoD_v2_ptds, 1, PFN_cuMemcpyDtoD_v7000_ptds) \
    X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2, 0, PFN_cuMemcpyHtoDAsync_v3020) \
    X(cuMemcpyHtoDAsync, 7000, cuMemcpyHtoDAsync_v2_ptsz, 1, PFN_cuMemcpyHtoDAsync_v7000_ptsz) \
    X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2, 0, PFN_cuMemcpyDtoHAsync_v3020) \
    X(cuMemcpyDtoHAsync, 7000, cuMemcpyDtoHAsync_v2_ptsz, 1, PFN_cuMemcpyDtoHAsync_v7000_ptsz) \
    X(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2, 0, PFN_cuMemcpyDtoDAsync_v3020) \
    X(cuMemcpyDtoDAsync, 7000, cuMemcpyDtoDAsync_v2_ptsz, 1, PFN_cuMemcpyDtoDAsync_v7000_ptsz) \
    X(cuMemsetD8, 3020, cuMemsetD8_v2, 0, PFN_cuMemsetD8_v3020) \
    X(cuMemsetD8, 7000, cuMemsetD8_v2_ptds, 1, PFN_cuMemsetD8_v7000_ptds) \
    X(cuMemsetD16, 3020, cuMemsetD16_v2, 0, PFN_cuMemsetD16_v3020) \
    X(cuMemsetD16, 7000, cuMemsetD16_v2_ptds, 1, PFN_cuMemsetD16_v7000_ptds) \
    X(cuMemsetD32, 3020, cuMemsetD32_v2, 0, PFN_cuMemsetD32_v3020) \
    X(cuMemsetD32, 7000, cuMemsetD32_v2_ptds, 1, PFN_cuMemsetD32_v7000_ptds) \
    X(cuMemsetD8Async, 3020, cuMemsetD8Async, 0, PFN_cuMemsetD8Async_v3020) \
    X(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz, 1, PFN_cuMemsetD8Async_v7000_ptsz) \
    X(cuMemsetD16Async, 3020, cuMemsetD16Async, 0, PFN_cuMemsetD16Async_v3020) \
    X(cuMemsetD16Async, 7000, cuMemsetD16Async_ptsz, 1, PFN_cuMemsetD16Async_v7000_ptsz) \
    X(cuMemsetD32Async, 3020, cuMemsetD32Async, 0, PFN_cuMemsetD32Async_v3020) \
    X(cuMemsetD32Async, 7000, cuMemsetD32Async_ptsz, 1, PFN_cuMemsetD32Async_v7000_ptsz) \
    X(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset, 0, PFN_cuDevicePrimaryCtxReset_v7000) \
    X(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2, 0, PFN_cuDevicePrimaryCtxReset_v11000) \
    X(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState, 0, PFN_cuDevicePrimaryCtxGetState_v7000) \
    X(cuCtxCreate, 3020, cuCtxCreate_v2, 0, PFN_cuCtxCreate_v3020)                                    \
    X(cuCtxCreate, 11040, cuCtxCreate_v3, 0, PFN_cuCtxCreate_v11040)                                  \
    X(cuCtxCreate, 12050, cuCtxCreate_v4, 0, PFN_cuCtxCreate_v12050)                                  \
    X(cuCtxDestroy, 4000, cuCtxDestroy_v2, 0, PFN_cuCtxDestroy_v4000)                                 \
    X(cuCtxSetCurrent, 4000, cuCtxSetCurrent, 0, PFN_cuCtxSetCurrent_v4000)                           \
    X(cuCtxGetCurrent, 4000, cuCtxGetCurrent, 0, PFN_cuCtxGetCurrent_v4000)                           \
    X(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2, 0, PFN_cuCtxPushCurrent_v4000)                     \
    X(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2, 0, PFN_cuCtxPopCurrent_v4000)                        \
    X(cuCtxGetDevice, 2000, cuCtxGetDevice, 0, PFN_cuCtxGetDevice_v2000)                              \
    X(cuCtxGetDevice, 13000, cuCtxGetDevice_v2, 0, PFN_cuCtxGetDevice_v13000)                         \
    X(cuCtxSynchronize, 2000, cuCtxSynchronize, 0, PFN_cuCtxSynchronize_v2000)                        \
    X(cuCtxSynchronize, 13000, cuCtxSynchronize_v2, 0, PFN_cuCtxSynchronize_v13000)                   \
    X(cuMemGetInfo, 3020, cuMemGetInfo_v2, 0, PFN_cuMemGetInfo_v3020)                                 \
    X(cuMemAlloc, 3020, cuMemAlloc_v2, 0, PFN_cuMemAlloc_v3020)                                       \
    X(cuMemFree, 3020, cuMemFree_v2, 0, PFN_cuMemFree_v3020)                                          \
    X(cuMemAllocManaged, 6000, cuMemAllocManaged, 0, PFN_cuMemAllocManaged_v6000)                     \
    X(cuMemAllocAsync, 11020, cuMemAllocAsync, 0, PFN_cuMemAllocAsync_v11020)                         \
    X(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz, 1, PFN_cuMemAllocAsync_v11020_ptsz)               \
    X(cuMemFreeAsync, 11020, cuMemFreeAsync, 0, PFN_cuMemFreeAsync_v11020)                            \
    X(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz, 1, PFN_cuMemFreeAsync_v11020_ptsz)                  \
    X(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync, 0, PFN_cuMemAllocFromPoolAsync_v11020) \
    X(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz, 1, PFN_cuMemAllocFromPoolAsync_v11020_ptsz) \
    X(cuMemGetDefaultMemPool, 13000, cuMemGetDefaultMemPool, 0, PFN_cuMemGetDefaultMemPool_v13000)    \
    X(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool, 0, PFN_cuDeviceGetDefaultMemPool_v11020) \
    X(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool, 0, PFN_cuDeviceGetMemPool_v11020)                \
    X(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool, 0, PFN_cuDeviceSetMemPool_v11020)                \
    X(cuMemPoolCreate, 11020, cuMemPoolCreate, 0, PFN_cuMemPoolCreate_v11020)                         \
    X(cuMemPoolDestroy, 11020, cuMemPoolDestroy, 0, PFN_cuMemPoolDestroy_v11020)                      \
    X(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo, 0, PFN_cuMemPoolTrimTo_v11020)                         \
    X(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute, 0, PFN_cuMemPoolSetAttribute_v11020)       \
    X(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute, 0, PFN_cuMemPoolGetAttribute_v11020)       \
    X(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle, 0, PFN_cuIpcGetMemHandle_v4010)                     \
    X(cuMemCreate, 10020, cuMemCreate, 0, PFN_cuMemCreate_v10020)                                     \
    X(cuMemAddressReserve, 10020, cuMemAddressReserve, 0, PFN_cuMemAddressReserve_v10020) \
    X(cuMemAddressFree, 10020, cuMemAddressFree, 0, PFN_cuMemAddressFree_v10020) \
    X(cuMemMap, 10020, cuMemMap, 0, PFN_cuMemMap_v10020) \
    X(cuMemUnmap, 10020, cuMemUnmap, 0, PFN_cuMemUnmap_v10020) \
    X(cuMemSetAccess, 10020, cuMemSetAccess, 0, PFN_cuMemSetAccess_v10020) \
    X(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity, 0, PFN_cuMemGetAllocationGranularity_v10020) \
    X(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle, 0, PFN_cuMemRetainAllocationHandle_v11000) \
    X(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle, 0, PFN_cuMemGetAllocationPropertiesFromHandle_v10020) \
    X(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle, 0, PFN_cuMemExportToShareableHandle_v10020) \
    X(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle, 0, PFN_cuMemImportFromShareableHandle_v10020) \
    X(cuMemRelease, 10020, cuMemRelease, 0, PFN_cuMemRelease_v10020)                                  \
    X(cuPointerGetAttribute, 4000, cuPointerGetAttribute, 0, PFN_cuPointerGetAttribute_v4000)         \
    X(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2, 0, PFN_cuMemGetAddressRange_v3020)         \
    X(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync, 0, PFN_cuMemPrefetchAsync_v8000)                  \
    X(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync_ptsz, 1, PFN_cuMemPrefetchAsync_v8000_ptsz)        \
    X(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2, 0, PFN_cuMemPrefetchAsync_v12020)             \
    X(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2_ptsz, 1, PFN_cuMemPrefetchAsync_v12020_ptsz)   \
    X(cuMemPrefetchBatchAsync, 13000, cuMemPrefetchBatchAsync, 0, PFN_cuMemPrefetchBatchAsync_v13000) \
    X(cuMemPrefetchBatchAsync, 13000, cuMemPrefetchBatchAsync_ptsz, 1, PFN_cuMemPrefetchBatchAsync_v13000_ptsz) \
    X(cuMemDiscardBatchAsync, 13000, cuMemDiscardBatchAsync, 0, PFN_cuMemDiscardBatchAsync_v13000)    \
    X(cuMemDiscardBatchAsync, 13000, cuMemDiscardBatchAsync_ptsz, 1, PFN_cuMemDiscardBatchAsync_v13000_ptsz) \
    X(cuMemAdvise, 8000, cuMemAdvise, 0, PFN_cuMemAdvise_v8000)                                       \
    X(cuMemAdvise, 12020, cuMemAdvise_v2, 0, PFN_cuMemAdvise_v12020)                                  \
    X(cuStreamCreate, 2000, cuStreamCreate, 0, PFN_cuStreamCreate_v2000)                              \
    X(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority, 0, PFN_cuStreamCreateWithPriority_v5050) \
    X(cuStreamDestroy, 4000, cuStreamDestroy_v2, 0, PFN_cuStreamDestroy_v4000)                        \
    X(cuStreamSynchronize, 2000, cuStreamSynchronize, 0, PFN_cuStreamSynchronize_v2000)               \
    X(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz, 1, PFN_cuStreamSynchronize_v7000_ptsz)     \
    X(cuStreamQuery, 2000, cuStreamQuery, 0, PFN_cuStreamQuery_v2000)                                 \
    X(cuStreamQuery, 7000, cuStreamQuery_ptsz, 1, PFN_cuStreamQuery_v7000_ptsz)                       \
    X(cuStreamWaitEvent, 3020, cuStreamWaitEvent, 0, PFN_cuStreamWaitEvent_v3020)                     \
    X(cuStreamWaitEvent, 7000, cuStreamWaitEvent_ptsz, 1, PFN_cuStreamWaitEvent_v7000_ptsz)           \
    X(cuStreamGetCtx, 9020, cuStreamGetCtx, 0, PFN_cuStreamGetCtx_v9020)                              \
    X(cuStreamGetCtx, 9020, cuStreamGetCtx_ptsz, 1, PFN_cuStreamGetCtx_v9020_ptsz)                    \
    X(cuStreamGetCtx, 12050, cuStreamGetCtx_v2, 0, PFN_cuStreamGetCtx_v12050)                         \
    X(cuStreamGetCtx, 12050, cuStreamGetCtx_v2_ptsz, 1, PFN_cuStreamGetCtx_v12050_ptsz)               \
    X(cuStreamGetDevice, 12080, cuStreamGetDevice, 0, PFN_cuStreamGetDevice_v12080)                   \
    X(cuStreamGetDevice, 12080, cuStreamGetDevice_ptsz, 1, PFN_cuStreamGetDevice_v12080_ptsz)         \
    X(cuStreamGetFlags, 5050, cuStreamGetFlags, 0, PFN_cuStreamGetFlags_v5050)                        \
    X(cuStreamGetFlags, 7000, cuStreamGetFlags_ptsz, 1, PFN_cuStreamGetFlags_v7000_ptsz)              \
    X(cuStreamGetPriority, 5050, cuStreamGetPriority, 0, PFN_cuStreamGetPriority_v5050)               \
    X(cuStreamGetPriority, 7000, cuStreamGetPriority_ptsz, 1, PFN_cuStreamGetPriority_v7000_ptsz)     \
    X(cuStreamGetId, 12000, cuStreamGetId, 0, PFN_cuStreamGetId_v12000)                               \
    X(cuStreamGetId, 12000, cuStreamGetId_ptsz, 1, PFN_cuStreamGetId_v12000_ptsz)                     \
    X(cuEventCreate, 2000, cuEventCreate, 0, PFN_cuEventCreate_v2000)                                 \
    X(cuEventRecord, 2000, cuEventRecord, 0, PFN_cuEventRecord_v2000)                                 \
    X(cuEventRecord, 7000, cuEventRecord_ptsz, 1, PFN_cuEventRecord_v7000_ptsz)                       \
    X(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags, 0, PFN_cuEventRecordWithFlags_v11010)    \
    X(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz, 1, PFN_cuEventRecordWithFlags_v11010_ptsz) \
    X(cuEventQuery, 2000, cuEventQuery, 0, PFN_cuEventQuery_v2000)                                    \
    X(cuEventSynchronize, 2000, cuEventSynchronize, 0, PFN_cuEventSynchronize_v2000)                  \
    X(cuEventDestroy, 4000, cuEventDestroy_v2, 0, PFN_cuEventDestroy_v4000)                           \
    X(cuEventElapsedTime, 2000, cuEventElapsedTime, 0, PFN_cuEventElapsedTime_v2000)                  \
    X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2, 0, PFN_cuEventElapsedTime_v12080)             \
    X(cuLaunchHostFunc, 10000, cuLaunchHostFunc, 0, PFN_cuLaunchHostFunc_v10000)                      \
    X(cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz, 1, PFN_cuLaunchHostFunc_v10000_ptsz)            \
    X(cuLaunchHostFunc, 13010, cuLaunchHostFunc_v2, 0, PFN_cuLaunchHostFunc_v13010)                   \
    X(cuLaunchHostFunc, 13010, cuLaunchHostFunc_v2_ptsz, 1, PFN_cuLaunchHostFunc_v13010_ptsz)         \
    X(cuStreamBeginCapture, 10000, cuStreamBeginCapture, 0, PFN_cuStreamBeginCapture_v10000)          \
    X(cuStreamBeginCapture, 10000, cuStreamBeginCapture_ptsz, 1, PFN_cuStreamBeginCapture_v10000_ptsz) \
    X(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, 0, PFN_cuStreamBeginCapture_v10010)       \
    X(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz, 1, PFN_cuStreamBeginCapture_v10010_ptsz) \
    X(cuStreamIsCapturing, 10000, cuStreamIsCapturing, 0, PFN_cuStreamIsCapturing_v10000)             \
    X(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz, 1, PFN_cuStreamIsCapturing_v10000_ptsz)   \
    X(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo, 0, PFN_cuStreamGetCaptureInfo_v10010)    \
    X(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo_ptsz, 1, PFN_cuStreamGetCaptureInfo_v10010_ptsz) \
    X(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2, 0, PFN_cuStreamGetCaptureInfo_v11030) \
    X(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2_ptsz, 1, PFN_cuStreamGetCaptureInfo_v11030_ptsz) \
    X(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3, 0, PFN_cuStreamGetCaptureInfo_v12030) \
    X(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3_ptsz, 1, PFN_cuStreamGetCaptureInfo_v12030_ptsz) \
    X(cuStreamEndCapture, 10000, cuStreamEndCapture, 0, PFN_cuStreamEndCapture_v10000)                \
    X(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz, 1, PFN_cuStreamEndCapture_v10000_ptsz)      \
    X(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode, 0,                 \
      PFN_cuThreadExchangeStreamCaptureMode_v10010)                                                   \
    X(cuGraphInstantiate, 10000, cuGraphInstantiate, 0, PFN_cuGraphInstantiate_v10000)                \
    X(cuGraphInstantiate, 11000, cuGraphInstantiate_v2, 0, PFN_cuGraphInstantiate_v11000)             \
    X(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags, 0, PFN_cuGraphInstantiateWithFlags_v11040) \
    X(cuGraphLaunch, 10000, cuGraphLaunch, 0, PFN_cuGraphLaunch_v10000)                               \
    X(cuGraphLaunch, 10000, cuGraphLaunch_ptsz, 1, PFN_cuGraphLaunch_v10000_ptsz)                     \
    X(cuGraphDestroy, 10000, cuGraphDestroy, 0, PFN_cuGraphDestroy_v10000)                            \
    X(cuGraphExecDestroy, 10000, cuGraphExecDestroy, 0, PFN_cuGraphExecDestroy_v10000)                \
    X(cuGraphGetNodes, 10000, cuGraphGetNodes, 0, PFN_cuGraphGetNodes_v10000)                         \
    X(cuGraphNodeGetType, 10000, cuGraphNodeGetType, 0, PFN_cuGraphNodeGetType_v10000)                \
    X(cuGraphKernelNodeGetParams, 10000, cuGraphKernelNodeGetParams, 0, PFN_cuGraphKernelNodeGetParams_v10000) \
    X(cuGraphKernelNodeGetParams, 12000, cuGraphKernelNodeGetParams_v2, 0, PFN_cuGraphKernelNodeGetParams_v12000) \
    X(cuModuleLoad, 2000, cuModuleLoad, 0, PFN_cuModuleLoad_v2000)                                    \
    X(cuModuleLoadData, 2000, cuModuleLoadData, 0, PFN_cuModuleLoadData_v2000)                        \
    X(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx, 0, PFN_cuModuleLoadDataEx_v2010)                  \
    X(cuModuleUnload, 2000, cuModuleUnload, 0, PFN_cuModuleUnload_v2000)                              \
    X(cuModuleGetFunction, 2000, cuModuleGetFunction, 0, PFN_cuModuleGetFunction_v2000)               \
    X(cuModuleLoadFatBinary, 2000, cuModuleLoadFatBinary, 0, PFN_cuModuleLoadFatBinary_v2000)         \
    X(cuModuleGetGlobal, 3020, cuModuleGetGlobal_v2, 0, PFN_cuModuleGetGlobal_v3020)                  \
    X(cuModuleGetLoadingMode, 11070, cuModuleGetLoadingMode, 0, PFN_cuModuleGetLoadingMode_v11070)    \
    X(cuLibraryGetGlobal, 12000, cuLibraryGetGlobal, 0, PFN_cuLibraryGetGlobal_v12000)                \
    X(cuModuleGetFunctionCount, 12040, cuModuleGetFunctionCount, 0, PFN_cuModuleGetFunctionCount_v12040) \
    X(cuModuleEnumerateFunctions, 12040, cuModuleEnumerateFunctions, 0, PFN_cuModuleEnumerateFunctions_v12040) \
    X(cuLibraryGetKernelCount, 12040, cuLibraryGetKernelCount, 0, PFN_cuLibraryGetKernelCount_v12040) \
    X(cuLibraryEnumerateKernels, 12040, cuLibraryEnumerateKernels, 0, PFN_cuLibraryEnumerateKernels_v12040) \
    X(cuLibraryLoadData, 12000, cuLibraryLoadData, 0, PFN_cuLibraryLoadData_v12000)                   \
    X(cuLibraryLoadFromFile, 12000, cuLibraryLoadFromFile, 0, PFN_cuLibraryLoadFromFile_v12000)       \
    X(cuLibraryUnload, 12000, cuLibraryUnload, 0, PFN_cuLibraryUnload_v12000)                         \
    X(cuLibraryGetKernel, 12000, cuLibraryGetKernel, 0, PFN_cuLibraryGetKernel_v12000)                \
    X(cuKernelGetFunction, 12000, cuKernelGetFunction, 0, PFN_cuKernelGetFunction_v12000)             \
    X(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo, 0, PFN_cuFuncGetParamInfo_v12040)               \
    X(cuKernelGetParamInfo, 12040, cuKernelGetParamInfo, 0, PFN_cuKernelGetParamInfo_v12040)          \
    X(cuFuncGetParamCount, 13020, cuFuncGetParamCount, 0, PFN_cuFuncGetParamCount_v13020)            \
    X(cuKernelGetParamCount, 13020, cuKernelGetParamCount, 0, PFN_cuKernelGetParamCount_v13020)       \
    X(cuFuncGetName, 12030, cuFuncGetName, 0, PFN_cuFuncGetName_v12030)                               \
    X(cuKernelGetName, 12030, cuKernelGetName, 0, PFN_cuKernelGetName_v12030)                         \
    X(cuTensorMapEncodeTiled, 12000, cuTensorMapEncodeTiled, 0, PFN_cuTensorMapEncodeTiled_v12000)   \
    X(cuTensorMapEncodeIm2col, 12000, cuTensorMapEncodeIm2col, 0, PFN_cuTensorMapEncodeIm2col_v12000) \
    X(cuTensorMapEncodeIm2colWide, 12080, cuTensorMapEncodeIm2colWide, 0, PFN_cuTensorMapEncodeIm2colWide_v12080) \
    X(cuTensorMapReplaceAddress, 12000, cuTensorMapReplaceAddress, 0, PFN_cuTensorMapReplaceAddress_v12000) \
    X(cuLaunchKernel, 4000, cuLaunchKernel, 0, PFN_cuLaunchKernel_v4000)                              \
    X(cuLaunchKernel, 7000, cuLaunchKernel_ptsz, 1, PFN_cuLaunchKernel_v7000_ptsz)                    \
    X(cuLaunchKernelEx, 11060, cuLaunchKernelEx, 0, PFN_cuLaunchKernelEx_v11060)                      \
    X(cuLaunchKernelEx, 11060, cuLaunchKernelEx_ptsz, 1, PFN_cuLaunchKernelEx_v11060_ptsz)            \
    X(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel, 0, PFN_cuLaunchCooperativeKernel_v9000) \
    X(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel_ptsz, 1, PFN_cuLaunchCooperativeKernel_v9000_ptsz) \
    /* graphs built by hand, child graphs, exec updates. At 12000 "cuGraphInstantiate" stays the     \
     * 5-argument _v2, as NVIDIA's 535 and 550 drivers answer (tests/test_real_libcuda.py) */         \
    X(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams, 0,                           \
      PFN_cuGraphInstantiateWithParams_v12000)                                                        \
    X(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams_ptsz, 1,                      \
      PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                                   \
    X(cuGraphCreate, 10000, cuGraphCreate, 0, PFN_cuGraphCreate_v10000)                               \
    X(cuGraphAddKernelNode, 12000, cuGraphAddKernelNode_v2, 0, PFN_cuGraphAddKernelNode_v12000)       \
    X(cuGraphAddChildGraphNode, 10000, cuGraphAddChildGraphNode, 0, PFN_cuGraphAddChildGraphNode_v10000) \
    X(cuGraphChildGraphNodeGetGraph, 10000, cuGraphChildGraphNodeGetGraph, 0,                         \
      PFN_cuGraphChildGraphNodeGetGraph_v10000)                                                       \
    X(cuGraphExecKernelNodeSetParams, 10010, cuGraphExecKernelNodeSetParams, 0,                       \
      PFN_cuGraphExecKernelNodeSetParams_v10010)                                                      \
    X(cuGraphExecKernelNodeSetParams, 12000, cuGraphExecKernelNodeSetParams_v2, 0,                    \
      PFN_cuGraphExecKernelNodeSetParams_v12000)                                                      \
    X(cuGraphExecUpdate, 10020, cuGraphExecUpdate, 0, PFN_cuGraphExecUpdate_v10020)                   \
    X(cuGraphExecUpdate, 12000, cuGraphExecUpdate_v2, 0, PFN_cuGraphExecUpdate_v12000)               \
    /* what the CUDA 13.0 runtime and cuBLAS need (issue 26): export_tables.c, context_extras.c,      \
     * func_attributes.c, stream_memops.c, link.c, pointers.c */                                       \
    X(cuGetExportTable, 3000, cuGetExportTable, 0, PFN_cuGetExportTable_v3000)                        \
    X(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange, 0, PFN_cuCtxGetStreamPriorityRange_v5050) \
    X(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion, 0, PFN_cuCtxGetApiVersion_v3020)              \
    X(cuCtxGetId, 12000, cuCtxGetId, 0, PFN_cuCtxGetId_v12000)                                        \
    X(cuCtxGetDevResource, 12040, cuCtxGetDevResource, 0, PFN_cuCtxGetDevResource_v12040)            \
    X(cuCtxRecordEvent, 12050, cuCtxRecordEvent, 0, PFN_cuCtxRecordEvent_v12050)                      \
    X(cuCtxWaitEvent, 12050, cuCtxWaitEvent, 0, PFN_cuCtxWaitEvent_v12050)                            \
    X(cuGreenCtxGetId, 12090, cuGreenCtxGetId, 0, PFN_cuGreenCtxGetId_v12090)                         \
    X(cuGreenCtxGetDevResource, 12040, cuGreenCtxGetDevResource, 0, PFN_cuGreenCtxGetDevResource_v12040) \
    X(cuGreenCtxRecordEvent, 12040, cuGreenCtxRecordEvent, 0, PFN_cuGreenCtxRecordEvent_v12040)       \
    X(cuGreenCtxWaitEvent, 12040, cuGreenCtxWaitEvent, 0, PFN_cuGreenCtxWaitEvent_v12040)             \
    X(cuStreamGetGreenCtx, 12040, cuStreamGetGreenCtx, 0, PFN_cuStreamGetGreenCtx_v12040)             \
    X(cuCtxGetLimit, 3010, cuCtxGetLimit, 0, PFN_cuCtxGetLimit_v3010)                                 \
    X(cuCtxSetLimit, 3010, cuCtxSetLimit, 0, PFN_cuCtxSetLimit_v3010)                                 \
    X(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer, 0, PFN_cuDeviceCanAccessPeer_v4000)         \
    X(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess, 0, PFN_cuCtxEnablePeerAccess_v4000)         \
    X(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess, 0, PFN_cuCtxDisablePeerAccess_v4000)      \
    X(cuLogsRegisterCallback, 12090, cuLogsRegisterCallback, 0, PFN_cuLogsRegisterCallback_v12090)    \
    X(cuLogsUnregisterCallback, 12090, cuLogsUnregisterCallback, 0, PFN_cuLogsUnregisterCallback_v12090) \
    X(cuLogsCurrent, 12090, cuLogsCurrent, 0, PFN_cuLogsCurrent_v12090)                               \
    X(cuLogsDumpToFile, 12090, cuLogsDumpToFile, 0, PFN_cuLogsDumpToFile_v12090)                      \
    X(cuLogsDumpToMemory, 12090, cuLogsDumpToMemory, 0, PFN_cuLogsDumpToMemory_v12090)                \
    X(cuFuncGetAttribute, 2020, cuFuncGetAttribute, 0, PFN_cuFuncGetAttribute_v2020)                  \
    X(cuFuncSetAttribute, 9000, cuFuncSetAttribute, 0, PFN_cuFuncSetAttribute_v9000)                  \
    X(cuFuncSetCacheConfig, 3000, cuFuncSetCacheConfig, 0, PFN_cuFuncSetCacheConfig_v3000)            \
    X(cuKernelGetAttribute, 12000, cuKernelGetAttribute, 0, PFN_cuKernelGetAttribute_v12000)          \
    X(cuKernelSetAttribute, 12000, cuKernelSetAttribute, 0, PFN_cuKernelSetAttribute_v12000)          \
    X(cuKernelSetCacheConfig, 12000, cuKernelSetCacheConfig, 0, PFN_cuKernelSetCacheConfig_v12000)    \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, cuOccupancyMaxActiveBlocksPerMultiprocessor, 0, \
      PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050)                                          \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 7000,                                     \
      cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 0,                                        \
      PFN_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_v7000)                                 \
    X(cuOccupancyMaxPotentialBlockSize, 6050, cuOccupancyMaxPotentialBlockSize, 0,                    \
      PFN_cuOccupancyMaxPotentialBlockSize_v6050)                                                     \
    X(cuOccupancyMaxPotentialBlockSizeWithFlags, 7000, cuOccupancyMaxPotentialBlockSizeWithFlags, 0,  \
      PFN_cuOccupancyMaxPotentialBlockSizeWithFlags_v7000)                                            \
    X(cuOccupancyAvailableDynamicSMemPerBlock, 10020, cuOccupancyAvailableDynamicSMemPerBlock, 0,     \
      PFN_cuOccupancyAvailableDynamicSMemPerBlock_v10020)                                             \
    X(cuOccupancyMaxPotentialClusterSize, 11070, cuOccupancyMaxPotentialClusterSize, 0,              \
      PFN_cuOccupancyMaxPotentialClusterSize_v11070)                                                  \
    X(cuOccupancyMaxActiveClusters, 11070, cuOccupancyMaxActiveClusters, 0,                          \
      PFN_cuOccupancyMaxActiveClusters_v11070)                                                        \
    X(cuStreamWaitValue32, 8000, cuStreamWaitValue32, 0, PFN_cuStreamWaitValue32_v8000)              \
    X(cuStreamWaitValue32, 8000, cuStreamWaitValue32_ptsz, 1, PFN_cuStreamWaitValue32_v8000_ptsz)     \
    X(cuStreamWaitValue64, 9000, cuStreamWaitValue64, 0, PFN_cuStreamWaitValue64_v9000)              \
    X(cuStreamWaitValue64, 9000, cuStreamWaitValue64_ptsz, 1, PFN_cuStreamWaitValue64_v9000_ptsz)     \
    X(cuStreamWriteValue32, 8000, cuStreamWriteValue32, 0, PFN_cuStreamWriteValue32_v8000)           \
    X(cuStreamWriteValue32, 8000, cuStreamWriteValue32_ptsz, 1, PFN_cuStreamWriteValue32_v8000_ptsz)  \
    X(cuStreamWriteValue64, 9000, cuStreamWriteValue64, 0, PFN_cuStreamWriteValue64_v9000)           \
    X(cuStreamWriteValue64, 9000, cuStreamWriteValue64_ptsz, 1, PFN_cuStreamWriteValue64_v9000_ptsz)  \
    X(cuStreamBatchMemOp, 8000, cuStreamBatchMemOp, 0, PFN_cuStreamBatchMemOp_v8000)                 \
    X(cuStreamBatchMemOp, 8000, cuStreamBatchMemOp_ptsz, 1, PFN_cuStreamBatchMemOp_v8000_ptsz)        \
    X(cuLinkCreate, 5050, cuLinkCreate, 0, PFN_cuLinkCreate_v5050)                                    \
    X(cuLinkAddData, 5050, cuLinkAddData, 0, PFN_cuLinkAddData_v5050)                                 \
    X(cuLinkAddFile, 5050, cuLinkAddFile, 0, PFN_cuLinkAddFile_v5050)                                 \
    X(cuStreamWaitValue32, 11070, cuStreamWaitValue32_v2, 0, PFN_cuStreamWaitValue32_v11070)          \
    X(cuStreamWaitValue32, 11070, cuStreamWaitValue32_v2_ptsz, 1, PFN_cuStreamWaitValue32_v11070_ptsz) \
    X(cuStreamWaitValue64, 11070, cuStreamWaitValue64_v2, 0, PFN_cuStreamWaitValue64_v11070)          \
    X(cuStreamWaitValue64, 11070, cuStreamWaitValue64_v2_ptsz, 1, PFN_cuStreamWaitValue64_v11070_ptsz) \
    X(cuStreamWriteValue32, 11070, cuStreamWriteValue32_v2, 0, PFN_cuStreamWriteValue32_v11070)       \
    X(cuStreamWriteValue32, 11070, cuStreamWriteValue32_v2_ptsz, 1, PFN_cuStreamWriteValue32_v11070_ptsz) \
    X(cuStreamWriteValue64, 11070, cuStreamWriteValue64_v2, 0, PFN_cuStreamWriteValue64_v11070)       \
    X(cuStreamWriteValue64, 11070, cuStreamWriteValue64_v2_ptsz, 1, PFN_cuStreamWriteValue64_v11070_ptsz) \
    X(cuStreamBatchMemOp, 11070, cuStreamBatchMemOp_v2, 0, PFN_cuStreamBatchMemOp_v11070)             \
    X(cuStreamBatchMemOp, 11070, cuStreamBatchMemOp_v2_ptsz, 1, PFN_cuStreamBatchMemOp_v11070_ptsz)   \
    X(cuMemcpy2DAsync, 3020, cuMemcpy2DAsync_v2, 0, PFN_cuMemcpy2DAsync_v3020)                        \
    X(cuMemcpy2DAsync, 7000, cuMemcpy2DAsync_v2_ptsz, 1, PFN_cuMemcpy2DAsync_v7000_ptsz)              \
    X(cuLinkCreate, 6050, cuLinkCreate_v2, 0, PFN_cuLinkCreate_v6050)                                 \
    X(cuLinkAddData, 6050, cuLinkAddData_v2, 0, PFN_cuLinkAddData_v6050)                              \
    X(cuLinkAddFile, 6050, cuLinkAddFile_v2, 0, PFN_cuLinkAddFile_v6050)                              \
    X(cuLinkComplete, 5050, cuLinkComplete, 0, PFN_cuLinkComplete_v5050)                              \
    X(cuLinkDestroy, 5050, cuLinkDestroy, 0, PFN_cuLinkDestroy_v5050)                                 \
    X(cuPointerGetAttributes, 7000, cuPointerGetAttributes, 0, PFN_cuPointerGetAttributes_v7000)   \
    X(cuMemHostAlloc, 2020, cuMemHostAlloc, 0, PFN_cuMemHostAlloc_v2020)                              \
    X(cuMemAllocHost, 3020, cuMemAllocHost_v2, 0, PFN_cuMemAllocHost_v3020)                           \
    X(cuMemFreeHost, 2000, cuMemFreeHost, 0, PFN_cuMemFreeHost_v2000)                                 \
    X(cuMemHostRegister, 6050, cuMemHostRegister_v2, 0, PFN_cuMemHostRegister_v6050)                  \
    X(cuMemHostUnregister, 4000, cuMemHostUnregister, 0, PFN_cuMemHostUnregister_v4000)               \
    X(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2, 0, PFN_cuMemHostGetDevicePointer_v3020) \
    X(cuMemHostGetFlags, 2030, cuMemHostGetFlags, 0, PFN_cuMemHostGetFlags_v2030)

/* CUDA 10's forms of two graph calls, which the driver still exports and answers for at
 * their versions: adapters over the current forms (graphs.c). */
extern __typeof__(cuGraphExecKernelNodeSetParams_v2) fcl_cuGraphExecKernelNodeSetParams_v2
    __attribute__((visibility("hidden")));
extern __typeof__(cuGraphExecUpdate_v2) fcl_cuGraphExecUpdate_v2 __attribute__((visibility("hidden")));

FC_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                  const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    FC_ENTRY(cuGraphExecKernelNodeSetParams, 10010);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS v2 = {
        .func = p->func, .gridDimX = p->gridDimX, .gridDimY = p->gridDimY, .gridDimZ = p->gridDimZ,
        .blockDimX = p->blockDimX, .blockDimY = p->blockDimY, .blockDimZ = p->blockDimZ,
        .sharedMemBytes = p->sharedMemBytes, .kernelParams = p->kernelParams, .extra = p->extra};
    return fcl_cuGraphExecKernelNodeSetParams_v2(hGraphExec, hNode, &v2);
}
FC_ALIAS(cuGraphExecKernelNodeSetParams);

extern __typeof__(cuGraphKernelNodeGetParams_v2) fcl_cuGraphKernelNodeGetParams_v2
    __attribute__((visibility("hidden")));
/* CUDA 10's form, which cuBLAS links by name: the v2 answer without its CUkernel and context. */
FC_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    FC_ENTRY(cuGraphKernelNodeGetParams, 10000);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS v2 = {0};
    CUresult r = fcl_cuGraphKernelNodeGetParams_v2(hNode, &v2);
    if (r != CUDA_SUCCESS) return r;
    *p = (CUDA_KERNEL_NODE_PARAMS_v1){
        .func = v2.func, .gridDimX = v2.gridDimX, .gridDimY = v2.gridDimY, .gridDimZ = v2.gridDimZ,
        .blockDimX = v2.blockDimX, .blockDimY = v2.blockDimY, .blockDimZ = v2.blockDimZ,
        .sharedMemBytes = v2.sharedMemBytes, .kernelParams = v2.kernelParams, .extra = v2.extra};
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphKernelNodeGetParams);

FC_EXPORT CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                     CUgraphExecUpdateResult *updateResult_out)
{
    FC_ENTRY(cuGraphExecUpdate, 10020);
    CUgraphExecUpdateResultInfo info = {0};
    CUresult r = fcl_cuGraphExecUpdate_v2(hGraphExec, hGraph, &info);
    if (hErrorNode_out) *hErrorNode_out = info.errorNode;
    if (updateResult_out) *updateResult_out = info.result;
    return r;
}
FC_ALIAS(cuGraphExecUpdate);

/* The hidden aliases (defined next to each export) and the signature checks. */
#define FC_DECL(base, ver, sym, ptsz, pfn)                                                    \
    extern __typeof__(sym) fcl_##sym __attribute__((visibility("hidden")));                   \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sym), pfn), #sym " vs " #pfn);
FC_PROC_TABLE(FC_DECL)

typedef struct fc_proc { const char *base; int version; const char *sym; int ptsz; void *fn; } fc_proc;
#define FC_ROW(base, ver, sym, ptsz, pfn) { #base, ver, #sym, ptsz, (void *)&fcl_##sym },
static const fc_proc fc_procs[] = { FC_PROC_TABLE(FC_ROW) };

/* FAKECUDA_PROCADDR_INTERNAL=NAME[,NAME...] (ABI names of the launch entry points below, graph launches
 * and the beginning of a capture too):
 * cuGetProcAddress answers those with an internal function of the same signature that does
 * what the export does, not the export itself. A harsher mode, not the default: the 535 and
 * 550 drivers answer with their exports (tests/test_real_libcuda.py), but a driver whose
 * table points past its exports (issue 27 item 4: the CUDA 13 entries were never resolved on
 * a 580 driver) leaves an interposer that matches by pointer identity nothing to swap. */
#define FC_INTERNAL(sym, params, args) \
    static CUresult internal_##sym params { return fcl_##sym args; }
#define FC_LAUNCH_PARAMS                                                                            \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shared, CUstream s, void **params, void **extra)
#define FC_COOPERATIVE_PARAMS                                                                       \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shared, CUstream s, void **params)
FC_INTERNAL(cuLaunchKernel, FC_LAUNCH_PARAMS, (f, gx, gy, gz, bx, by, bz, shared, s, params, extra))
FC_INTERNAL(cuLaunchKernel_ptsz, FC_LAUNCH_PARAMS, (f, gx, gy, gz, bx, by, bz, shared, s, params, extra))
FC_INTERNAL(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra),
            (c, f, params, extra))
FC_INTERNAL(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra),
            (c, f, params, extra))
FC_INTERNAL(cuLaunchCooperativeKernel, FC_COOPERATIVE_PARAMS, (f, gx, gy, gz, bx, by, bz, shared, s, params))
FC_INTERNAL(cuLaunchCooperativeKernel_ptsz, FC_COOPERATIVE_PARAMS, (f, gx, gy, gz, bx, by, bz, shared, s, params))
FC_INTERNAL(cuGraphLaunch, (CUgraphExec e, CUstream s), (e, s))
FC_INTERNAL(cuGraphLaunch_ptsz, (CUgraphExec e, CUstream s), (e, s))
FC_INTERNAL(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), (s, mode))
FC_INTERNAL(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode mode), (s, mode))

static const struct { const char *sym; void *fn; } fc_internal[] = {
    {"cuLaunchKernel", (void *)&internal_cuLaunchKernel},
    {"cuLaunchKernel_ptsz", (void *)&internal_cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", (void *)&internal_cuLaunchKernelEx},
    {"cuLaunchKernelEx_ptsz", (void *)&internal_cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", (void *)&internal_cuLaunchCooperativeKernel},
    {"cuLaunchCooperativeKernel_ptsz", (void *)&internal_cuLaunchCooperativeKernel_ptsz},
    {"cuGraphLaunch", (void *)&internal_cuGraphLaunch},
    {"cuGraphLaunch_ptsz", (void *)&internal_cuGraphLaunch_ptsz},
    {"cuStreamBeginCapture_v2", (void *)&internal_cuStreamBeginCapture_v2},
    {"cuStreamBeginCapture_v2_ptsz", (void *)&internal_cuStreamBeginCapture_v2_ptsz},
};
#define FC_NINTERNAL ((int)(sizeof fc_internal / sizeof *fc_internal))
static int fc_internal_on[FC_NINTERNAL];
static pthread_once_t fc_internal_once = PTHREAD_ONCE_INIT;

static void read_internal(void)
{
    const char *v = getenv("FAKECUDA_PROCADDR_INTERNAL");
    while (v && *v) {
        size_t len = strcspn(v, ",");
        int i = 0;
        while (i < FC_NINTERNAL && !(strlen(fc_internal[i].sym) == len && strncmp(fc_internal[i].sym, v, len) == 0))
            i++;
        if (i == FC_NINTERNAL) {
            fprintf(stderr, "fakecuda: FAKECUDA_PROCADDR_INTERNAL: unknown entry point \"%.*s\"; allowed: "
                    "cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz forms\n",
                    (int)len, v);
            exit(2);
        }
        fc_internal_on[i] = 1;
        v += len + (v[len] == ',');
    }
}

/* The export's pointer, or the internal function standing in for it. */
static void *answer(const fc_proc *e)
{
    pthread_once(&fc_internal_once, read_internal);
    for (int i = 0; i < FC_NINTERNAL; i++)
        if (fc_internal_on[i] && strcmp(fc_internal[i].sym, e->sym) == 0) return fc_internal[i].fn;
    return e->fn;
}

/* Among the entries for symbol with version <= min(cudaVersion, driver version), the
 * highest; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, for a name that has _ptsz
 * variants, the highest of those, or none below the first _ptsz version (NVIDIA's 535
 * and 550 drivers answer NULL, VERSION_NOT_SUFFICIENT, for "cuLaunchKernel" at 4000 with
 * that flag). No match: CUDA_SUCCESS, *pfn NULL, and a status. */
static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (cudaVersion > fc_cfg.driver_version) FC_COUNT(lookups_above_driver, 1);
    int limit = cudaVersion < fc_cfg.driver_version ? cudaVersion : fc_cfg.driver_version;
    int found = 0, has_ptsz = 0, best = -1, best_ptsz = -1;
    for (int i = 0; i < (int)(sizeof fc_procs / sizeof *fc_procs); i++) {
        const fc_proc *e = &fc_procs[i];
        if (strcmp(e->base, symbol) != 0) continue;
        found = 1;
        has_ptsz |= e->ptsz;
        if (e->version > limit) continue;
        int *b = e->ptsz ? &best_ptsz : &best;
        if (*b < 0 || e->version > fc_procs[*b].version) *b = i;
    }
    int pick = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && has_ptsz ? best_ptsz : best;
    if (pick >= 0) *pfn = answer(&fc_procs[pick]);
    if (!found) fc_not_found(FC_NF_PROC, symbol);
    if (status)
        *status = pick >= 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                  : found   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    FC_ENTRY_NOINIT(cuGetProcAddress, 11030);
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}
FC_ALIAS(cuGetProcAddress);

FC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    FC_ENTRY_NOINIT(cuGetProcAddress_v2, 12000);
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
FC_ALIAS(cuGetProcAddress_v2);
