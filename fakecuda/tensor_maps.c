/* tensor_maps.c: why it exists: TMA descriptors (CUtensorMap), made on the host by
 * cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col, cuTensorMapEncodeIm2colWide (CUDA 12.8)
 * and re-addressed by cuTensorMapReplaceAddress, then passed to kernels by value; a kernel
 * reaches the memory one names through fakecuda_tensor_map_touch.
 *
 * Validation follows cuda.h's requirements for each call (quoted where checked), with its
 * only listed argument error, CUDA_ERROR_INVALID_VALUE; a call with no current context is
 * CUDA_ERROR_INVALID_CONTEXT (listed too: the strict reading). The 128 bytes are opaque in
 * cuda.h ("should only be accessed through CUDA APIs and PTX") and so are fakecuda's: every
 * field is scrambled with a key drawn at load and sealed with a check word, so no word of a
 * descriptor is the address it names, and a caller cannot learn it by reading words. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TM_TILED = 1, TM_IM2COL, TM_IM2COL_WIDE };
enum { W_HEAD, W_ADDRESS, W_DIMS, W_STRIDES = W_DIMS + 5, W_SEAL = 15 };

static uint64_t fc_tm_key;
static pthread_once_t fc_tm_once = PTHREAD_ONCE_INIT;
static void load_key(void) { fc_tm_key = (fc_now_ns() ^ (uint64_t)(uintptr_t)&fc_tm_key) * 0x9E3779B97F4A7C15ull | 1; }

static uint64_t scramble(uint64_t v, int i) { return (v ^ (fc_tm_key * (uint64_t)(2 * i + 1))) * 0xbf58476d1ce4e5b9ull; }
static uint64_t unscramble(uint64_t v, int i)
{
    /* the inverse of multiplying by an odd constant, mod 2^64 (Newton's iteration) */
    uint64_t m = 0xbf58476d1ce4e5b9ull, inv = m;
    for (int k = 0; k < 5; k++) inv *= 2 - m * inv;
    return (v * inv) ^ (fc_tm_key * (uint64_t)(2 * i + 1));
}
static uint64_t seal_of(const uint64_t *w)
{
    uint64_t h = fc_tm_key;
    for (int i = 0; i < W_SEAL; i++) h = (h ^ w[i]) * 0x94d049bb133111ebull;
    return h;
}

/* Element size in bits (cuda.h's CUtensorMapDataType comments); packed kinds by the bytes they take. */
static unsigned elem_bits(int type)
{
    static const unsigned bits[] = {8, 16, 32, 32, 64, 64, 16, 32, 64, 16, 32, 32, 32, 4, 8, 8};
    return bits[type];
}
static int is_float(int t) { return t >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && t <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ; }
static int packed16(int t)
{
    return t == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B || t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
}

