/* images.c: why it exists: what a module or library loaded from a real image holds (the cubin
 * chosen for its device, its kernels as fakecuda kernels without a C body, its globals as
 * device allocations), lazy loading, and the record of each launch of an image kernel that a
 * test compares with what pump prefetched (FAKECUDA_LAUNCH_LOG). */
#include "image.h"
#include "tensor_lists.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fc_image {
    fc_cubin *cubin;
    int device;
    pthread_mutex_t mu;
    fc_kdef **defs;      /* per kernel: made on first use (lazy loading) or at load (eager) */
    CUdeviceptr *gptr;   /* per global: allocated on first ask, freed with the image */
    CUcontext *gctx;
};

/* Kernel definitions outlive their image: a graph node or a queued launch may still name one
 * after an unload (the driver's behaviour there is undefined; here the kernel still runs as a
 * no-op). They stay reachable from this list, so leak checkers do not blame fakecuda. */
static pthread_mutex_t fc_defs_lock = PTHREAD_MUTEX_INITIALIZER;
static fc_kdef *fc_image_defs;

/* ---- lazy loading ----
 * CUDA C++ Programming Guide, "Lazy Loading": controlled by CUDA_MODULE_LOADING (LAZY or EAGER),
 * "12.2: Lazy loading enabled by default for Linux"; a module load then "will not be loading
 * kernels immediately, instead it will delay loading of a kernel until cuModuleGetFunction()
 * is called". Here a kernel's parameter info is read at its first use when lazy (a malformed one
 * is refused then), at the load when eager (the load is refused). */
static int fc_lazy;
static pthread_once_t fc_mode_once = PTHREAD_ONCE_INIT;
static void load_mode(void)
{
    const char *v = getenv("CUDA_MODULE_LOADING");
    fc_lazy = fc_cfg.driver_version >= 12020;
    if (v && strcmp(v, "LAZY") == 0) fc_lazy = 1;
    else if (v && strcmp(v, "EAGER") == 0) fc_lazy = 0;
    else if (v && *v)
        fprintf(stderr, "fakecuda: CUDA_MODULE_LOADING=%s: known: LAZY or EAGER; taken as unset (%s, the default of "
                        "driver version %d)\n", v, fc_lazy ? "LAZY" : "EAGER", fc_cfg.driver_version);
}
static int lazy(void)
{
    pthread_once(&fc_mode_once, load_mode);
    return fc_lazy;
}

FC_EXPORT CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    FC_ENTRY(cuModuleGetLoadingMode, 11070);
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    *mode = lazy() ? CU_MODULE_LAZY_LOADING : CU_MODULE_EAGER_LOADING;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuModuleGetLoadingMode);

/* The device's compute capability, as cuDeviceGetAttribute answers it. */
extern __typeof__(cuDeviceGetAttribute) fcl_cuDeviceGetAttribute __attribute__((visibility("hidden")));

static CUresult materialize(fc_image *img, unsigned k, fc_kdef **out); /* under img->mu */

