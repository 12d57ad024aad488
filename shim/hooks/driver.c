/* driver.c: finding libcuda at run time and resolving, once, every driver
 * function pump forwards to or calls for itself.
 *
 * libpump never links libcuda: it builds and loads anywhere, and a program
 * that never touches CUDA never loads the driver because of pump. The first
 * hook that runs loads it. cuGetProcAddress runs before cuInit in the CUDA
 * runtime, so nothing here needs cuInit.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "captures.h"
#include "channel.h"
#include "hooks.h"
#include "real_dlsym.h"

PUMP_HIDDEN void *pump_real[PUMP_HOOK_COUNT];
PUMP_HIDDEN _Thread_local unsigned int pump_hook_depth __attribute__((tls_model("initial-exec")));

PUMP_HIDDEN const struct pump_hook pump_hooks[PUMP_HOOK_COUNT] = {
#define PUMP_HOOK_ENTRY(id, name, pfn) [PUMP_HOOK_##id] = {name, (void *)pump_##id},
    PUMP_HOOKS(PUMP_HOOK_ENTRY)
#undef PUMP_HOOK_ENTRY
};

PUMP_HIDDEN int pump_hook_find(const char *name)
{
    for (int i = 0; i < PUMP_HOOK_COUNT; i++)
        if (strcmp(pump_hooks[i].name, name) == 0)
            return i;
    return -1;
}

PUMP_HIDDEN bool pump_hook_is_launch(int id)
{
    switch (id) {
    case PUMP_HOOK_launch_kernel:
    case PUMP_HOOK_launch_kernel_ptsz:
    case PUMP_HOOK_launch_kernel_ex:
    case PUMP_HOOK_launch_kernel_ex_ptsz:
    case PUMP_HOOK_launch_cooperative_kernel:
    case PUMP_HOOK_launch_cooperative_kernel_ptsz:
    case PUMP_HOOK_graph_launch:
    case PUMP_HOOK_graph_launch_ptsz:
        return true;
    default:
        return false;
    }
}

static const char *const variant_suffixes[] = {"", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds"};

PUMP_HIDDEN int pump_hook_of_base(const char *symbol)
{
    size_t n = strlen(symbol);
    for (int i = 0; i < PUMP_HOOK_COUNT; i++) {
        if (strncmp(pump_hooks[i].name, symbol, n) != 0)
            continue;
        for (size_t s = 0; s < sizeof variant_suffixes / sizeof variant_suffixes[0]; s++)
            if (strcmp(pump_hooks[i].name + n, variant_suffixes[s]) == 0)
                return i;
    }
    return -1;
}

static void *_Atomic driver_lib;  /* libcuda's handle, once loaded */

PUMP_HIDDEN bool pump_driver_exports(const char *symbol, const void *fn)
{
    void *lib = atomic_load_explicit(&driver_lib, memory_order_acquire);
    pump_dlsym_fn find = pump_libc_dlsym();
    if (lib == NULL || find == NULL || fn == NULL)
        return false;
    char name[128];
    for (size_t s = 0; s < sizeof variant_suffixes / sizeof variant_suffixes[0]; s++) {
        int len = snprintf(name, sizeof name, "%s%s", symbol, variant_suffixes[s]);
        if (len > 0 && (size_t)len < sizeof name && find(lib, name) == fn)
            return true;
    }
    return false;
}

PUMP_HIDDEN bool pump_is_own_hook(const void *fn)
{
    for (int i = 0; i < PUMP_HOOK_COUNT; i++)
        if (pump_hooks[i].hook == fn)
            return true;
    return false;
}

/* What pump forwards to or calls is never one of its own hooks: that would
 * call itself. A stacked interposer's dlsym, or a driver linked without
 * -Bsymbolic (its addresses of its own exports bind to pump's, which come
 * first), can answer with one; then the symbol is taken from the driver's
 * handle through glibc's own dlsym, and failing that pump stands aside for
 * that entry point (it answers as a missing one). */
