/* context_extras.c: why it exists: the context-level queries and settings the CUDA runtime and
 * its libraries (cuBLAS, cuBLASLt) ask for besides making contexts: stream priority range,
 * the context's API version, id and SM resource, limits, peer access, and the driver's log
 * interface (CUDA 12.9). Semantics from cuda.h 13.0;
 * each charged as a context query (FAKECUDA_CONTEXT_QUERY_HOST_NS: no trace has them). */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <string.h>

static CUresult current(CUcontext *c)
{
    *c = fc_current_ctx();
    if (!fc_ctx_valid(*c)) return fc_ctx_error(*c);
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    return CUDA_SUCCESS;
}

/* cuda.h: the API version "corresponding to the capabilities of the context", of ctx or (NULL)
 * the current one; "it is valid for the API version to be 3020 while the driver version is
 * 4020". 3020: the context ABI of CUDA 3.2's _v2 entry points, which every context fakecuda
 * makes has (no later version changed it). The 13.0 runtime asks it on the first launch from
 * a thread whose context it made current itself (an autograd thread's first backward kernel);
 * without it that launch fails with cudaErrorCallRequiresNewerDriver. */
FC_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    FC_ENTRY(cuCtxGetApiVersion, 3020);
    CUcontext c = ctx;
    CUresult r = ctx ? (fc_ctx_valid(ctx) ? CUDA_SUCCESS : fc_ctx_error(ctx)) : current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    if (ctx) fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *version = 3020;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetApiVersion);

/* ctx, or (NULL) the current context, valid; charged as a context query. */
static CUresult ctx_or_current(CUcontext ctx, CUcontext *c)
{
    if (!ctx) return current(c);
    if (!fc_ctx_valid(ctx)) return fc_ctx_error(ctx);
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *c = ctx;
    return CUDA_SUCCESS;
}

/* cuda.h: "the unique Id which is associated with a given context ... unique for the life of the
 * program"; NULL: the current context's. The CUDA 13.2 runtime looks it up at start (its
 * execution-context API, cudaExecutionCtxGetId). The id every context gets when made (device.c). */
FC_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    FC_ENTRY(cuCtxGetId, 12000);
    CUcontext c = NULL;
    CUresult r = ctx_or_current(ctx, &c);
    if (r != CUDA_SUCCESS) return r;
    if (!ctxId) return CUDA_ERROR_INVALID_VALUE;
    *ctxId = c->id;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetId);

/* CUdevSmResource as CUDA 13.0's cuda.h lays it out, which is what a client built with 13.0 or
 * later reads, whatever header fakecuda was built with (12.x's has smCount alone, in the same
 * place; the union it sits in is as large). */
struct sm_resource_13_0 {
    unsigned int smCount, minSmPartitionSize, smCoscheduledAlignment;
};
_Static_assert(sizeof(CUdevResource) - offsetof(CUdevResource, sm) >= sizeof(struct sm_resource_13_0),
               "CUdevResource holds 13.0's SM fields");

/* cuda.h, cuCtxGetDevResource: "the type resources available to the context". A context here has
 * its whole device: CU_DEV_RESOURCE_TYPE_SM answers the device's SMs, with the minimum partition
 * and the co-scheduling alignment cuda.h's green-context section gives per compute capability
 * (6.x and 7.x: 2 and 2; 8.x: 4 and 2; 9.0 and later: 8 and 8). Any other type, the workqueue
 * types of CUDA 13.1 included (not modelled), is CUDA_ERROR_INVALID_RESOURCE_TYPE. Only type and
 * the SM fields are written: CUDA 13.1 added nextResource after the union, and a client built
 * with 13.0's cuda.h has no room for it (the union is 40 bytes or more in every version, the SM
 * fields at most 20). */
FC_EXPORT CUresult cuCtxGetDevResource(CUcontext hCtx, CUdevResource *resource, CUdevResourceType type)
{
    FC_ENTRY(cuCtxGetDevResource, 12040);
    CUcontext c = NULL;
    CUresult r = ctx_or_current(hCtx, &c);
    if (r != CUDA_SUCCESS) return r;
    if (!resource) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    int dev = fc_ctx_device(c), major = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    struct sm_resource_13_0 sm = {0}; /* the fields later headers add (flags, a locality domain): none */
    sm.smCount = (unsigned)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    sm.minSmPartitionSize = major >= 9 ? 8 : major == 8 ? 4 : 2;
    sm.smCoscheduledAlignment = major >= 9 ? 8 : 2;
    resource->type = CU_DEV_RESOURCE_TYPE_SM;
    memcpy(&resource->sm, &sm, sizeof sm);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetDevResource);

