/* kernels.c: why it exists: the kernel registry (kernels are host functions a test
 * registers by name), parameter info and names of CUfunction and CUkernel handles (modules.c
 * hands them out), and the launch entry points, which copy the arguments at call time and
 * enqueue the kernel (or append it to a capture). */
#include "image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FC_MAX_PARAMS 1024
#define FC_MAX_ARG_BYTES 32764 /* the driver's limit on a kernel's parameter space */

static pthread_rwlock_t fc_kern_lock = PTHREAD_RWLOCK_INITIALIZER;
static fc_kdef **fc_kernels; /* never freed: handles stay valid for the process */
static size_t fc_nkernels, fc_capkernels;

fc_kdef *fc_kernel_find(const char *name)
{
    fc_kdef *d = NULL;
    pthread_rwlock_rdlock(&fc_kern_lock);
    for (size_t i = 0; i < fc_nkernels && !d; i++)
        if (strcmp(fc_kernels[i]->name, name) == 0) d = fc_kernels[i];
    pthread_rwlock_unlock(&fc_kern_lock);
    return d;
}

static int register_kernel(const char *name, fakecuda_kernel_fn fn, unsigned nparams, const size_t *sizes,
                           const size_t *aligns, int noop)
{
    if (!name || !*name || (!fn && !noop) || nparams > FC_MAX_PARAMS || (nparams && (!sizes || !aligns)))
        return -1;
    fc_kdef *d = calloc(1, sizeof *d);
    if (!d) return -1;
    d->name = strdup(name);
    d->sizes = calloc(nparams ? nparams : 1, sizeof(size_t));
    d->offsets = calloc(nparams ? nparams : 1, sizeof(size_t));
    size_t off = 0;
    int bad = !d->name || !d->sizes || !d->offsets;
    for (unsigned i = 0; i < nparams && !bad; i++) {
        size_t a = aligns[i];
        if (a == 0 || (a & (a - 1)) || sizes[i] == 0) { bad = 1; break; }
        off = (off + a - 1) & ~(a - 1); /* natural C layout */
        d->offsets[i] = off;
        d->sizes[i] = sizes[i];
        off += sizes[i];
    }
    if (off > FC_MAX_ARG_BYTES) bad = 1;
    if (!bad) {
        d->fn = fn;
        d->nparams = nparams;
        d->argsize = off;
        d->noop = noop;
        d->func = (struct CUfunc_st){ FC_MAGIC_FUNC, d };
        pthread_rwlock_wrlock(&fc_kern_lock);
        for (size_t i = 0; i < fc_nkernels && !bad; i++)
            if (strcmp(fc_kernels[i]->name, name) == 0) bad = 1;
        if (!bad && fc_nkernels == fc_capkernels) {
            size_t nc = fc_capkernels ? fc_capkernels * 2 : 32;
            fc_kdef **v = realloc(fc_kernels, nc * sizeof *v);
            if (v) { fc_kernels = v; fc_capkernels = nc; }
            else bad = 1;
        }
        if (!bad) fc_kernels[fc_nkernels++] = d;
        pthread_rwlock_unlock(&fc_kern_lock);
    }
    if (bad) {
        free(d->name);
        free(d->sizes);
        free(d->offsets);
        free(d);
        return -1;
    }
    return 0;
}

FC_EXPORT int fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn, unsigned nparams, const size_t *sizes,
                                       const size_t *aligns)
{
    return register_kernel(name, fn, nparams, sizes, aligns, 0);
}

FC_EXPORT int fakecuda_register_noop_kernel(const char *name, unsigned nparams, const size_t *sizes, const size_t *aligns)
{
    return register_kernel(name, NULL, nparams, sizes, aligns, 1);
}

/* A CUfunction or a CUkernel cast to CUfunction; told apart by the magic field. */
fc_kdef *fc_kernel_def_of(const void *h, uint32_t want)
{
    if (!h) return NULL;
    const struct CUfunc_st *f = h;
    if (f->magic == FC_MAGIC_FUNC && (!want || want == FC_MAGIC_FUNC)) return f->def;
    if (f->magic == FC_MAGIC_KERN && (!want || want == FC_MAGIC_KERN)) return ((const struct CUkern_st *)h)->def;
    return NULL;
}

