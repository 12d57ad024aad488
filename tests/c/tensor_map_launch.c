/* tensor_map_launch.c: kernels given TMA descriptors (CUtensorMap, by value), for
 * tests/test_tensor_maps.py. The address inside a descriptor is no plain word of the
 * arguments, so pump must learn it where the descriptor is made.
 * Why an imitation, not the real client (tests/test_real_client*.py): faults: the
 * TMA copies here touch the tensors (real kernels, cuBLAS's among them, are no-ops on
 * fakecuda), and descriptors the driver must refuse.
 *
 *   tensor_map_launch
 * Four managed tensors of 4 MiB the host wrote; for each, a descriptor (cuTensorMapEncodeTiled
 * over A, cuTensorMapReplaceAddress of that descriptor to B, cuTensorMapEncodeIm2col over C,
 * cuTensorMapEncodeIm2colWide over D) and one launch of a kernel whose TMA copies read the
 * whole tensor (fakecuda_tensor_map_touch); the first two launches pass kernelParams, the
 * others the `extra` buffer. Before them, descriptors the driver must refuse (cuda.h's
 * rules). One JSON line: each launch's GPU faults, the refusals that held, a checksum.
 */
#include <string.h>

#include "cuda_api.h"

#define BYTES ((size_t)4 << 20)
#define ROW 1024 /* floats in a row of the 2-D tensors */

#include "procaddr_entry.h"

static void (*tensor_map_touch)(const void *);

/* Reads the tensor the descriptor names, as a TMA copy would, and nothing else. */
static void tma_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    tensor_map_touch(params[0]);
}

static uint64_t faults_of_launch(CUfunction f, CUstream stream, const CUtensorMap *map, int extra_form)
{
    struct fakecuda_stats s;
    api.reset_stats();
    void *params[] = {(void *)map};
    _Alignas(CUtensorMap) unsigned char buffer[sizeof(CUtensorMap)];
    memcpy(buffer, map, sizeof buffer);
    size_t size = sizeof buffer;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    CHECK(api.launch_kernel(f, 1, 1, 1, 128, 1, 1, 0, stream, extra_form ? NULL : params, extra_form ? extra : NULL));
    CHECK(api.stream_synchronize(stream));
    api.get_stats(&s);
    return s.gpu_faults;
}

/* Descriptors cuda.h's rules forbid: each must be refused with CUDA_ERROR_INVALID_VALUE. */
static int refusals(void *address)
{
    PFN_cuTensorMapEncodeTiled_v12000 tiled = ENTRY(cuTensorMapEncodeTiled, 12000);
    CUtensorMap maps[2];
    cuuint64_t dims[2] = {ROW, 4}, strides[1] = {ROW * sizeof(float)}, odd_strides[1] = {ROW * sizeof(float) + 8};
    cuuint32_t box[2] = {32, 4}, big_box[2] = {512, 4}, steps[2] = {1, 1};
    const CUtensorMapDataType f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUtensorMapInterleave none = CU_TENSOR_MAP_INTERLEAVE_NONE;
    const CUtensorMapSwizzle no_swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
    const CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_NONE;
    const CUtensorMapFloatOOBfill oob = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
    CUresult r[] = {
        /* "tensorMap address must be aligned to 64 bytes" */
        tiled((CUtensorMap *)((char *)&maps[0] + 16), f32, 2, address, dims, strides, box, steps, none, no_swizzle,
              l2, oob),
        /* "tensorRank must be non-zero" */
        tiled(&maps[0], f32, 0, address, dims, strides, box, steps, none, no_swizzle, l2, oob),
        /* "globalAddress ... must be 16 byte aligned" */
        tiled(&maps[0], f32, 2, (char *)address + 8, dims, strides, box, steps, none, no_swizzle, l2, oob),
        /* "globalStrides ... must be a multiple of 16" */
        tiled(&maps[0], f32, 2, address, dims, odd_strides, box, steps, none, no_swizzle, l2, oob),
        /* "boxDim ... less than or equal to 256" */
        tiled(&maps[0], f32, 2, address, dims, strides, big_box, steps, none, no_swizzle, l2, oob),
        /* the inner box dimension (32 floats, 128 bytes) over CU_TENSOR_MAP_SWIZZLE_64B's span */
        tiled(&maps[0], f32, 2, address, dims, strides, box, steps, none, CU_TENSOR_MAP_SWIZZLE_64B, l2, oob),
        /* interleave needs tensorRank >= 3 */
        tiled(&maps[0], f32, 2, address, dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_16B, no_swizzle, l2, oob),
    };
    int held = 0;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        held += r[i] == CUDA_ERROR_INVALID_VALUE;
    return held;
}

