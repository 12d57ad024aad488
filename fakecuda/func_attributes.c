/* func_attributes.c: why it exists: a kernel's attributes (cuFuncGetAttribute/SetAttribute,
 * cuKernelGetAttribute/SetAttribute, the cache configuration calls) and the occupancy calculator
 * (cuOccupancy*), which cuBLAS and PyTorch ask before launching. fakecuda's kernels carry no
 * register or static shared memory counts (an image's .nv.info would), so a kernel uses no
 * static shared, constant or local memory and 32 registers per thread (no source: the figure
 * that lets the most blocks in is not chosen; 32 lets 2048 threads fill an SM, as the CUDA
 * occupancy calculator shows for 32 registers). The device's limits come from its persona
 * (persona.c); the occupancy rule is the CUDA occupancy calculator's: the fewest blocks per SM
 * allowed by threads (warps), registers, shared memory (with 1 KiB reserved per block from
 * CC 8.0, CUDA C++ Programming Guide) and the blocks-per-SM limit. Each call is charged as a
 * context query (no trace has them). */
#include "fakecuda_internal.h"

#include <stdlib.h>

#define FC_REGS_PER_THREAD 32

typedef struct fc_fattr { struct fc_fattr *next; const fc_kdef *def; int max_dyn_smem, carveout, cluster[3],
                                                                        non_portable, sched; } fc_fattr;
static fc_fattr *fc_fattrs;
static pthread_mutex_t fc_fattr_mu = PTHREAD_MUTEX_INITIALIZER;

/* The settable attributes of def (made on first use; never freed: handles may outlive modules). */
static fc_fattr *settings(const fc_kdef *def)
{
    fc_fattr *a = fc_fattrs;
    while (a && a->def != def) a = a->next;
    if (!a && (a = calloc(1, sizeof *a))) {
        a->def = def;
        a->max_dyn_smem = 48 * 1024; /* cuda.h: above 48 KB "requires an explicit opt-in" */
        a->carveout = -1;
        a->next = fc_fattrs;
        fc_fattrs = a;
    }
    return a;
}

static CUresult get_attr(int *pi, CUfunction_attribute attrib, const fc_kdef *def, int dev)
{
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    int cc = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
             fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    pthread_mutex_lock(&fc_fattr_mu);
    fc_fattr *a = settings(def);
    CUresult r = a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (a) switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK); break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = FC_REGS_PER_THREAD; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = cc; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = a->max_dyn_smem; break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = a->carveout; break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *pi = a->cluster[0]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *pi = a->cluster[1]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *pi = a->cluster[2]; break;
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *pi = a->non_portable; break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *pi = a->sched; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    pthread_mutex_unlock(&fc_fattr_mu);
    return r;
}

/* cuda.h's settable ones, in their ranges: the dynamic shared memory up to the opt-in limit
 * (less static shared, 0 here), the carveout -1 (no preference) to 100, cluster dimensions
 * (CC 9.0, portable cluster size at most 8), the non-portable flag and scheduling policy. */