/* The i-th registered kernel (registration order, as a module lists its functions), or NULL. */
fc_kdef *fc_kernel_at(size_t i)
{
    pthread_rwlock_rdlock(&fc_kern_lock);
    fc_kdef *d = i < fc_nkernels ? fc_kernels[i] : NULL;
    pthread_rwlock_unlock(&fc_kern_lock);
    return d;
}

unsigned fc_kernel_count(void)
{
    pthread_rwlock_rdlock(&fc_kern_lock);
    unsigned n = (unsigned)fc_nkernels;
    pthread_rwlock_unlock(&fc_kern_lock);
    return n;
}

/* ---- parameter info and names ---- */
/* cuda.h (CUDA 12.4+), cuFuncGetParamInfo and cuKernelGetParamInfo: "paramIndex must be less
 * than the number of parameters", "paramSize can be set to NULL if only the parameter offset is
 * desired" (so paramOffset cannot), and the only error listed is CUDA_ERROR_INVALID_VALUE. A
 * CUkernel may be cast to CUfunction for cuLaunchKernel*, cuGraph* kernel nodes and the
 * cuOccupancy* calls, which say so; cuFuncGetParamInfo does not, nor cuKernelGetParamInfo of a
 * CUfunction: refused, with the listed error, the harder answer for a caller (an index-0
 * INVALID_VALUE reads like "no parameters"). */
static CUresult param_info(fc_kdef *d, size_t i, size_t *off, size_t *size)
{
    if (!d || !off || i >= d->nparams) {
        FC_COUNT(param_info_refused, 1); /* what compute-sanitizer reports as an API error */
        return CUDA_ERROR_INVALID_VALUE;
    }
    *off = d->offsets[i];
    if (size) *size = d->sizes[i];
    return CUDA_SUCCESS;
}

/* FAKECUDA_PARAM_INFO_OTHER_KIND=garbage: a handle of the other kind is read as if it were
 * this kind, the undefined behaviour cuda.h leaves room for, and answered with success and
 * a layout that is not the kernel's: one 4-byte parameter at offset 0 (no word that could
 * hold a pointer). A caller that asks the wrong call sees no error and scans nothing. */
static int fc_other_kind_garbage = -1;
static pthread_once_t fc_other_kind_once = PTHREAD_ONCE_INIT;
static void load_other_kind(void)
{
    const char *v = getenv("FAKECUDA_PARAM_INFO_OTHER_KIND");
    if (v && *v && strcmp(v, "refuse") != 0 && strcmp(v, "garbage") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_PARAM_INFO_OTHER_KIND=%s: allowed: refuse (the default) or garbage\n", v);
        exit(2);
    }
    fc_other_kind_garbage = v && strcmp(v, "garbage") == 0;
}

static CUresult param_info_of_kind(const void *h, uint32_t want, size_t i, size_t *off, size_t *size)
{
    fc_kdef *d = fc_kernel_def_of(h, want);
    if (d || !fc_kernel_def_of(h, 0)) return param_info(d, i, off, size);
    pthread_once(&fc_other_kind_once, load_other_kind);
    if (!fc_other_kind_garbage || !off || i > 0) {
        FC_COUNT(param_info_refused, 1);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *off = 0;
    if (size) *size = 4;
    return CUDA_SUCCESS;
}
FC_DEF(cuFuncGetParamInfo, 12040, (CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize),
       param_info_of_kind(func, FC_MAGIC_FUNC, paramIndex, paramOffset, paramSize));
FC_DEF(cuKernelGetParamInfo, 12040, (CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize),
       param_info_of_kind(kernel, FC_MAGIC_KERN, paramIndex, paramOffset, paramSize));

/* cuda.h (CUDA 13.2+), cuFuncGetParamCount and cuKernelGetParamCount: the number of
 * parameters; the only error listed is CUDA_ERROR_INVALID_VALUE. A handle of the other kind
 * is refused, or with FAKECUDA_PARAM_INFO_OTHER_KIND=garbage answered as the one-parameter
 * layout param_info_of_kind gives it. */
static CUresult param_count_of_kind(const void *h, uint32_t want, size_t *count)
{
    fc_kdef *d = fc_kernel_def_of(h, want);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (d) {
        *count = d->nparams;
        return CUDA_SUCCESS;
    }
    pthread_once(&fc_other_kind_once, load_other_kind);
    if (!fc_kernel_def_of(h, 0) || !fc_other_kind_garbage) return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}
FC_DEF(cuFuncGetParamCount, 13020, (CUfunction func, size_t *paramCount),
       param_count_of_kind(func, FC_MAGIC_FUNC, paramCount));
FC_DEF(cuKernelGetParamCount, 13020, (CUkernel kernel, size_t *paramCount),
       param_count_of_kind(kernel, FC_MAGIC_KERN, paramCount));

FC_EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    FC_ENTRY(cuFuncGetName, 12030);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    fc_kdef *d = fc_kernel_def_of(hfunc, FC_MAGIC_FUNC);
    if (!d) return CUDA_ERROR_INVALID_HANDLE;
    *name = d->name;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuFuncGetName);
