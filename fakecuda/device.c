/* device.c: why it exists: cuInit, the modelled devices (FAKECUDA_DEVICES, each with
 * FAKECUDA_DEVICE_MEMORY bytes; FAKECUDA_CONCURRENT_MANAGED), primary and created
 * contexts, the per-thread current context and context stack, cuMemGetInfo, and the
 * error-name/string table. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Atomic int fc_initialized;
_Atomic int fc_init_pid;
static _Atomic int fc_fork_poisoned;
_Atomic uint64_t fc_dev_resident[FAKECUDA_MAX_DEVICES];
_Atomic uint64_t fc_dev_resident_peak[FAKECUDA_MAX_DEVICES];

void fc_dev_resident_add(int device, uint64_t bytes)
{
    uint64_t now = atomic_fetch_add(&fc_dev_resident[device], bytes) + bytes;
    uint64_t peak = atomic_load(&fc_dev_resident_peak[device]);
    while (now > peak && !atomic_compare_exchange_weak(&fc_dev_resident_peak[device], &peak, now)) {
    }
}

static struct CUctx_st fc_primary[FAKECUDA_MAX_DEVICES];
static _Atomic int fc_primary_refs[FAKECUDA_MAX_DEVICES];
static pthread_once_t fc_init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t fc_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUctx_st *fc_created_ctxs; /* never freed: handles stay checkable */
static _Atomic unsigned long long fc_ctx_ids = 1;
/* Contexts made per device: primary activations (a retain from no references) and
 * cuCtxCreate calls (fakecuda_contexts_created). */
static _Atomic int fc_contexts_made[FAKECUDA_MAX_DEVICES];

FC_EXPORT int fakecuda_contexts_created(int device)
{
    return device >= 0 && device < FAKECUDA_MAX_DEVICES ? atomic_load(&fc_contexts_made[device]) : -1;
}

/* The current context and the push/pop stack are per thread, as in the driver. */
#define FC_CTX_STACK 32
static _Thread_local CUcontext fc_tls_cur;
static _Thread_local CUcontext fc_tls_stack[FC_CTX_STACK];
static _Thread_local int fc_tls_depth;

/* As with the driver, a child forked after cuInit cannot use CUDA: every call, cuInit
 * included, returns CUDA_ERROR_NOT_INITIALIZED there (the parent's stream workers do not
 * exist in the child). A child forked before cuInit may initialize on its own. */
void fc_atfork_child(void)
{
    if (atomic_exchange(&fc_initialized, 0)) atomic_store(&fc_fork_poisoned, 1);
}

static int dev_ok(CUdevice d) { return d >= 0 && d < fc_cfg.ndevices; }

CUcontext fc_current_ctx(void) { return fc_tls_cur; }
int fc_ctx_valid(CUcontext c) { return c && c->magic == FC_MAGIC_CTX; }
CUresult fc_ctx_error(CUcontext c)
{
    return c && c->magic == FC_MAGIC_DEAD ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
}
int fc_ctx_device(CUcontext c) { return c->device; }
CUcontext fc_primary_ctx(int dev) { return &fc_primary[dev]; }

/* CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS of every device: 1 unless
 * FAKECUDA_CONCURRENT_MANAGED=0 (a GPU without it, e.g. before Pascal or on Windows). */
static int fc_concurrent_managed = 1;

static void init_devices(void)
{
    const char *v = getenv("FAKECUDA_CONCURRENT_MANAGED");
    fc_concurrent_managed = !(v && strcmp(v, "0") == 0);
    for (int i = 0; i < FAKECUDA_MAX_DEVICES; i++) {
        fc_primary[i].magic = FC_MAGIC_CTX;
        fc_primary[i].device = i;
        fc_primary[i].primary = 1;
        fc_primary[i].id = atomic_fetch_add(&fc_ctx_ids, 1);
    }
}

FC_EXPORT CUresult cuInit(unsigned int Flags)
{
    FC_ENTRY_NOINIT(cuInit, 2000);
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&fc_fork_poisoned)) return CUDA_ERROR_NOT_INITIALIZED;
    if (fc_cfg.ndevices == 0) return CUDA_ERROR_NO_DEVICE;
    pthread_once(&fc_init_once, init_devices);
    atomic_store(&fc_init_pid, (int)getpid());
    atomic_store_explicit(&fc_initialized, 1, memory_order_release);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuInit);

FC_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    FC_ENTRY_NOINIT(cuDriverGetVersion, 2020);
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = fc_cfg.driver_version;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDriverGetVersion);

FC_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FC_ENTRY(cuDeviceGet, 2000);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGet);

FC_EXPORT CUresult cuDeviceGetCount(int *count)
{
    FC_ENTRY(cuDeviceGetCount, 2000);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = fc_cfg.ndevices;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetCount);

FC_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetAttribute, 2000);
    if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int v = attrib == CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS ? fc_concurrent_managed
                                                                    : fc_persona_attribute(dev, attrib);
    *pi = v;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetAttribute);

FC_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetName, 2000);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fc_persona_name(dev, name, (size_t)len);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetName);