/* The rules the three encode calls share (cuda.h, cuTensorMapEncodeTiled and the im2col calls). */
static CUresult check_common(const CUtensorMap *map, int type, unsigned rank, const void *address,
                             const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *elem_strides,
                             int interleave, int l2, int oob)
{
    if (!fc_ctx_valid(fc_current_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    /* "tensorMap address must be aligned to 64 bytes" */
    if (!map || ((uintptr_t)map & 63)) return CUDA_ERROR_INVALID_VALUE;
    if (type < 0 || type > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B) return CUDA_ERROR_INVALID_VALUE;
    if (interleave < 0 || interleave > CU_TENSOR_MAP_INTERLEAVE_32B) return CUDA_ERROR_INVALID_VALUE;
    /* "If interleave is not CU_TENSOR_MAP_INTERLEAVE_NONE, then tensorRank must additionally be >= 3" */
    if (rank == 0 || rank > 5 || (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3))
        return CUDA_ERROR_INVALID_VALUE;
    /* "globalAddress ... must be 16 byte aligned"; 32 with INTERLEAVE_32B or the ALIGN16B packed types */
    unsigned align = interleave == CU_TENSOR_MAP_INTERLEAVE_32B || packed16(type) ? 32 : 16;
    if (!address || ((uintptr_t)address & (align - 1))) return CUDA_ERROR_INVALID_VALUE;
    /* "globalDim ... must be non-zero and less than or equal to 2^32" */
    if (!dims || !elem_strides || (rank > 1 && !strides)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < rank; i++)
        if (dims[i] == 0 || dims[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (packed16(type) && dims[0] % 128) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B && dims[0] % 2) return CUDA_ERROR_INVALID_VALUE;
    /* "globalStrides ... must be a multiple of 16 and less than 2^40" (32 with INTERLEAVE_32B or
     * the ALIGN16B packed types); "globalStrides[0] = globalDim[0] * elementSizeInBytes(tensorDataType)
     * + padding[0]": rows do not overlap */
    for (unsigned i = 0; i + 1 < rank; i++)
        if (strides[i] % align || strides[i] >= (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
    if (rank > 1 && strides[0] < (dims[0] * elem_bits(type) + 7) / 8) return CUDA_ERROR_INVALID_VALUE;
    /* "elementStrides ... must be non-zero and less than or equal to 8" */
    for (unsigned i = 0; i < rank; i++)
        if (elem_strides[i] == 0 || elem_strides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    if (l2 < 0 || l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B) return CUDA_ERROR_INVALID_VALUE;
    /* "NAN_REQUEST_ZERO_FMA can only be used when tensorDataType represents a floating-point data type" */
    if (oob < 0 || oob > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA ||
        (oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float(type)))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* "the bounding box inner dimension ... must be less than or equal to the swizzle size" */
static CUresult check_swizzle(int type, int interleave, int swizzle, uint64_t inner_elems)
{
    static const unsigned span[] = {0, 32, 64, 128, 128, 128, 128};
    if (swizzle < 0 || swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B) return CUDA_ERROR_INVALID_VALUE;
    /* "When interleave is CU_TENSOR_MAP_INTERLEAVE_32B, swizzle must be CU_TENSOR_MAP_SWIZZLE_32B" */
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_32B && swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
        return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B && interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_NONE &&
        inner_elems * elem_bits(type) / 8 > span[swizzle])
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static void encode(CUtensorMap *map, int kind, int type, unsigned rank, const void *address, const cuuint64_t *dims,
                   const cuuint64_t *strides, uint64_t shape)
{
    pthread_once(&fc_tm_once, load_key);
    uint64_t w[16] = {0};
    w[W_HEAD] = (uint64_t)kind | (uint64_t)type << 8 | (uint64_t)rank << 16 | shape << 24;
    w[W_ADDRESS] = (uint64_t)(uintptr_t)address;
    for (unsigned i = 0; i < rank; i++) w[W_DIMS + i] = dims[i];
    for (unsigned i = 0; i + 1 < rank; i++) w[W_STRIDES + i] = strides[i];
    for (int i = 0; i < W_SEAL; i++) w[i] = scramble(w[i], i);
    w[W_SEAL] = seal_of(w);
    memcpy(map->opaque, w, sizeof w);
    fc_cost(FC_E_TENSOR_MAP, FAKECUDA_TENSOR_MAP_HOST_NS);
}

/* The fields of a descriptor fakecuda made (scrambled words undone), or 0 if it made none such. */
static int decode(const void *map, uint64_t *w)
{
    if (!map) return 0;
    pthread_once(&fc_tm_once, load_key);
    memcpy(w, map, 16 * sizeof *w);
    if (seal_of(w) != w[W_SEAL]) return 0;
    for (int i = 0; i < W_SEAL; i++) w[i] = unscramble(w[i], i);
    return 1;
}

FC_EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                          cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                          const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
                                          const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
                                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                          CUtensorMapFloatOOBfill oobFill)
{
    FC_ENTRY(cuTensorMapEncodeTiled, 12000);
    int type = (int)tensorDataType;
    CUresult r = check_common(tensorMap, type, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                              (int)interleave, (int)l2Promotion, (int)oobFill);
    if (r != CUDA_SUCCESS) return r;
    /* "boxDim ... must be non-zero and less than or equal to 256"; with INTERLEAVE_NONE
     * "boxDim[0] * elementSizeInBytes(tensorDataType) must be a multiple of 16 bytes"; the
     * ALIGN16B packed types: "boxDim[0] must be 128" */
    if (!boxDim) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < tensorRank; i++)
        if (boxDim[i] == 0 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && (boxDim[0] * elem_bits(type) / 8) % 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (packed16(type) && boxDim[0] != 128) return CUDA_ERROR_INVALID_VALUE;
    r = check_swizzle(type, (int)interleave, (int)swizzle, boxDim[0]);
    if (r != CUDA_SUCCESS) return r;
    encode(tensorMap, TM_TILED, type, tensorRank, globalAddress, globalDim, globalStrides,
           (uint64_t)swizzle | (uint64_t)interleave << 8);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuTensorMapEncodeTiled);

/* "When tensorRank is 3, one signed offset within range [-32768, 32767] ... 4, two within
 * [-128, 127] ... 5, three within [-16, 15]", the box "must have non-zero area". */
static CUresult check_corners(unsigned rank, const int *lower, const int *upper)
{
    static const int limit[] = {0, 0, 0, 32768, 128, 16};
    if (!lower || !upper) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i + 2 < rank; i++)
        if (lower[i] < -limit[rank] || lower[i] >= limit[rank] || upper[i] < -limit[rank] || upper[i] >= limit[rank])
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* "channelsPerPixel ... must be less than or equal to 256" (128 for the ALIGN16B packed types),
 * "pixelsPerColumn ... must be less than or equal to 1024" */
static CUresult check_pixels(int type, unsigned channels, unsigned pixels, int pixels_ignored)
{
    if (channels == 0 || channels > 256 || (packed16(type) && channels != 128)) return CUDA_ERROR_INVALID_VALUE;
    if (!pixels_ignored && (pixels == 0 || pixels > 1024)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuTensorMapEncodeIm2col(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                           cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                           const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
                                           const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                           cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
                                           CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                           CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    FC_ENTRY(cuTensorMapEncodeIm2col, 12000);
    int type = (int)tensorDataType;
    /* "tensorRank, which specifies the number of tensor dimensions, must be 3, 4, or 5" */
    if (tensorRank < 3) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_common(tensorMap, type, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                              (int)interleave, (int)l2Promotion, (int)oobFill);
    if (r == CUDA_SUCCESS) r = check_corners(tensorRank, pixelBoxLowerCorner, pixelBoxUpperCorner);
    if (r == CUDA_SUCCESS) r = check_pixels(type, channelsPerPixel, pixelsPerColumn, 0);
    if (r == CUDA_SUCCESS) r = check_swizzle(type, (int)interleave, (int)swizzle, channelsPerPixel);
    if (r != CUDA_SUCCESS) return r;
    encode(tensorMap, TM_IM2COL, type, tensorRank, globalAddress, globalDim, globalStrides,
           (uint64_t)swizzle | (uint64_t)interleave << 8);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuTensorMapEncodeIm2col);

FC_EXPORT CUresult cuTensorMapEncodeIm2colWide(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                               cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                               const cuuint64_t *globalStrides, int pixelBoxLowerCornerWidth,
                                               int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
                                               cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
                                               CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
                                               CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                               CUtensorMapFloatOOBfill oobFill)
{
    FC_ENTRY(cuTensorMapEncodeIm2colWide, 12080);
    int type = (int)tensorDataType;
    if (tensorRank < 3) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_common(tensorMap, type, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                              (int)interleave, (int)l2Promotion, (int)oobFill);
    if (r != CUDA_SUCCESS) return r;
    /* "The offset must be within range [-32768, 32767]"; "mode ... W or W128"; pixelsPerColumn
     * "is ignored when mode is CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128"; swizzle "must be one of"
     * 64B, 128B, 128B_ATOM_32B ("other swizzle modes are not supported") */
    if (pixelBoxLowerCornerWidth < -32768 || pixelBoxLowerCornerWidth > 32767 || pixelBoxUpperCornerWidth < -32768 ||
        pixelBoxUpperCornerWidth > 32767)
        return CUDA_ERROR_INVALID_VALUE;
    if (mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W && mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128)
        return CUDA_ERROR_INVALID_VALUE;
    r = check_pixels(type, channelsPerPixel, pixelsPerColumn, mode == CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128);
    if (r != CUDA_SUCCESS) return r;
    if (swizzle != CU_TENSOR_MAP_SWIZZLE_64B && swizzle != CU_TENSOR_MAP_SWIZZLE_128B &&
        swizzle != CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B)
        return CUDA_ERROR_INVALID_VALUE;
    r = check_swizzle(type, (int)interleave, (int)swizzle, channelsPerPixel);
    if (r != CUDA_SUCCESS) return r;
    encode(tensorMap, TM_IM2COL_WIDE, type, tensorRank, globalAddress, globalDim, globalStrides,
           (uint64_t)swizzle | (uint64_t)interleave << 8);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuTensorMapEncodeIm2colWide);

/* "globalAddress ... must follow previous alignment requirements": a descriptor fakecuda did
 * not make is refused. */
FC_EXPORT CUresult cuTensorMapReplaceAddress(CUtensorMap *tensorMap, void *globalAddress)
{
    FC_ENTRY(cuTensorMapReplaceAddress, 12000);
    if (!fc_ctx_valid(fc_current_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t w[16];
    if (((uintptr_t)tensorMap & 63) || !decode(tensorMap, w)) return CUDA_ERROR_INVALID_VALUE;
    int type = (int)(w[W_HEAD] >> 8 & 0xff);
    int interleave = (int)(w[W_HEAD] >> 32 & 0xff);
    unsigned align = interleave == CU_TENSOR_MAP_INTERLEAVE_32B || packed16(type) ? 32 : 16;
    if (!globalAddress || ((uintptr_t)globalAddress & (align - 1))) return CUDA_ERROR_INVALID_VALUE;
    encode(tensorMap, (int)(w[W_HEAD] & 0xff), type, (unsigned)(w[W_HEAD] >> 16 & 0xff), globalAddress, &w[W_DIMS],
           &w[W_STRIDES], w[W_HEAD] >> 24);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuTensorMapReplaceAddress);

/* A kernel's TMA copies: every byte from the global address to the tensor's last element. */
FC_EXPORT void fakecuda_tensor_map_touch(const void *tensor_map)
{
    uint64_t w[16];
    if (!decode(tensor_map, w)) {
        fprintf(stderr, "fakecuda: a kernel was given a TMA descriptor fakecuda did not make\n");
        abort();
    }
    unsigned rank = (unsigned)(w[W_HEAD] >> 16 & 0xff);
    uint64_t extent = (w[W_DIMS] * elem_bits((int)(w[W_HEAD] >> 8 & 0xff)) + 7) / 8;
    for (unsigned i = 1; i < rank; i++) extent += (w[W_DIMS + i] - 1) * w[W_STRIDES + i - 1];
    fakecuda_touch((const void *)(uintptr_t)w[W_ADDRESS], extent);
}