/* Least 0, greatest -5: the range cuStreamCreateWithPriority clamps to (streams.c); "If the
 * current context's device does not support stream priorities, ... return 0" (cuda.h): every
 * persona supports them. Either pointer may be NULL (cuda.h). */
FC_EXPORT CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    FC_ENTRY(cuCtxGetStreamPriorityRange, 5050);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetStreamPriorityRange);

/* Limits, per process (one table: contexts here share their device's). Defaults: stack 1 KiB
 * per thread, printf FIFO 1 MiB, malloc heap 8 MiB (CUDA C++ Programming Guide: "Formatted
 * Output", "Dynamic Global Memory Allocation"); device runtime sync depth 2 and pending launch
 * count 2048 (cuda.h); L2 fetch granularity 32 bytes, persisting L2 0 (cuda.h: "0 ... 128"; the
 * persisting size is 0 until set). CU_LIMIT_CIG_ENABLED "can only be queried, cannot be set" and is
 * non-zero only on a CUDA-in-graphics context (cuda.h), which fakecuda never makes: 0 (cuBLASLt
 * 13.1 asks it at cublasCreate). Another limit (CU_LIMIT_SHMEM_SIZE, CIG_SHMEM_FALLBACK_ENABLED:
 * CIG contexts' own): CUDA_ERROR_UNSUPPORTED_LIMIT. */
static size_t fc_limits[CU_LIMIT_CIG_ENABLED + 1] = { /* the limits known, below */
    [CU_LIMIT_STACK_SIZE] = 1024, [CU_LIMIT_PRINTF_FIFO_SIZE] = 1u << 20, [CU_LIMIT_MALLOC_HEAP_SIZE] = 8u << 20,
    [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2, [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
    [CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 32, [CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0, [CU_LIMIT_CIG_ENABLED] = 0};
static pthread_mutex_t fc_limits_mu = PTHREAD_MUTEX_INITIALIZER;
static int limit_known(CUlimit l)
{
    return l == CU_LIMIT_STACK_SIZE || l == CU_LIMIT_PRINTF_FIFO_SIZE || l == CU_LIMIT_MALLOC_HEAP_SIZE ||
           l == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH || l == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT ||
           l == CU_LIMIT_MAX_L2_FETCH_GRANULARITY || l == CU_LIMIT_PERSISTING_L2_CACHE_SIZE || l == CU_LIMIT_CIG_ENABLED;
}

FC_EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    FC_ENTRY(cuCtxGetLimit, 3010);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!pvalue) return CUDA_ERROR_INVALID_VALUE;
    if (!limit_known(limit)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&fc_limits_mu);
    *pvalue = fc_limits[limit];
    pthread_mutex_unlock(&fc_limits_mu);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxGetLimit);

/* The L2 fetch granularity is "a hint ... between 0 and 128 bytes, a power of two"; the
 * persisting L2 size is capped at the device's maximum (cuda.h), which no persona sources: a
 * value above the L2 size is refused. */
FC_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    FC_ENTRY(cuCtxSetLimit, 3010);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!limit_known(limit)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit == CU_LIMIT_CIG_ENABLED) return CUDA_ERROR_INVALID_VALUE;
    if (limit == CU_LIMIT_MAX_L2_FETCH_GRANULARITY && (value > 128 || (value & (value - 1))))
        return CUDA_ERROR_INVALID_VALUE;
    if (limit == CU_LIMIT_PERSISTING_L2_CACHE_SIZE &&
        value > (size_t)fc_persona_attribute(fc_ctx_device(c), CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_limits_mu);
    fc_limits[limit] = value;
    pthread_mutex_unlock(&fc_limits_mu);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxSetLimit);

/* ---- peer access: every pair of distinct devices can (NVLink on H100 SXM; the A100 PCIe
 * persona's peers over PCIe), a device never with itself (cudaDeviceCanAccessPeer answers 0
 * for the same device). Enabling is per (current context, peer context). ---- */
FC_EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    FC_ENTRY(cuDeviceCanAccessPeer, 4000);
    if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fc_cfg.ndevices || peerDev < 0 || peerDev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceCanAccessPeer);