/* "[domain]:[bus]:[device].[function]" in hex (cuda.h), as cudaDeviceGetPCIBusId prints it:
 * "0000:02:00.0" for the H100 persona's device 0; at most len bytes with the terminator. */
FC_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetPCIBusId, 4010);
    if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.0", fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
             fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
             fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetPCIBusId);

FC_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FC_ENTRY(cuDeviceTotalMem_v2, 3020);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)fc_cfg.device_memory;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceTotalMem_v2);

static CUresult get_uuid(CUuuid *uuid, CUdevice dev)
{
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fc_persona_uuid(dev, (uint8_t *)uuid->bytes);
    return CUDA_SUCCESS;
}
FC_DEF(cuDeviceGetUuid, 9020, (CUuuid *uuid, CUdevice dev), get_uuid(uuid, dev));
FC_DEF(cuDeviceGetUuid_v2, 11040, (CUuuid *uuid, CUdevice dev), get_uuid(uuid, dev));

/* ---- contexts ---- */
FC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FC_ENTRY(cuDevicePrimaryCtxRetain, 7000);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (atomic_fetch_add(&fc_primary_refs[dev], 1) == 0) atomic_fetch_add(&fc_contexts_made[dev], 1);
    *pctx = &fc_primary[dev];
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDevicePrimaryCtxRetain);

/* "The context is automatically reset once the last reference to it is released" (cuda.h,
 * cuDevicePrimaryCtxRelease). */
static CUresult primary_release(CUdevice dev)
{
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int old = atomic_load(&fc_primary_refs[dev]);
    while (old > 0 && !atomic_compare_exchange_weak(&fc_primary_refs[dev], &old, old - 1)) {}
    if (old == 1) {
        fc_ctx_invalidate(&fc_primary[dev]);
        fc_cls_context_gone(&fc_primary[dev]);
    }
    return old > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
FC_DEF(cuDevicePrimaryCtxRelease, 7000, (CUdevice dev), primary_release(dev));
FC_DEF(cuDevicePrimaryCtxRelease_v2, 11000, (CUdevice dev), primary_release(dev));

/* "Destroys and cleans up all resources associated with the current device in the current
 * process"; "Resetting the primary context does not release it" (cuda.h,
 * cuDevicePrimaryCtxReset): the handle and its retain count stay, its streams and events go.
 * Its allocations are not freed here (see README, what is not modelled). */
static CUresult primary_reset(CUdevice dev)
{
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fc_ctx_invalidate(&fc_primary[dev]);
    fc_cls_context_gone(&fc_primary[dev]);
    return CUDA_SUCCESS;
}
FC_DEF(cuDevicePrimaryCtxReset, 7000, (CUdevice dev), primary_reset(dev));
FC_DEF(cuDevicePrimaryCtxReset_v2, 11000, (CUdevice dev), primary_reset(dev));

FC_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FC_ENTRY(cuDevicePrimaryCtxGetState, 7000);
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = atomic_load(&fc_primary_refs[dev]) > 0;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDevicePrimaryCtxGetState);

/* A created context becomes current (the driver pushes it on the thread's stack). */
static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = FC_MAGIC_CTX;
    c->device = dev;
    c->flags = flags;
    c->id = atomic_fetch_add(&fc_ctx_ids, 1);
    atomic_fetch_add(&fc_contexts_made[dev], 1);
    pthread_mutex_lock(&fc_ctx_mu);
    c->next_all = fc_created_ctxs;
    fc_created_ctxs = c;
    pthread_mutex_unlock(&fc_ctx_mu);
    if (fc_tls_depth < FC_CTX_STACK) fc_tls_stack[fc_tls_depth++] = fc_tls_cur;
    fc_tls_cur = c;
    *pctx = c;
    return CUDA_SUCCESS;
}
FC_DEF(cuCtxCreate_v2, 3020, (CUcontext *pctx, unsigned int flags, CUdevice dev), ctx_create(pctx, flags, dev));
FC_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev)
{
    FC_ENTRY(cuCtxCreate_v3, 11040);
    (void)paramsArray; (void)numParams;
    return ctx_create(pctx, flags, dev);
}
FC_ALIAS(cuCtxCreate_v3);
FC_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev)
{
    FC_ENTRY(cuCtxCreate_v4, 12050);
    (void)ctxCreateParams;
    return ctx_create(pctx, flags, dev);
}
FC_ALIAS(cuCtxCreate_v4);

/* Destroyed contexts are synchronized and marked dead, not freed (streams of that
 * context keep working; the driver would destroy them). */
FC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    FC_ENTRY(cuCtxDestroy_v2, 4000);
    if (!fc_ctx_valid(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    fc_ctx_invalidate(ctx);
    fc_cls_context_gone(ctx);
    ctx->magic = FC_MAGIC_DEAD;
    if (fc_tls_cur == ctx) fc_tls_cur = fc_tls_depth > 0 ? fc_tls_stack[--fc_tls_depth] : NULL;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxDestroy_v2);

FC_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FC_ENTRY(cuCtxSetCurrent, 4000);
    if (ctx && !fc_ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    fc_tls_cur = ctx;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxSetCurrent);

FC_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FC_ENTRY(cuCtxGetCurrent, 4000);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *pctx = fc_tls_cur;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetCurrent);