CUresult fc_image_load(const char *entry, const void *image, fc_image **out)
{
    *out = NULL;
    CUcontext ctx = fc_current_ctx();
    int device = fc_ctx_valid(ctx) ? fc_ctx_device(ctx) : 0;
    int major = 0, minor = 0;
    if (fcl_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) != CUDA_SUCCESS ||
        fcl_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    char why[FC_WHY] = "";
    unsigned char *elf;
    size_t size;
    CUresult r = fc_fatbin_select(image, major, minor, &elf, &size, why);
    if (r == CUDA_SUCCESS && !elf) return CUDA_SUCCESS; /* not an image: the registry's */
    fc_cubin *c = r == CUDA_SUCCESS ? fc_cubin_open(elf, size, why) : NULL;
    if (r == CUDA_SUCCESS && !c) r = CUDA_ERROR_INVALID_IMAGE;
    /* A bare cubin's SM must suit the device too (a fatbin's entry was chosen for it). */
    if (c && (c->sm / 10 != (unsigned)major || c->sm % 10 > (unsigned)minor ||
              (c->arch_specific && c->sm != (unsigned)(major * 10 + minor)))) {
        snprintf(why, sizeof why, "a cubin for sm_%u%s does not run on compute capability %d.%d", c->sm,
                 c->arch_specific ? "a" : "", major, minor);
        r = CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    fc_image *img = r == CUDA_SUCCESS ? calloc(1, sizeof *img) : NULL;
    if (r == CUDA_SUCCESS && img) {
        img->cubin = c;
        img->device = device;
        pthread_mutex_init(&img->mu, NULL);
        img->defs = calloc(c->nkernels ? c->nkernels : 1, sizeof *img->defs);
        img->gptr = calloc(c->nglobals ? c->nglobals : 1, sizeof *img->gptr);
        img->gctx = calloc(c->nglobals ? c->nglobals : 1, sizeof *img->gctx);
        if (!img->defs || !img->gptr || !img->gctx) r = CUDA_ERROR_OUT_OF_MEMORY;
        fc_kdef *d;
        for (unsigned k = 0; r == CUDA_SUCCESS && !lazy() && k < c->nkernels; k++) r = materialize(img, k, &d);
        if (r != CUDA_SUCCESS) {
            fc_image_free(img);
            return r; /* materialize said why */
        }
        *out = img;
        return CUDA_SUCCESS;
    }
    if (r == CUDA_SUCCESS) r = CUDA_ERROR_OUT_OF_MEMORY;
    fc_cubin_free(c);
    const char *name = "";
    cuGetErrorName(r, &name);
    fprintf(stderr, "fakecuda: %s: image refused (%s %d): %s\n", entry, name, (int)r, why);
    return r;
}

void fc_image_free(fc_image *img)
{
    if (!img) return;
    for (unsigned g = 0; img->gptr && g < img->cubin->nglobals; g++)
        if (img->gptr[g]) fc_free_memory(img->gptr[g]);
    /* The definitions stay (fc_image_defs); their names are their own copies. */
    free(img->defs);
    free(img->gptr);
    free(img->gctx);
    fc_cubin_free(img->cubin);
    pthread_mutex_destroy(&img->mu);
    free(img);
}

unsigned fc_image_kernel_count(const fc_image *img) { return img->cubin->nkernels; }

static CUresult materialize(fc_image *img, unsigned k, fc_kdef **out)
{
    if (img->defs[k]) {
        *out = img->defs[k];
        return CUDA_SUCCESS;
    }
    char why[FC_WHY];
    unsigned n;
    size_t *offsets, *sizes, argsize;
    if (fc_cubin_layout(img->cubin, k, &n, &offsets, &sizes, &argsize, why)) {
        fprintf(stderr, "fakecuda: kernel refused (CUDA_ERROR_INVALID_IMAGE): %s\n", why);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    fc_kdef *d = calloc(1, sizeof *d);
    char *name = strdup(img->cubin->kernels[k].name);
    if (!d || !name) {
        free(d);
        free(name);
        free(offsets);
        free(sizes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *d = (fc_kdef){ .name = name, .nparams = n, .sizes = sizes, .offsets = offsets, .argsize = argsize, .image = 1 };
    d->func = (struct CUfunc_st){ FC_MAGIC_FUNC, d };
    pthread_mutex_lock(&fc_defs_lock);
    d->next_image = fc_image_defs;
    fc_image_defs = d;
    pthread_mutex_unlock(&fc_defs_lock);
    *out = img->defs[k] = d;
    return CUDA_SUCCESS;
}

CUresult fc_image_kernel_at(fc_image *img, unsigned i, fc_kdef **out)
{
    if (i >= img->cubin->nkernels) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&img->mu);
    CUresult r = materialize(img, i, out);
    pthread_mutex_unlock(&img->mu);
    return r;
}

CUresult fc_image_kernel(fc_image *img, const char *name, fc_kdef **out)
{
    for (unsigned k = 0; k < img->cubin->nkernels; k++)
        if (strcmp(img->cubin->kernels[k].name, name) == 0) return fc_image_kernel_at(img, k, out);
    return CUDA_ERROR_NOT_FOUND;
}

/* A global's storage: device memory of the symbol's size in the current context, made on
 * first ask (the driver allocates a module's globals with it; a size-0 symbol gets 1 byte,
 * since an allocation cannot be empty). */
CUresult fc_image_global(fc_image *img, const char *name, CUdeviceptr *dptr, size_t *bytes)
{
    CUcontext ctx = fc_current_ctx();
    if (!fc_ctx_valid(ctx)) return fc_ctx_error(ctx);
    const fc_cubin *c = img->cubin;
    unsigned g = 0;
    while (g < c->nglobals && strcmp(c->globals[g].name, name) != 0) g++;
    if (g == c->nglobals) return CUDA_ERROR_NOT_FOUND;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&img->mu);
    if (!img->gptr[g]) {
        size_t n = c->globals[g].size ? (size_t)c->globals[g].size : 1;
        r = fc_alloc_memory(&img->gptr[g], n, FC_ALLOC_DEVICE, fc_ctx_device(ctx), ctx);
    }
    if (r == CUDA_SUCCESS) {
        if (dptr) *dptr = img->gptr[g];
        if (bytes) *bytes = (size_t)c->globals[g].size;
    }
    pthread_mutex_unlock(&img->mu);
    return r;
}

/* ---- FAKECUDA_LAUNCH_LOG: one JSON line per launch of an image kernel ----
 * {"kernel": name, "handle": "CUfunction"|"CUkernel", "stream": its id (cuStreamGetId),
 *  "captured": bool, "argsize": bytes, "thread" and "launch": its position (launch_uses.c),
 *  "pointers": [[ordinal, offset, value, allocation base, allocation size, managed], ...],
 *  "params": [[offset, size], ...]}: every 8-byte-aligned word inside a parameter (by-value
 * structs included: a pointer inside multi_tensor_apply's 25,768-byte TensorListMetadata is
 * found) whose value lies inside an allocation of fakecuda's, as the kernel's layout places
 * them, and that layout (a word that is a whole 8-byte parameter is a pointer the kernel takes
 * itself; one inside a struct may be a slot the launch left unset), and for PyTorch's
 * multi_tensor_apply kernels "tensor_list": {"depth", "tensors": slots per list, "reads": the
 * offsets in the first parameter of the pointer words the kernel reads} (tensor_lists.h; absent
 * for other kernels). Written by the
 * process that called cuInit, at the launch call, so that a test can check what pump prefetched. */
static FILE *fc_log;
static pthread_mutex_t fc_log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fc_log_once = PTHREAD_ONCE_INIT;
static void open_log(void)
{
    const char *path = getenv("FAKECUDA_LAUNCH_LOG");
    if (!path || !*path) return;
    if (!(fc_log = fopen(path, "w"))) {
        perror("fakecuda: FAKECUDA_LAUNCH_LOG");
        exit(2);
    }
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* ", \"tensor_list\": {...}" for a PyTorch tensor-list kernel, nothing for another. */
static void tensor_list_reads(FILE *f, const fc_kdef *def, const unsigned char *args, unsigned grid_x)
{
    fc_tensor_list tl;
    if (def->nparams == 0 || def->offsets[0] != 0 || !fc_tensor_list_of(def->name, def->sizes[0], &tl)) return;
    size_t *offsets = malloc(sizeof *offsets * (tl.depth + 1) * tl.tensors);
    if (!offsets) return;
    size_t n = fc_tensor_list_reads(&tl, args, grid_x, offsets);
    fprintf(f, ", \"tensor_list\": {\"depth\": %u, \"tensors\": %u, \"reads\": [", tl.depth, tl.tensors);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%zu", i ? ", " : "", offsets[i]);
    fputs("]}", f);
    free(offsets);
}

void fc_image_launch_record(const fc_kdef *def, int by_kernel_handle, const unsigned char *args, CUstream s,
                            unsigned grid_x, fc_launch_position at)
{
    pthread_once(&fc_log_once, open_log);
    if (!fc_log || atomic_load(&fc_init_pid) != (int)getpid()) return;
    pthread_mutex_lock(&fc_log_lock);
    fputs("{\"kernel\": ", fc_log);
    json_string(fc_log, def->name);
    fprintf(fc_log, ", \"handle\": \"%s\", \"stream\": %llu, \"captured\": %s, \"argsize\": %zu, \"thread\": %d, "
            "\"launch\": %" PRIu64 ", \"pointers\": [", by_kernel_handle ? "CUkernel" : "CUfunction", s->id,
            fc_stream_capturing(s) ? "true" : "false", def->argsize, at.thread, at.launch);
    int first = 1;
    for (unsigned i = 0; i < def->nparams; i++) {
        size_t end = def->offsets[i] + def->sizes[i];
        for (size_t w = (def->offsets[i] + 7) & ~(size_t)7; w + 8 <= end; w += 8) {
            uint64_t v;
            memcpy(&v, args + w, 8);
            fc_alloc_desc a;
            if (!v || !fc_alloc_lookup((uintptr_t)v, &a)) continue;
            fprintf(fc_log, "%s[%u, %zu, %" PRIu64 ", %" PRIuPTR ", %zu, %s]", first ? "" : ", ", i, w, v, a.base,
                    a.size, a.managed ? "true" : "false");
            first = 0;
        }
    }
    fputs("], \"params\": [", fc_log);
    for (unsigned i = 0; i < def->nparams; i++)
        fprintf(fc_log, "%s[%zu, %zu]", i ? ", " : "", def->offsets[i], def->sizes[i]);
    fputc(']', fc_log);
    tensor_list_reads(fc_log, def, args, grid_x);
    fputs("}\n", fc_log);
    fflush(fc_log);
    pthread_mutex_unlock(&fc_log_lock);
}