#define FC_MAX_PEERS 256
static struct { CUcontext from, to; } fc_peers[FC_MAX_PEERS];
static int fc_npeers;
static pthread_mutex_t fc_peers_mu = PTHREAD_MUTEX_INITIALIZER;

static int peer_index(CUcontext from, CUcontext to)
{
    for (int i = 0; i < fc_npeers; i++)
        if (fc_peers[i].from == from && fc_peers[i].to == to) return i;
    return -1;
}

/* cuda.h: Flags "must be 0"; CUDA_ERROR_PEER_ACCESS_UNSUPPORTED where the devices cannot,
 * CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED where enabled already, CUDA_ERROR_INVALID_CONTEXT
 * without a current context. The same device: unsupported (cuDeviceCanAccessPeer says 0). */
FC_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    FC_ENTRY(cuCtxEnablePeerAccess, 4000);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_ctx_valid(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    if (fc_ctx_device(peerContext) == fc_ctx_device(c)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&fc_peers_mu);
    r = peer_index(c, peerContext) >= 0 ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        : fc_npeers == FC_MAX_PEERS     ? CUDA_ERROR_TOO_MANY_PEERS
                                        : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        fc_peers[fc_npeers].from = c;
        fc_peers[fc_npeers++].to = peerContext;
    }
    pthread_mutex_unlock(&fc_peers_mu);
    return r;
}
FC_ALIAS(cuCtxEnablePeerAccess);

FC_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    FC_ENTRY(cuCtxDisablePeerAccess, 4000);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!fc_ctx_valid(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fc_peers_mu);
    int i = peer_index(c, peerContext);
    if (i >= 0) fc_peers[i] = fc_peers[--fc_npeers];
    pthread_mutex_unlock(&fc_peers_mu);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}
FC_ALIAS(cuCtxDisablePeerAccess);

/* ---- the driver's logs (CUDA 12.9): fakecuda writes none. A callback is registered and never
 * called; the iterator is the current end (0); a dump from it holds nothing: an empty file, or
 * *size 0 with an empty string when the buffer holds one (cuda.h: "*size ... the number of
 * bytes written"). ---- */
static int fc_log_callbacks;
FC_EXPORT CUresult cuLogsRegisterCallback(CUlogsCallback callbackFunc, void *userData, CUlogsCallbackHandle *out)
{
    FC_ENTRY_NOINIT(cuLogsRegisterCallback, 12090);
    (void)userData;
    if (!callbackFunc || !out) return CUDA_ERROR_INVALID_VALUE;
    *out = (CUlogsCallbackHandle)(uintptr_t)(++fc_log_callbacks);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLogsRegisterCallback);
FC_EXPORT CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle callback)
{
    FC_ENTRY_NOINIT(cuLogsUnregisterCallback, 12090);
    return callback ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FC_ALIAS(cuLogsUnregisterCallback);
FC_EXPORT CUresult cuLogsCurrent(CUlogIterator *iterator_out, unsigned int flags)
{
    FC_ENTRY_NOINIT(cuLogsCurrent, 12090);
    if (!iterator_out || flags) return CUDA_ERROR_INVALID_VALUE;
    *iterator_out = 0;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLogsCurrent);
FC_EXPORT CUresult cuLogsDumpToFile(CUlogIterator *iterator, const char *pathToFile, unsigned int flags)
{
    FC_ENTRY_NOINIT(cuLogsDumpToFile, 12090);
    (void)iterator;
    if (!pathToFile || flags) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(pathToFile, "a");
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    fclose(f);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLogsDumpToFile);
FC_EXPORT CUresult cuLogsDumpToMemory(CUlogIterator *iterator, char *buffer, size_t *size, unsigned int flags)
{
    FC_ENTRY_NOINIT(cuLogsDumpToMemory, 12090);
    (void)iterator;
    if (!buffer || !size || flags || *size == 0) return CUDA_ERROR_INVALID_VALUE;
    buffer[0] = '\0';
    *size = 0;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLogsDumpToMemory);