FC_EXPORT CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    FC_ENTRY(cuKernelGetName, 12030);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    fc_kdef *d = fc_kernel_def_of(hfunc, FC_MAGIC_KERN);
    if (!d) return CUDA_ERROR_INVALID_HANDLE;
    *name = d->name;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuKernelGetName);

/* ---- execution ---- */
fc_op *fc_kernel_op(fc_kdef *def, const fakecuda_dims *d, const void *args, const fc_use *uses, size_t nuses)
{
    size_t uses_at = (16 + def->argsize + _Alignof(fc_use) - 1) / _Alignof(fc_use) * _Alignof(fc_use);
    fc_op *op = calloc(1, sizeof *op + uses_at + nuses * sizeof *uses);
    if (!op) return NULL;
    op->kind = FC_OP_KERNEL;
    op->u.k.def = def;
    op->u.k.dims = *d;
    op->u.k.args = (void *)(((uintptr_t)(op + 1) + 15) & ~(uintptr_t)15);
    if (def->argsize) memcpy(op->u.k.args, args, def->argsize);
    op->u.k.uses = (fc_use *)((char *)(op + 1) + uses_at);
    op->u.k.nuses = nuses;
    if (nuses) memcpy(op->u.k.uses, uses, nuses * sizeof *uses);
    /* The launch reaches the GPU once the calling thread's modelled host time has passed. */
    op->u.k.not_before = fc_host_clock_ns() + FAKECUDA_LAUNCH_LATENCY_US * 1000ull;
    return op;
}

void fc_run_kernel(fc_kdef *def, const fakecuda_dims *d, void *args, const fc_use *uses, size_t nuses, int device)
{
    void *small[16];
    void **params = def->nparams <= 16 ? small : malloc(def->nparams * sizeof *params);
    if (params) {
        for (unsigned i = 0; i < def->nparams; i++) params[i] = (char *)args + def->offsets[i];
        fc_tls_kernel_device = device;
        if (def->fn) def->fn(params, d); /* an image's kernel has no C body: its results are not computed */
        for (size_t i = 0; i < nuses; i++) {
            uint64_t faults = fc_tls_gpu_faults;
            if (uses[i].reads) fc_pages_read(uses[i].ptr, uses[i].bytes);
            if (uses[i].overwrite) {
                fc_tls_overwrite_lo = uses[i].ptr;
                fc_tls_overwrite_hi = uses[i].ptr + uses[i].bytes;
            }
            if (uses[i].write) fakecuda_touch((const void *)uses[i].ptr, uses[i].bytes);
            else fakecuda_touch_read((const void *)uses[i].ptr, uses[i].bytes);
            fc_tls_overwrite_lo = fc_tls_overwrite_hi = 0;
            if (!uses[i].pointed) FC_COUNT(gpu_faults_unpointed, fc_tls_gpu_faults - faults);
        }
        fc_tls_kernel_device = -1;
        if (params != small) free(params);
    }
    fc_pay_debt(0); /* the kernel ends once its faults are serviced */
    FC_COUNT(kernels_run, 1);
}

FC_EXPORT void fakecuda_compute(uint64_t ns)
{
    if (fc_tls_kernel_device >= 0 && ns < (1ull << 40)) fc_charge_ns((int64_t)ns);
}

fc_kdef *fc_kernel_def(const void *func_or_kernel) { return fc_kernel_def_of(func_or_kernel, 0); }