static void *not_own(void *lib, const char *name, void *fn)
{
    if (fn == NULL || !pump_is_own_hook(fn))
        return fn;
    pump_dlsym_fn libc_dlsym = pump_libc_dlsym();
    void *own = libc_dlsym != NULL ? libc_dlsym(lib, name) : NULL;
    if (own != NULL && !pump_is_own_hook(own)) {
        pump_log_once("the driver's lookups answer with pump's own hooks: taken from libcuda's handle instead");
        return own;
    }
    pump_log_once("%s resolves only to pump's own hook: pump stands aside for it", name);
    return NULL;
}

enum { DRIVER_UNLOADED, DRIVER_LOADING, DRIVER_READY, DRIVER_FAILED };
static _Atomic int driver_state = DRIVER_UNLOADED;
static _Thread_local bool loading_on_this_thread;

PUMP_HIDDEN CUresult pump_missing_entry(void)
{
    return atomic_load_explicit(&driver_state, memory_order_acquire) == DRIVER_READY
               ? CUDA_ERROR_NOT_SUPPORTED
               : CUDA_ERROR_NOT_INITIALIZED;
}

/* The CUDA version the driver says it is (cuDriverGetVersion), set before pump's own calls are
 * resolved; 0: it did not say. */
static int driver_version;

/* pump's own calls: resolved the way the CUDA runtime does it, at the ABI
 * version pump was written against, legacy-stream flavour. A NULL answer
 * means this driver lacks it; only a driver without cuGetProcAddress (before
 * CUDA 11.3) is asked by symbol name. An entry newer than the driver is not
 * asked for: the 580 driver (CUDA 13.0) answers CUDA_ERROR_INVALID_VALUE to a
 * version above its own, which compute-sanitizer reports as an error of the
 * program's (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3, memcheck). */