static CUresult set_attr(CUfunction_attribute attrib, int value, const fc_kdef *def, int dev)
{
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    int clusters = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
    pthread_mutex_lock(&fc_fattr_mu);
    fc_fattr *a = settings(def);
    CUresult r = a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (a) switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            if (value < 0 || value > fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
                r = CUDA_ERROR_INVALID_VALUE;
            else a->max_dyn_smem = value;
            break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            if (value < -1 || value > 100) r = CUDA_ERROR_INVALID_VALUE;
            else a->carveout = value;
            break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
            if (!clusters || value < 0 || value > 8) r = clusters ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
            else a->cluster[attrib - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH] = value;
            break;
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
            if (!clusters || (value != 0 && value != 1)) r = clusters ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
            else a->non_portable = value;
            break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
            if (value < 0 || value > 2) r = CUDA_ERROR_INVALID_VALUE;
            else a->sched = value;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    pthread_mutex_unlock(&fc_fattr_mu);
    return r;
}

static int cur_dev(void)
{
    CUcontext c = fc_current_ctx();
    return fc_ctx_valid(c) ? fc_ctx_device(c) : -1;
}
static CUresult kernel_dev(CUdevice *dev)
{
    if (*dev < 0 || *dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}
static int valid_cache(CUfunc_cache c) { return c >= CU_FUNC_CACHE_PREFER_NONE && c <= CU_FUNC_CACHE_PREFER_EQUAL; }

FC_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    FC_ENTRY(cuFuncGetAttribute, 2020);
    int d = cur_dev();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return get_attr(pi, attrib, hfunc && hfunc->magic == FC_MAGIC_FUNC ? fc_kernel_def(hfunc) : NULL, d);
}
FC_ALIAS(cuFuncGetAttribute);
FC_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    FC_ENTRY(cuFuncSetAttribute, 9000);
    int d = cur_dev();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return set_attr(attrib, value, hfunc && hfunc->magic == FC_MAGIC_FUNC ? fc_kernel_def(hfunc) : NULL, d);
}
FC_ALIAS(cuFuncSetAttribute);
FC_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    FC_ENTRY(cuFuncSetCacheConfig, 3000);
    if (!hfunc || hfunc->magic != FC_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    return valid_cache(config) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* a preference: no effect here */
}
FC_ALIAS(cuFuncSetCacheConfig);
FC_EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    FC_ENTRY(cuKernelGetAttribute, 12000);
    CUresult r = kernel_dev(&dev);
    if (r != CUDA_SUCCESS) return r;
    return get_attr(pi, attrib, kernel && kernel->magic == FC_MAGIC_KERN ? fc_kernel_def(kernel) : NULL, dev);
}
FC_ALIAS(cuKernelGetAttribute);
FC_EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    FC_ENTRY(cuKernelSetAttribute, 12000);
    CUresult r = kernel_dev(&dev);
    if (r != CUDA_SUCCESS) return r;
    return set_attr(attrib, val, kernel && kernel->magic == FC_MAGIC_KERN ? fc_kernel_def(kernel) : NULL, dev);
}
FC_ALIAS(cuKernelSetAttribute);
FC_EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev)
{
    FC_ENTRY(cuKernelSetCacheConfig, 12000);
    CUresult r = kernel_dev(&dev);
    if (r != CUDA_SUCCESS) return r;
    if (!kernel || kernel->magic != FC_MAGIC_KERN) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    return valid_cache(config) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FC_ALIAS(cuKernelSetCacheConfig);

/* ---- occupancy ---- */
static int blocks_per_sm(int dev, int block, size_t dyn_smem)
{
    int warps = (block + 31) / 32;
    int by_threads = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / (warps * 32);
    int by_regs = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR) /
                  (warps * 32 * FC_REGS_PER_THREAD);
    size_t per_block = dyn_smem + (size_t)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    size_t smem = (size_t)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    int by_smem = per_block ? (int)(smem / per_block) : 1 << 30;
    int n = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
    if (by_threads < n) n = by_threads;
    if (by_regs < n) n = by_regs;
    if (by_smem < n) n = by_smem;
    return n;
}

static CUresult occupancy_args(CUfunction f, int *dev)
{
    *dev = cur_dev();
    if (*dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!fc_kernel_def(f)) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    return CUDA_SUCCESS;
}

/* cuda.h: blockSize and dynamic shared memory are those of the launch; a block larger than the
 * function allows, or more shared memory than a block may have: 0 blocks (no error). */
