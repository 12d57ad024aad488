/* hooks.h: the one list of driver entry points pump intercepts.
 *
 * Each entry is an ABI symbol of libcuda (the exact variant: _v2, _ptsz, the
 * 4- or 5-argument cuGetProcAddress) with its PFN type from cudaTypedefs.h.
 * From this list come: the exported hook functions (programs linked to libcuda
 * bind to them through LD_PRELOAD), the names the dlsym hook answers for, the
 * real pointers the hooks forward to, and the pointer-identity map that lets
 * cuGetProcAddress hand back the hook of exactly the variant the driver chose.
 */
#ifndef PUMP_HOOKS_H
#define PUMP_HOOKS_H

#include "shim.h"

/* The 1-argument cuStreamBeginCapture of CUDA 10.0 (cuda.h now names the _v2 form so),
 * likewise. */
typedef CUresult (CUDAAPI *pump_pfn_stream_begin_capture_v10000)(CUstream hStream);

/* The 5-argument cuGraphInstantiate of CUDA 10 and 11 (cuGraphInstantiate and
 * _v2): libcuda still exports it, cudaTypedefs.h names it only internally. */
typedef CUresult (CUDAAPI *pump_pfn_graph_instantiate_v10000)(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                               CUgraphNode *phErrorNode, char *logBuffer,
                                                               size_t bufferSize);