static void *own_entry(void *lib, PFN_cuGetProcAddress_v12000 get_proc, const char *symbol,
                       int version, const char *abi_name)
{
    if (get_proc == NULL)
        return not_own(lib, abi_name, pump_real_dlsym()(lib, abi_name));
    if (driver_version != 0 && version > driver_version)
        return NULL;
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    if (get_proc(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS)
        return NULL;
    return not_own(lib, abi_name, fn);
}

/* A driver newer than the headers pump was built with may begin a capture in a way pump has
 * no hook for (CUDA 12.3 added cuStreamBeginCaptureToGraph, 13.1 cuStreamBeginCaptureToCig,
 * 13.3 cuStreamBeginRecaptureToGraph), and a program linked to it may call it directly. */
static void captures_known(void)
{
    if (driver_version == 0 || driver_version > CUDA_VERSION) {
        pump_log(1, "driver CUDA version %d, pump's headers %d", driver_version, CUDA_VERSION);
        pump_captures_untracked("the driver is newer than the CUDA headers pump was built with, or did not say its "
                                "version");
    }
}

static bool load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        pump_log(1, "libcuda.so.1 not found: pass-through");
        return false;
    }
    atomic_store_explicit(&driver_lib, lib, memory_order_release);
    pump_dlsym_fn real_dlsym = pump_real_dlsym();
    for (int i = 0; i < PUMP_HOOK_COUNT; i++)
        pump_real[i] = not_own(lib, pump_hooks[i].name, real_dlsym(lib, pump_hooks[i].name));

    PFN_cuGetProcAddress_v12000 get_proc = (PFN_cuGetProcAddress_v12000)pump_real[PUMP_HOOK_get_proc_address_v2];
    PFN_cuDriverGetVersion_v2020 get_version = own_entry(lib, get_proc, "cuDriverGetVersion", 2020, "cuDriverGetVersion");
    if (get_version == NULL || get_version(&driver_version) != CUDA_SUCCESS)
        driver_version = 0;
    struct pump_driver d = {
        .ctx_get_current = own_entry(lib, get_proc, "cuCtxGetCurrent", 4000, "cuCtxGetCurrent"),
        .ctx_get_device = own_entry(lib, get_proc, "cuCtxGetDevice", 2000, "cuCtxGetDevice"),
        .mem_get_info = own_entry(lib, get_proc, "cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
        .stream_create = own_entry(lib, get_proc, "cuStreamCreate", 2000, "cuStreamCreate"),
        .event_create = own_entry(lib, get_proc, "cuEventCreate", 2000, "cuEventCreate"),
        .event_record = own_entry(lib, get_proc, "cuEventRecord", 2000, "cuEventRecord"),
        .event_query = own_entry(lib, get_proc, "cuEventQuery", 2000, "cuEventQuery"),
        .stream_query = own_entry(lib, get_proc, "cuStreamQuery", 2000, "cuStreamQuery"),
        .event_elapsed = own_entry(lib, get_proc, "cuEventElapsedTime", 2000, "cuEventElapsedTime"),
        .stream_wait_event = own_entry(lib, get_proc, "cuStreamWaitEvent", 3020, "cuStreamWaitEvent"),
        .stream_synchronize = own_entry(lib, get_proc, "cuStreamSynchronize", 2000, "cuStreamSynchronize"),
        .stream_is_capturing = own_entry(lib, get_proc, "cuStreamIsCapturing", 10000, "cuStreamIsCapturing"),
        .exchange_capture_mode =
            own_entry(lib, get_proc, "cuThreadExchangeStreamCaptureMode", 10010, "cuThreadExchangeStreamCaptureMode"),
        .prefetch_batch = own_entry(lib, get_proc, "cuMemPrefetchBatchAsync", 13000, "cuMemPrefetchBatchAsync"),
        .prefetch_v2 = own_entry(lib, get_proc, "cuMemPrefetchAsync", 12020, "cuMemPrefetchAsync_v2"),
        .prefetch_v1 = own_entry(lib, get_proc, "cuMemPrefetchAsync", 8000, "cuMemPrefetchAsync"),
        .func_param_info = own_entry(lib, get_proc, "cuFuncGetParamInfo", 12040, "cuFuncGetParamInfo"),
        .kernel_param_info = own_entry(lib, get_proc, "cuKernelGetParamInfo", 12040, "cuKernelGetParamInfo"),
        .func_param_count = own_entry(lib, get_proc, "cuFuncGetParamCount", 13020, "cuFuncGetParamCount"),
        .kernel_param_count = own_entry(lib, get_proc, "cuKernelGetParamCount", 13020, "cuKernelGetParamCount"),
        .pointer_get_attribute = own_entry(lib, get_proc, "cuPointerGetAttribute", 4000, "cuPointerGetAttribute"),
        .func_get_name = own_entry(lib, get_proc, "cuFuncGetName", 12030, "cuFuncGetName"),
        .kernel_get_name = own_entry(lib, get_proc, "cuKernelGetName", 12030, "cuKernelGetName"),
        .device_get_count = own_entry(lib, get_proc, "cuDeviceGetCount", 2000, "cuDeviceGetCount"),
        .device_get_attribute = own_entry(lib, get_proc, "cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute"),
        .stream_get_device = own_entry(lib, get_proc, "cuStreamGetDevice", 12080, "cuStreamGetDevice"),
        .device_get_mem_pool = own_entry(lib, get_proc, "cuDeviceGetMemPool", 11020, "cuDeviceGetMemPool"),
        .device_get_default_mem_pool =
            own_entry(lib, get_proc, "cuDeviceGetDefaultMemPool", 11020, "cuDeviceGetDefaultMemPool"),
        .mem_get_default_mem_pool = own_entry(lib, get_proc, "cuMemGetDefaultMemPool", 13000, "cuMemGetDefaultMemPool"),
        .mem_pool_get_attribute = own_entry(lib, get_proc, "cuMemPoolGetAttribute", 11020, "cuMemPoolGetAttribute"),
        .mem_pool_set_attribute = own_entry(lib, get_proc, "cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute"),
        .discard_batch = own_entry(lib, get_proc, "cuMemDiscardBatchAsync", 13000, "cuMemDiscardBatchAsync"),
        .memset_d32_async = own_entry(lib, get_proc, "cuMemsetD32Async", 3020, "cuMemsetD32Async"),
        /* graphs and devices */
        .graph_get_nodes = own_entry(lib, get_proc, "cuGraphGetNodes", 10000, "cuGraphGetNodes"),
        .graph_node_get_type = own_entry(lib, get_proc, "cuGraphNodeGetType", 10000, "cuGraphNodeGetType"),
        .graph_kernel_node_get_params =
            own_entry(lib, get_proc, "cuGraphKernelNodeGetParams", 12000, "cuGraphKernelNodeGetParams_v2"),
        .graph_child_graph =
            own_entry(lib, get_proc, "cuGraphChildGraphNodeGetGraph", 10000, "cuGraphChildGraphNodeGetGraph"),
        .stream_get_ctx = own_entry(lib, get_proc, "cuStreamGetCtx", 9020, "cuStreamGetCtx"),
        .ctx_push_current = own_entry(lib, get_proc, "cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"),
        .ctx_pop_current = own_entry(lib, get_proc, "cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"),
        .primary_ctx_get_state =
            own_entry(lib, get_proc, "cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState"),
        .primary_ctx_retain = own_entry(lib, get_proc, "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain"),
        /* device UUIDs (channel.c) */
        .device_get_uuid = own_entry(lib, get_proc, "cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"),
    };
    captures_known();
    d.can_prefetch = d.ctx_get_current != NULL && d.ctx_get_device != NULL && d.stream_create != NULL &&
                     d.event_create != NULL && d.event_record != NULL && d.stream_wait_event != NULL &&
                     d.stream_is_capturing != NULL && (d.prefetch_v2 != NULL || d.prefetch_v1 != NULL);
    if (!d.can_prefetch)
        pump_log(1, "the driver lacks functions pump needs to prefetch: counting only");
    pump_log(1, "driver loaded: policy %s%s, %s prefetch, %s parameter layouts",
             pump_config.policy == PUMP_POLICY_LAUNCH ? "launch" : "off", pump_config.wait ? "" : " (no wait)",
             d.prefetch_batch != NULL ? "batched" : "per-range",
             d.func_param_info != NULL || d.kernel_param_info != NULL ? "with" : "without");
    pump_driver = d;
    return true;
}

