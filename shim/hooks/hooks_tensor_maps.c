/* hooks_tensor_maps.c: where TMA descriptors are made, forwarded, and each one's region
 * remembered (tensor_maps.h) so that a launch passing it by value prefetches the managed
 * memory it names. Host-only calls (cuda.h lists no stream): pump adds one copy of the
 * 128 bytes and a table write, no driver call.
 *
 * cuTensorMapReplaceAddress keeps the descriptor's shape and changes its address (cuda.h:
 * the new one "must follow previous alignment requirements"): the region keeps the old
 * descriptor's extent, read before the call changes its bytes. One pump never saw made
 * covers its start alone (the allocation holding it, by the scan's whole-allocation rule).
 * Not seen at all: descriptors changed on the device (PTX tensormap.replace) or passed by
 * pointer in a workspace (docs/limits.md).
 */
#include "hooks_common.h"
#include "tensor_maps.h"

static void learn(const CUtensorMap *map, void *address, uint64_t extent)
{
    if (map == NULL || atomic_load_explicit(&pump_passthrough, memory_order_relaxed))
        return;
    pump_tensor_map_note(map, (uint64_t)(uintptr_t)address, extent > 0 ? extent : 1);
}

CUresult pump_tensor_map_encode_tiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                      cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                      const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
                                      const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
                                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                      CUtensorMapFloatOOBfill oobFill)
{
    PUMP_REAL_OR_RETURN(tensor_map_encode_tiled, real);
    CUresult r = real(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, boxDim,
                      elementStrides, interleave, swizzle, l2Promotion, oobFill);
    if (r == CUDA_SUCCESS)
        learn(tensorMap, globalAddress, pump_tensor_map_extent(tensorDataType, tensorRank, globalDim, globalStrides));
    return r;
}

CUresult pump_tensor_map_encode_im2col(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                       cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                       const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
                                       const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                       cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
                                       CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                       CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    PUMP_REAL_OR_RETURN(tensor_map_encode_im2col, real);
    CUresult r = real(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                      pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel, pixelsPerColumn, elementStrides,
                      interleave, swizzle, l2Promotion, oobFill);
    if (r == CUDA_SUCCESS)
        learn(tensorMap, globalAddress, pump_tensor_map_extent(tensorDataType, tensorRank, globalDim, globalStrides));
    return r;
}

CUresult pump_tensor_map_encode_im2col_wide(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                            cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                            const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
                                            int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
                                            cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
                                            CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
                                            CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                            CUtensorMapFloatOOBfill oobFill)
{
    PUMP_REAL_OR_RETURN(tensor_map_encode_im2col_wide, real);
    CUresult r = real(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                      pixelBoxLowerCornerWidth, pixelBoxUpperCornerWidth, channelsPerPixel, pixelsPerColumn,
                      elementStrides, interleave, mode, swizzle, l2Promotion, oobFill);
    if (r == CUDA_SUCCESS)
        learn(tensorMap, globalAddress, pump_tensor_map_extent(tensorDataType, tensorRank, globalDim, globalStrides));
    return r;
}

CUresult pump_tensor_map_replace_address(CUtensorMap *tensorMap, void *globalAddress)
{
    PUMP_REAL_OR_RETURN(tensor_map_replace_address, real);
    uint64_t old_address = 0, extent = 0;
    if (tensorMap != NULL && !pump_tensor_map_find(tensorMap, &old_address, &extent))
        extent = 0;
    CUresult r = real(tensorMap, globalAddress);
    if (r == CUDA_SUCCESS)
        learn(tensorMap, globalAddress, extent);
    return r;
}