int main(void)
{
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&tensor_map_touch = lib != NULL ? dlsym(lib, "fakecuda_tensor_map_touch") : NULL;
    if (tensor_map_touch == NULL)
        return 3;
    const size_t sizes[] = {sizeof(CUtensorMap)}, aligns[] = {_Alignof(CUtensorMap)};
    CUfunction f = cuda_api_kernel("tma", tma_kernel, 1, sizes, aligns);
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr t[4];
    for (int i = 0; i < 4; i++) {
        CHECK(api.mem_alloc_managed(&t[i], BYTES, CU_MEM_ATTACH_GLOBAL));
        host_fill((float *)(uintptr_t)t[i], BYTES / sizeof(float), (float)i);
    }
    int held = refusals((void *)(uintptr_t)t[0]);

    const CUtensorMapDataType f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_NONE;
    const CUtensorMapFloatOOBfill oob = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
    CUtensorMap map;
    /* A and B: ROW x ROW floats, rows ROW * 4 bytes apart; 32 x 32 boxes. */
    cuuint64_t dims2[2] = {ROW, BYTES / sizeof(float) / ROW}, strides2[1] = {ROW * sizeof(float)};
    cuuint32_t box2[2] = {32, 32}, steps[5] = {1, 1, 1, 1, 1};
    CHECK(ENTRY(cuTensorMapEncodeTiled, 12000)(&map, f32, 2, (void *)(uintptr_t)t[0], dims2, strides2, box2, steps,
                                                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2, oob));
    uint64_t tiled = faults_of_launch(f, stream, &map, 0);
    CHECK(ENTRY(cuTensorMapReplaceAddress, 12000)(&map, (void *)(uintptr_t)t[1]));
    uint64_t replaced = faults_of_launch(f, stream, &map, 0);
    /* C: NHWC 1 x 32 x 32 x 1024 floats (4 MiB); 64 channels a pixel. */
    cuuint64_t dims4[4] = {ROW, 32, 32, 1};
    cuuint64_t strides4[3] = {ROW * sizeof(float), 32 * ROW * sizeof(float), 32 * 32 * ROW * sizeof(float)};
    int lower[2] = {0, 0}, upper[2] = {-1, -1};
    CHECK(ENTRY(cuTensorMapEncodeIm2col, 12000)(&map, f32, 4, (void *)(uintptr_t)t[2], dims4, strides4, lower, upper,
                                                 32, 64, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                 CU_TENSOR_MAP_SWIZZLE_128B, l2, oob));
    uint64_t im2col = faults_of_launch(f, stream, &map, 1);
    /* D: NWC 1 x 1024 x 1024 floats (4 MiB). */
    cuuint64_t dims3[3] = {ROW, ROW, 1}, strides3[2] = {ROW * sizeof(float), ROW * ROW * sizeof(float)};
    CHECK(ENTRY(cuTensorMapEncodeIm2colWide, 12080)(&map, f32, 3, (void *)(uintptr_t)t[3], dims3, strides3, 0, -1,
                                                     32, 64, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                     CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, CU_TENSOR_MAP_SWIZZLE_128B, l2,
                                                     oob));
    uint64_t wide = faults_of_launch(f, stream, &map, 1);

    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 4; i++) {
        api.host_touch((void *)(uintptr_t)t[i], BYTES);
        h = fnv1a(h, (const void *)(uintptr_t)t[i], BYTES);
        CHECK(api.mem_free(t[i]));
    }
    printf("{\"tiled\": %llu, \"replaced\": %llu, \"im2col\": %llu, \"im2col_wide\": %llu, \"refusals\": %d, "
           "\"checksum\": \"%016llx\"}\n",
           (unsigned long long)tiled, (unsigned long long)replaced, (unsigned long long)im2col,
           (unsigned long long)wide, held, (unsigned long long)h);
    return 0;
}