static bool driver_load_slow(void)
{
    if (loading_on_this_thread)
        return false;  /* re-entered from inside our own dlopen */
    int expected = DRIVER_UNLOADED;
    if (atomic_compare_exchange_strong(&driver_state, &expected, DRIVER_LOADING)) {
        loading_on_this_thread = true;
        pump_config_report();
        bool ok = load_driver();
        loading_on_this_thread = false;
        if (ok) {
            pump_stats_open();
            pump_channel_start();
        } else
            pump_stats_passthrough("libcuda.so.1 not found");
        atomic_store_explicit(&driver_state, ok ? DRIVER_READY : DRIVER_FAILED, memory_order_release);
        return ok;
    }
    /* Another thread is loading. Wait, but never forever: a thread that
     * holds the loader lock while we wait for it must not deadlock us. */
    for (int spins = 0; spins < 5000; spins++) {
        int state = atomic_load_explicit(&driver_state, memory_order_acquire);
        if (state != DRIVER_LOADING)
            return state == DRIVER_READY;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    pump_log_once("gave up waiting for another thread to load libcuda");
    return false;
}

PUMP_HIDDEN bool pump_driver_ready(void)
{
    if (PUMP_LIKELY(atomic_load_explicit(&driver_state, memory_order_acquire) == DRIVER_READY))
        return true;
    return driver_load_slow();
}

PUMP_HIDDEN bool pump_driver_was_used(void)
{
    return atomic_load_explicit(&driver_state, memory_order_acquire) == DRIVER_READY;
}