/* X(id, ABI symbol, PFN type) */
#define PUMP_HOOKS(X)                                                                   \
    X(get_proc_address, "cuGetProcAddress", PFN_cuGetProcAddress_v11030)                \
    X(get_proc_address_v2, "cuGetProcAddress_v2", PFN_cuGetProcAddress_v12000)          \
    X(mem_alloc_managed, "cuMemAllocManaged", PFN_cuMemAllocManaged_v6000)              \
    X(mem_alloc, "cuMemAlloc_v2", PFN_cuMemAlloc_v3020)                                 \
    X(mem_free, "cuMemFree_v2", PFN_cuMemFree_v3020)                                    \
    X(mem_alloc_async, "cuMemAllocAsync", PFN_cuMemAllocAsync_v11020)                   \
    X(mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz", PFN_cuMemAllocAsync_v11020_ptsz)    \
    X(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync",                             \
      PFN_cuMemAllocFromPoolAsync_v11020)                                               \
    X(mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync_ptsz",                   \
      PFN_cuMemAllocFromPoolAsync_v11020_ptsz)                                          \
    X(mem_free_async, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020)                      \
    X(mem_free_async_ptsz, "cuMemFreeAsync_ptsz", PFN_cuMemFreeAsync_v11020_ptsz)       \
    X(mem_get_info, "cuMemGetInfo_v2", PFN_cuMemGetInfo_v3020)                          \
    /* read-mostly advice: what an eviction of pump's would free (hooks_memory.c) */    \
    X(mem_advise, "cuMemAdvise", PFN_cuMemAdvise_v8000)                                 \
    X(mem_advise_v2, "cuMemAdvise_v2", PFN_cuMemAdvise_v12020)                          \
    /* the device pool's settings, followed by the managed pool standing in (hooks_pool.c) */ \
    X(mem_pool_set_attribute, "cuMemPoolSetAttribute", PFN_cuMemPoolSetAttribute_v11020) \
    X(mem_pool_trim_to, "cuMemPoolTrimTo", PFN_cuMemPoolTrimTo_v11020)                  \
    /* pools made current join, and pools that go leave, those memory queries ask (pool_memory.h) */ \
    X(device_set_mem_pool, "cuDeviceSetMemPool", PFN_cuDeviceSetMemPool_v11020)         \
    X(mem_pool_destroy, "cuMemPoolDestroy", PFN_cuMemPoolDestroy_v11020)                \
    X(mem_create, "cuMemCreate", PFN_cuMemCreate_v10020)                                \
    X(ipc_get_mem_handle, "cuIpcGetMemHandle", PFN_cuIpcGetMemHandle_v4010)             \
    X(launch_kernel, "cuLaunchKernel", PFN_cuLaunchKernel_v4000)                        \
    X(launch_kernel_ptsz, "cuLaunchKernel_ptsz", PFN_cuLaunchKernel_v7000_ptsz)         \
    X(launch_kernel_ex, "cuLaunchKernelEx", PFN_cuLaunchKernelEx_v11060)                \
    X(launch_kernel_ex_ptsz, "cuLaunchKernelEx_ptsz", PFN_cuLaunchKernelEx_v11060_ptsz) \
    X(launch_cooperative_kernel, "cuLaunchCooperativeKernel",                           \
      PFN_cuLaunchCooperativeKernel_v9000)                                              \
    X(launch_cooperative_kernel_ptsz, "cuLaunchCooperativeKernel_ptsz",                 \
      PFN_cuLaunchCooperativeKernel_v9000_ptsz)                                         \
    X(graph_launch, "cuGraphLaunch", PFN_cuGraphLaunch_v10000)                          \
    X(graph_launch_ptsz, "cuGraphLaunch_ptsz", PFN_cuGraphLaunch_v10000_ptsz)           \
    X(ctx_synchronize, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000)                  \
    X(ctx_synchronize_v2, "cuCtxSynchronize_v2", PFN_cuCtxSynchronize_v13000)           \
    X(stream_synchronize, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000)         \
    X(stream_synchronize_ptsz, "cuStreamSynchronize_ptsz",                              \
      PFN_cuStreamSynchronize_v7000_ptsz)                                               \
    X(event_synchronize, "cuEventSynchronize", PFN_cuEventSynchronize_v2000)                \
    /* every way to begin and end a stream capture: whether one is open (hooks_capture.c) */ \
    X(stream_begin_capture, "cuStreamBeginCapture", pump_pfn_stream_begin_capture_v10000) \
    X(stream_begin_capture_ptsz, "cuStreamBeginCapture_ptsz", pump_pfn_stream_begin_capture_v10000) \
    X(stream_begin_capture_v2, "cuStreamBeginCapture_v2", PFN_cuStreamBeginCapture_v10010) \
    X(stream_begin_capture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz", PFN_cuStreamBeginCapture_v10010_ptsz) \
    X(stream_begin_capture_to_graph, "cuStreamBeginCaptureToGraph", PFN_cuStreamBeginCaptureToGraph_v12030) \
    X(stream_begin_capture_to_graph_ptsz, "cuStreamBeginCaptureToGraph_ptsz",            \
      PFN_cuStreamBeginCaptureToGraph_v12030_ptsz)                                       \
    X(stream_begin_recapture_to_graph, "cuStreamBeginRecaptureToGraph",                  \
      PFN_cuStreamBeginRecaptureToGraph_v13030)                                          \
    X(stream_begin_recapture_to_graph_ptsz, "cuStreamBeginRecaptureToGraph_ptsz",        \
      PFN_cuStreamBeginRecaptureToGraph_v13030_ptsz)                                     \
    X(stream_begin_capture_to_cig, "cuStreamBeginCaptureToCig", PFN_cuStreamBeginCaptureToCig_v13010) \
    X(stream_begin_capture_to_cig_ptsz, "cuStreamBeginCaptureToCig_ptsz", PFN_cuStreamBeginCaptureToCig_v13010_ptsz) \
    X(stream_end_capture, "cuStreamEndCapture", PFN_cuStreamEndCapture_v10000)          \
    X(stream_end_capture_ptsz, "cuStreamEndCapture_ptsz", PFN_cuStreamEndCapture_v10000_ptsz) \
    X(stream_end_capture_to_cig, "cuStreamEndCaptureToCig", PFN_cuStreamEndCaptureToCig_v13010) \
    X(stream_end_capture_to_cig_ptsz, "cuStreamEndCaptureToCig_ptsz", PFN_cuStreamEndCaptureToCig_v13010_ptsz) \
    /* streams and contexts that go, and what changes the context of a launch's stream  \
     * (hooks_stream.c, hooks_context.c); the unsuffixed reset and release have the _v2   \
     * forms' signature */                                                                \
    X(stream_destroy, "cuStreamDestroy_v2", PFN_cuStreamDestroy_v4000)                  \
    X(ctx_set_current, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000)                    \
    X(ctx_push_current, "cuCtxPushCurrent_v2", PFN_cuCtxPushCurrent_v4000)              \
    X(ctx_pop_current, "cuCtxPopCurrent_v2", PFN_cuCtxPopCurrent_v4000)                 \
    X(ctx_create, "cuCtxCreate_v2", PFN_cuCtxCreate_v3020)                              \
    X(ctx_create_v3, "cuCtxCreate_v3", PFN_cuCtxCreate_v11040)                          \
    X(ctx_create_v4, "cuCtxCreate_v4", PFN_cuCtxCreate_v12050)                          \
    X(ctx_destroy, "cuCtxDestroy_v2", PFN_cuCtxDestroy_v4000)                            \
    X(primary_ctx_reset, "cuDevicePrimaryCtxReset", PFN_cuDevicePrimaryCtxReset_v11000)  \
    X(primary_ctx_reset_v2, "cuDevicePrimaryCtxReset_v2", PFN_cuDevicePrimaryCtxReset_v11000) \
    X(primary_ctx_release, "cuDevicePrimaryCtxRelease", PFN_cuDevicePrimaryCtxRelease_v11000) \
    X(primary_ctx_release_v2, "cuDevicePrimaryCtxRelease_v2", PFN_cuDevicePrimaryCtxRelease_v11000) \
    /* graphs: instantiation, update and destruction (hooks_graph.c) */                  \
    X(graph_instantiate, "cuGraphInstantiate", pump_pfn_graph_instantiate_v10000)        \
    X(graph_instantiate_v2, "cuGraphInstantiate_v2", pump_pfn_graph_instantiate_v10000)  \
    X(graph_instantiate_with_flags, "cuGraphInstantiateWithFlags",                      \
      PFN_cuGraphInstantiateWithFlags_v11040)                                           \
    X(graph_instantiate_with_params, "cuGraphInstantiateWithParams",                    \
      PFN_cuGraphInstantiateWithParams_v12000)                                          \
    X(graph_instantiate_with_params_ptsz, "cuGraphInstantiateWithParams_ptsz",          \
      PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                     \
    X(graph_exec_update, "cuGraphExecUpdate", PFN_cuGraphExecUpdate_v10020)              \
    X(graph_exec_update_v2, "cuGraphExecUpdate_v2", PFN_cuGraphExecUpdate_v12000)        \
    X(graph_exec_kernel_node_set_params, "cuGraphExecKernelNodeSetParams",              \
      PFN_cuGraphExecKernelNodeSetParams_v10010)                                        \
    X(graph_exec_kernel_node_set_params_v2, "cuGraphExecKernelNodeSetParams_v2",        \
      PFN_cuGraphExecKernelNodeSetParams_v12000)                                        \
    X(graph_exec_node_set_params, "cuGraphExecNodeSetParams", PFN_cuGraphExecNodeSetParams_v12020) \
    X(graph_exec_destroy, "cuGraphExecDestroy", PFN_cuGraphExecDestroy_v10000)          \
    /* where kernel handles come from: each layout is asked by its kind (hooks_handles.c) */ \
    X(module_get_function, "cuModuleGetFunction", PFN_cuModuleGetFunction_v2000)        \
    X(module_enumerate_functions, "cuModuleEnumerateFunctions",                         \
      PFN_cuModuleEnumerateFunctions_v12040)                                            \
    X(kernel_get_function, "cuKernelGetFunction", PFN_cuKernelGetFunction_v12000)       \
    X(library_get_kernel, "cuLibraryGetKernel", PFN_cuLibraryGetKernel_v12000)          \
    X(library_enumerate_kernels, "cuLibraryEnumerateKernels",                           \
      PFN_cuLibraryEnumerateKernels_v12040)                                             \
    /* ... and where they end: their addresses may name other kernels after */          \
    X(module_unload, "cuModuleUnload", PFN_cuModuleUnload_v2000)                        \
    X(library_unload, "cuLibraryUnload", PFN_cuLibraryUnload_v12000)                    \
    /* TMA descriptors: the memory each names (hooks_tensor_maps.c) */                  \
    X(tensor_map_encode_tiled, "cuTensorMapEncodeTiled", PFN_cuTensorMapEncodeTiled_v12000) \
    X(tensor_map_encode_im2col, "cuTensorMapEncodeIm2col", PFN_cuTensorMapEncodeIm2col_v12000) \
    X(tensor_map_encode_im2col_wide, "cuTensorMapEncodeIm2colWide",                     \
      PFN_cuTensorMapEncodeIm2colWide_v12080)                                           \
    X(tensor_map_replace_address, "cuTensorMapReplaceAddress", PFN_cuTensorMapReplaceAddress_v12000)

enum pump_hook_id {
#define PUMP_HOOK_ENUM(id, name, pfn) PUMP_HOOK_##id,
    PUMP_HOOKS(PUMP_HOOK_ENUM)
#undef PUMP_HOOK_ENUM
    PUMP_HOOK_COUNT
};

/* The hooks: C name pump_<id>, exported under the driver's symbol. */
#define PUMP_HOOK_DECLARE(id, name, pfn)                                     \
    typedef pfn pump_pfn_##id;                                               \
    extern __typeof__(*(pfn)0) pump_##id __asm__(name)                       \
        __attribute__((visibility("default")));
PUMP_HOOKS(PUMP_HOOK_DECLARE)
#undef PUMP_HOOK_DECLARE

struct pump_hook {
    const char *name;
    void *hook;
};
extern PUMP_HIDDEN const struct pump_hook pump_hooks[PUMP_HOOK_COUNT];

/* The driver's own function for each hook, resolved by pump_driver_ready(). */
extern PUMP_HIDDEN void *pump_real[PUMP_HOOK_COUNT];
#define PUMP_REAL(id) ((pump_pfn_##id)pump_real[PUMP_HOOK_##id])

/* Index of a hooked symbol name, or -1. */
PUMP_HIDDEN int pump_hook_find(const char *name);

/* Whether fn is one of pump's hooks (never a real entry point). */
PUMP_HIDDEN bool pump_is_own_hook(const void *fn);

/* Whether hook `id` is a kernel launch entry point (cuLaunchKernel*, cuLaunchCooperativeKernel*,
 * cuGraphLaunch*). */
PUMP_HIDDEN bool pump_hook_is_launch(int id);

/* The hook whose ABI name is `symbol` or one of its variants (_v2, _v3, _v4, _ptsz, _ptds and
 * _v2_ptsz, _v2_ptds: the names cuGetProcAddress is asked for are the base names), or -1. */
PUMP_HIDDEN int pump_hook_of_base(const char *symbol);

/* Whether `fn` is libcuda's export of `symbol` or of one of its variants (as above), from
 * libcuda's handle through glibc's own dlsym; false before the driver is loaded. */
PUMP_HIDDEN bool pump_driver_exports(const char *symbol, const void *fn);

/* The status a hook returns when it cannot reach the driver's function. */
PUMP_HIDDEN CUresult pump_missing_entry(void);

#endif