CUresult fc_pack_args(const fc_kdef *def, void **params, void **extra, unsigned char *args)
{
    CUresult err = CUDA_SUCCESS;
    if (params && extra) return CUDA_ERROR_INVALID_VALUE;
    if (params) {
        for (unsigned i = 0; i < def->nparams && err == CUDA_SUCCESS; i++) {
            if (!params[i]) err = CUDA_ERROR_INVALID_VALUE;
            else memcpy(args + def->offsets[i], params[i], def->sizes[i]);
        }
    } else if (extra) {
        const void *buf = NULL;
        size_t size = 0;
        int have_size = 0;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END && err == CUDA_SUCCESS; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) {
                size = *(const size_t *)extra[i + 1];
                have_size = 1;
            } else err = CUDA_ERROR_INVALID_VALUE;
        }
        if (err == CUDA_SUCCESS && def->argsize && (!buf || !have_size || size < def->argsize))
            err = CUDA_ERROR_INVALID_VALUE;
        if (err == CUDA_SUCCESS && def->argsize) memcpy(args, buf, def->argsize);
    } else if (def->nparams) {
        err = CUDA_ERROR_INVALID_VALUE;
    }
    return err;
}

/* Copies the arguments and enqueues the kernel, or appends it to the stream's capture. */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream h, void **params, void **extra)
{
    fc_kdef *def = fc_kernel_def_of(f, 0);
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    int by_kernel = ((const struct CUfunc_st *)f)->magic == FC_MAGIC_KERN;
    if (def->noop) {
        FC_COUNT(launches, 1);
        if (by_kernel) FC_COUNT(launches_by_kernel, 1);
        else FC_COUNT(launches_by_function, 1);
        return CUDA_SUCCESS;
    }
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(h, &err);
    if (!s) return err;
    _Alignas(16) unsigned char stackbuf[1024];
    unsigned char *args = def->argsize <= sizeof stackbuf ? stackbuf : malloc(def->argsize);
    if (!args) return CUDA_ERROR_OUT_OF_MEMORY;
    err = fc_pack_args(def, params, extra, args);
    if (err == CUDA_SUCCESS) {
        fakecuda_dims d = { { gx, gy, gz }, { bx, by, bz }, shmem };
        fc_cost(FC_E_LAUNCH, FAKECUDA_LAUNCH_HOST_NS);
        fc_use *uses = NULL; /* a captured launch is a graph's node: its recorded operands are not kept */
        fc_launch_position at;
        size_t nuses = fc_launch_uses_take(def, args, &uses, &at);
        if (def->image) fc_image_launch_record(def, by_kernel, args, s, gx, at);
        int r = fc_stream_capturing(s) ? fc_capture_add_kernel(s, def, &d, args) : FC_NOT_CAPTURING;
        if (r == FC_NOT_CAPTURING) {
            fc_op *op = fc_kernel_op(def, &d, args, uses, nuses);
            if (op) fc_enqueue(s, op);
            else err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            err = (CUresult)r;
        }
        free(uses);
    }
    if (args != stackbuf) free(args);
    if (err == CUDA_SUCCESS) {
        FC_COUNT(launches, 1);
        if (by_kernel) FC_COUNT(launches_by_kernel, 1);
        else FC_COUNT(launches_by_function, 1);
    }
    return err;
}

FC_DEF(cuLaunchKernel, 4000, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
        CUstream hStream, void **kernelParams, void **extra),
       launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
FC_DEF(cuLaunchKernel_ptsz, 7000, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra),
       launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra));

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    if (!c || (c->numAttrs && !c->attrs)) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  c->sharedMemBytes, c->hStream, params, extra);
}
FC_DEF(cuLaunchKernelEx, 11060, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
       launch_ex(config, f, kernelParams, extra));
FC_DEF(cuLaunchKernelEx_ptsz, 11060, (const CUlaunchConfig *config, CUfunction f, void **kernelParams,
        void **extra),
       launch_ex(config, f, kernelParams, extra));

FC_DEF(cuLaunchCooperativeKernel, 9000, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams),
       launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, NULL));
FC_DEF(cuLaunchCooperativeKernel_ptsz, 9000, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams),
       launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, NULL));