static CUresult max_active(int *n, CUfunction f, int block, size_t dyn, unsigned flags)
{
    int dev;
    if (!n || block <= 0 || flags > CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = occupancy_args(f, &dev);
    if (r != CUDA_SUCCESS) return r;
    int max_block = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    int optin = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    *n = block > max_block || dyn > (size_t)optin ? 0 : blocks_per_sm(dev, block, dyn);
    return CUDA_SUCCESS;
}
FC_DEF(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, (int *n, CUfunction f, int block, size_t dyn),
       max_active(n, f, block, dyn, 0));
FC_DEF(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 7000,
       (int *n, CUfunction f, int block, size_t dyn, unsigned int flags), max_active(n, f, block, dyn, flags));

/* The block size (a multiple of the warp, up to the limit) with the most threads resident per
 * SM, the largest of equals; the grid that fills every SM with it. */
static CUresult potential_block(int *min_grid, int *block_out, CUfunction f, CUoccupancyB2DSize b2d, size_t dyn,
                                int limit, unsigned flags)
{
    int dev;
    if (!min_grid || !block_out || limit < 0 || flags > CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = occupancy_args(f, &dev);
    if (r != CUDA_SUCCESS) return r;
    int max_block = fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    if (limit > 0 && limit < max_block) max_block = limit;
    int best = 0, best_threads = 0, best_blocks = 0;
    for (int b = 32; b <= max_block; b += 32) {
        size_t smem = b2d ? b2d(b) : dyn;
        int n = blocks_per_sm(dev, b, smem);
        if (n * b >= best_threads && n > 0) best = b, best_threads = n * b, best_blocks = n;
    }
    *block_out = best;
    *min_grid = best_blocks * fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    return CUDA_SUCCESS;
}
FC_DEF(cuOccupancyMaxPotentialBlockSize, 6050,
       (int *g, int *b, CUfunction f, CUoccupancyB2DSize b2d, size_t dyn, int limit),
       potential_block(g, b, f, b2d, dyn, limit, 0));
FC_DEF(cuOccupancyMaxPotentialBlockSizeWithFlags, 7000,
       (int *g, int *b, CUfunction f, CUoccupancyB2DSize b2d, size_t dyn, int limit, unsigned int flags),
       potential_block(g, b, f, b2d, dyn, limit, flags));

/* The dynamic shared memory per block that still lets numBlocks blocks of blockSize reside. */
static CUresult available_smem(size_t *out, CUfunction f, int nblocks, int block)
{
    int dev;
    if (!out || nblocks <= 0 || block <= 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = occupancy_args(f, &dev);
    if (r != CUDA_SUCCESS) return r;
    *out = 0;
    if (blocks_per_sm(dev, block, 0) < nblocks) return CUDA_SUCCESS;
    size_t smem = (size_t)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    size_t per = smem / (size_t)nblocks, reserved = (size_t)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    size_t optin = (size_t)fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    *out = per > reserved ? per - reserved : 0;
    if (*out > optin) *out = optin;
    return CUDA_SUCCESS;
}
FC_DEF(cuOccupancyAvailableDynamicSMemPerBlock, 10020, (size_t *out, CUfunction f, int nblocks, int block),
       available_smem(out, f, nblocks, block));

/* ---- clusters (CC 9.0) ----
 * CUDA C++ Programming Guide, "Thread Block Clusters": 8 blocks is the portable cluster size;
 * H100 allows 16 to a kernel that sets CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED. A
 * cluster's blocks must all reside at once, so a block that cannot reside (0 blocks per SM)
 * allows no cluster. Not modelled: which SMs share a GPC (a cluster runs within one), so the
 * number of clusters is the device's resident blocks over the cluster size, never fewer. The
 * context is config->hStream's, or the current one for a NULL stream (cuda.h). A device
 * without cluster launch refuses as cuFuncSetAttribute's cluster attributes do above. */
static CUresult cluster_args(CUfunction f, const CUlaunchConfig *config, int *dev, fc_fattr *out)
{
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    if (config->hStream) {
        FC_STREAM_OR_RETURN(config->hStream);
        *dev = s->device;
    } else if ((*dev = cur_dev()) < 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    const fc_kdef *def = fc_kernel_def(f);
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    if (!fc_persona_attribute(*dev, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)) return CUDA_ERROR_NOT_SUPPORTED;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    pthread_mutex_lock(&fc_fattr_mu);
    fc_fattr *a = settings(def);
    if (a) *out = *a;
    pthread_mutex_unlock(&fc_fattr_mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static int launch_block(const CUlaunchConfig *c) { return (int)(c->blockDimX * c->blockDimY * c->blockDimZ); }

/* The largest cluster the kernel may launch with: its required size where set, else 8, or 16
 * where it allows non-portable sizes; 0 where its blocks cannot reside. */
static CUresult max_cluster(int *size, CUfunction f, const CUlaunchConfig *config, int *dev, fc_fattr *a)
{
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cluster_args(f, config, dev, a);
    if (r != CUDA_SUCCESS) return r;
    int block = launch_block(config), required = a->cluster[0] * a->cluster[1] * a->cluster[2];
    if (block <= 0 || config->sharedMemBytes > (unsigned)a->max_dyn_smem) return CUDA_ERROR_INVALID_VALUE;
    *size = blocks_per_sm(*dev, block, config->sharedMemBytes) <= 0 ? 0 : required ? required
                                                                       : a->non_portable ? 16 : 8;
    return CUDA_SUCCESS;
}
static CUresult potential_cluster(int *size, CUfunction f, const CUlaunchConfig *config)
{
    fc_fattr a = {0};
    return max_cluster(size, f, config, &(int){0}, &a);
}
FC_DEF(cuOccupancyMaxPotentialClusterSize, 11070, (int *size, CUfunction f, const CUlaunchConfig *config),
       potential_cluster(size, f, config));

/* cuda.h: the cluster size is config's CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION or the kernel's
 * required one (both given: they must match); neither, or one larger than the kernel may
 * launch: CUDA_ERROR_INVALID_CLUSTER_SIZE. */
static CUresult active_clusters(int *n, CUfunction f, const CUlaunchConfig *config)
{
    fc_fattr a = {0};
    int dev, most;
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = max_cluster(&most, f, config, &dev, &a);
    if (r != CUDA_SUCCESS) return r;
    int required = a.cluster[0] * a.cluster[1] * a.cluster[2], given = 0;
    for (unsigned i = 0; i < config->numAttrs; i++)
        if (config->attrs && config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            const CUlaunchAttributeValue *v = &config->attrs[i].value;
            given = (int)(v->clusterDim.x * v->clusterDim.y * v->clusterDim.z);
        }
    int size = given ? given : required;
    if (!size || (required && given && given != required) || size > most) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    *n = blocks_per_sm(dev, launch_block(config), config->sharedMemBytes) *
         fc_persona_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) / size;
    return CUDA_SUCCESS;
}
FC_DEF(cuOccupancyMaxActiveClusters, 11070, (int *n, CUfunction f, const CUlaunchConfig *config),
       active_clusters(n, f, config));