FC_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FC_ENTRY(cuCtxPushCurrent_v2, 4000);
    if (!fc_ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    if (fc_tls_depth >= FC_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    fc_tls_stack[fc_tls_depth++] = fc_tls_cur;
    fc_tls_cur = ctx;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxPushCurrent_v2);

FC_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FC_ENTRY(cuCtxPopCurrent_v2, 4000);
    if (!fc_tls_cur) return CUDA_ERROR_INVALID_CONTEXT;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    if (pctx) *pctx = fc_tls_cur;
    fc_tls_cur = fc_tls_depth > 0 ? fc_tls_stack[--fc_tls_depth] : NULL;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxPopCurrent_v2);

/* The unversioned names (CUDA 3.x's ABI, before cuda.h's #define made them _v2) stay exported by
 * the real driver (535.261 and 550.163: `nm -D libcuda.so.1` lists cuCtxPushCurrent beside
 * cuCtxPushCurrent_v2), and cuDNN 9 looks them up there by dlsym, outside cuGetProcAddress
 * (it says "Could not load symbol cuCtxPushCurrent" where they are missing). They take the same
 * arguments; here they are the _v2 calls. */
extern __typeof__(cuCtxPushCurrent_v2) fc_ctx_push_unversioned __asm__("cuCtxPushCurrent")
    __attribute__((alias("cuCtxPushCurrent_v2"), visibility("default")));
extern __typeof__(cuCtxPopCurrent_v2) fc_ctx_pop_unversioned __asm__("cuCtxPopCurrent")
    __attribute__((alias("cuCtxPopCurrent_v2"), visibility("default")));

static CUresult ctx_get_device(CUdevice *device, CUcontext ctx)
{
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) ctx = fc_tls_cur;
    if (!fc_ctx_valid(ctx)) return fc_ctx_error(ctx);
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *device = ctx->device;
    return CUDA_SUCCESS;
}
FC_DEF(cuCtxGetDevice, 2000, (CUdevice *device), ctx_get_device(device, NULL));
FC_DEF(cuCtxGetDevice_v2, 13000, (CUdevice *device, CUcontext ctx), ctx_get_device(device, ctx));

static CUresult ctx_sync(CUcontext ctx)
{
    if (!ctx) ctx = fc_tls_cur;
    if (!fc_ctx_valid(ctx)) return fc_ctx_error(ctx);
    fc_sync_ctx_streams(ctx, -1);
    fc_cost(FC_E_SYNCHRONIZE, FAKECUDA_SYNC_HOST_NS);
    fc_pools_synchronized();
    return CUDA_SUCCESS;
}
FC_DEF(cuCtxSynchronize, 2000, (void), ctx_sync(NULL));
FC_DEF(cuCtxSynchronize_v2, 13000, (CUcontext ctx), ctx_sync(ctx));

/* free = total - what the device has handed out: plain allocations, pools, cuMemCreate
 * handles and managed memory's root chunks (devmem.c), which stay taken after their pages
 * leave until the driver evicts them. A query of RM: charged as one ioctl. */
FC_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    FC_ENTRY(cuMemGetInfo_v2, 3020);
    if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = fc_tls_cur;
    if (!fc_ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
    fc_cost(FC_E_MEM_GET_INFO, FAKECUDA_RM_CALL_NS);
    uint64_t used = fc_devmem_used(c->device);
    uint64_t tot = fc_cfg.device_memory;
    *total = (size_t)tot;
    *free = (size_t)(used >= tot ? 0 : tot - used);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemGetInfo_v2);

/* ---- error names ---- */
static const struct { CUresult code; const char *name, *text; } fc_errors[] = {
    { CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
    { CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
    { CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
    { CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
    { CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
    { CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
    { CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    /* module loads (images.c) */
    { CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid" },
    { CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device" },
    { CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found" },
    { CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found" },
    { CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
    { CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
    { CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
    { CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
    { CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing" },
    { CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture" },
    { CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream" },
    { CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

int fc_error_from_name(const char *s, CUresult *out)
{
    for (size_t i = 0; i < sizeof fc_errors / sizeof *fc_errors; i++)
        if (strcmp(fc_errors[i].name, s) == 0) { *out = fc_errors[i].code; return 1; }
    return 0;
}

static CUresult error_lookup(CUresult e, const char **p, int name)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof fc_errors / sizeof *fc_errors; i++)
        if (fc_errors[i].code == e) { *p = name ? fc_errors[i].name : fc_errors[i].text; return CUDA_SUCCESS; }
    *p = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    FC_ENTRY_NOINIT(cuGetErrorString, 6000);
    return error_lookup(error, pStr, 0);
}
FC_ALIAS(cuGetErrorString);
FC_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    FC_ENTRY_NOINIT(cuGetErrorName, 6000);
    return error_lookup(error, pStr, 1);
}
FC_ALIAS(cuGetErrorName);
