/* modules.c: why it exists: modules and libraries (from a real image, images.c, or standing
 * for the registry of host kernels), which own the CUfunction and CUkernel handles they hand
 * out (two different handle objects per kernel, as in the driver) and free them when unloaded. */
#include "image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each module and library owns the handles it hands out (one per kernel, asked again: the
 * same one), as the driver's do: a CUfunction is a pointer to a function object the driver
 * made for the module, and cuModuleUnload / cuLibraryUnload free them ("destroys the
 * module", cuda.h). The driver's objects come from its heap, and a heap gives a freed block
 * to the next request of its size (glibc malloc/malloc.c: the tcache and fastbins are LIFO
 * lists per size), so the next module load's function may get the address an unloaded one
 * had: a handle address does not name one kernel for the life of the process. Freed handles
 * go on a LIFO list that the next handle is taken from (FAKECUDA_HANDLE_REUSE=0: never
 * reused), so reuse happens every time, under ASan too (whose quarantine would delay it):
 * the side that is harder on a caller that caches by handle. Freed handle memory is kept
 * (marked dead), so a stale handle is refused with CUDA_ERROR_INVALID_HANDLE, not a crash. */
struct fc_handle {
    struct CUfunc_st h;        /* first: the handle points here (CUfunc_st and CUkern_st match) */
    struct fc_handle *next;    /* the owner's list, or the free list */
    struct fc_handle *func;    /* a CUkernel's CUfunction (cuKernelGetFunction), owned alike */
};
struct CUmod_st { fc_link link; uint32_t magic; struct fc_handle *handles; fc_image *img; };
struct CUlib_st { fc_link link; uint32_t magic; struct fc_handle *handles; fc_image *img; };

static pthread_mutex_t fc_handle_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fc_handle *fc_free_handles;
static int fc_handle_reuse = -1;

static void load_handle_reuse(void)
{
    const char *v = getenv("FAKECUDA_HANDLE_REUSE");
    if (v && *v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_HANDLE_REUSE=%s: allowed: 1 (the default: freed handle addresses are "
                        "handed out again) or 0\n", v);
        exit(2);
    }
    fc_handle_reuse = !(v && strcmp(v, "0") == 0);
}

/* The owner's handle of `magic` kind for d, made on first ask (*list: the owner's list,
 * under fc_handle_lock); NULL when out of memory. */
static struct fc_handle *handle_locked(struct fc_handle **list, fc_kdef *d, uint32_t magic)
{
    for (struct fc_handle *h = *list; h; h = h->next)
        if (h->h.def == d) return h;
    if (fc_handle_reuse < 0) load_handle_reuse();
    struct fc_handle *h = fc_free_handles;
    if (h) fc_free_handles = h->next;
    else if (!(h = malloc(sizeof *h))) return NULL;
    *h = (struct fc_handle){ { magic, d }, *list, NULL };
    *list = h;
    return h;
}

static struct fc_handle *owned_handle(struct fc_handle **list, fc_kdef *d, uint32_t magic)
{
    pthread_mutex_lock(&fc_handle_lock);
    struct fc_handle *h = handle_locked(list, d, magic);
    pthread_mutex_unlock(&fc_handle_lock);
    return h;
}

static void free_one(struct fc_handle *h)
{
    h->h.magic = FC_MAGIC_DEAD;
    if (fc_handle_reuse) {
        h->next = fc_free_handles;
        fc_free_handles = h;
    }
}

/* An unloaded owner's handles die; their memory is handed out again (or kept, dead). */
static void free_handles(struct fc_handle *list)
{
    pthread_mutex_lock(&fc_handle_lock);
    while (list) {
        struct fc_handle *next = list->next;
        if (list->func) free_one(list->func);
        free_one(list);
        list = next;
    }
    pthread_mutex_unlock(&fc_handle_lock);
}

/* ---- what a module or library serves: its image's kernels, or the registry's ----
 * An image that is a fatbin, the runtime's fatbin wrapper or a cubin is read (images.c); any
 * other (PTX text, a test's name) stands for the registry of host kernels, every one of which
 * is in every such module, as a JIT of the test's PTX would give it. */
static CUresult owner_find(fc_image *img, const char *name, fc_kdef **d)
{
    if (img) return fc_image_kernel(img, name, d);
    return (*d = fc_kernel_find(name)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
static unsigned owner_count(const fc_image *img) { return img ? fc_image_kernel_count(img) : fc_kernel_count(); }
/* The i-th kernel, or CUDA_ERROR_NOT_FOUND past the last. */
static CUresult owner_at(fc_image *img, unsigned i, fc_kdef **d)
{
    if (img) return i < fc_image_kernel_count(img) ? fc_image_kernel_at(img, i, d) : CUDA_ERROR_NOT_FOUND;
    return (*d = fc_kernel_at(i)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
/* Up to n handles of the owner's kernels, in order; the entries past its count left alone. */
static CUresult owner_enumerate(struct fc_handle **list, fc_image *img, void **out, unsigned n, uint32_t magic)
{
    fc_kdef *d;
    CUresult r;
    for (unsigned i = 0; i < n && (r = owner_at(img, i, &d)) != CUDA_ERROR_NOT_FOUND; i++) {
        if (r != CUDA_SUCCESS) return r;
        struct fc_handle *h = owned_handle(list, d, magic);
        if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
        out[i] = &h->h;
    }
    return CUDA_SUCCESS;
}

/* The handle of kernel `name` of an owner (a module's CUfunction, a library's CUkernel). */
static CUresult owner_handle(struct fc_handle **list, fc_image *img, const char *name, uint32_t magic, void **out)
{
    fc_kdef *d;
    CUresult r = owner_find(img, name, &d);
    if (r != CUDA_SUCCESS) return r;
    struct fc_handle *h = owned_handle(list, d, magic);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = &h->h;
    return CUDA_SUCCESS;
}

static CUresult module_load(CUmodule *m, const char *entry, const void *image)
{
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_ctx_valid(fc_current_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUmod_st *o = calloc(1, sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fc_image_load(entry, image, &o->img);
    if (r != CUDA_SUCCESS) {
        free(o);
        return r;
    }
    o->magic = FC_MAGIC_MOD;
    fc_keep(&o->link);
    *m = o;
    return CUDA_SUCCESS;
}

/* A file's bytes, NUL-padded (PTX text ends in a NUL; a short file reads as zeros), for the
 * calls that load from a path (CUDA_ERROR_FILE_NOT_FOUND if it cannot be opened, cuda.h). */
static CUresult read_image_file(const char *fname, char **out)
{
    FILE *f = fopen(fname, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    CUresult r = CUDA_SUCCESS;
    for (size_t got = 1; got && r == CUDA_SUCCESS;) {
        if (cap - n < 65536) {
            char *nb = realloc(buf, cap = cap * 2 + 65536 + 1);
            if (!nb) r = CUDA_ERROR_OUT_OF_MEMORY;
            else buf = nb;
        }
        if (r == CUDA_SUCCESS) n += got = fread(buf + n, 1, cap - n - 1, f);
    }
    fclose(f);
    if (r != CUDA_SUCCESS) {
        free(buf);
        return r;
    }
    memset(buf + n, 0, cap - n);
    *out = buf;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    FC_ENTRY(cuModuleLoad, 2000);
    if (!fname || !module) return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    CUresult r = read_image_file(fname, &buf);
    if (r == CUDA_SUCCESS) {
        r = module_load(module, "cuModuleLoad", buf);
        free(buf);
    }
    return r;
}
FC_ALIAS(cuModuleLoad);
FC_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    FC_ENTRY(cuModuleLoadData, 2000);
    return module_load(module, "cuModuleLoadData", image);
}
FC_ALIAS(cuModuleLoadData);
FC_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues)
{
    FC_ENTRY(cuModuleLoadDataEx, 2010);
    (void)numOptions; (void)options; (void)optionValues;
    return module_load(module, "cuModuleLoadDataEx", image);
}
FC_ALIAS(cuModuleLoadDataEx);
FC_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    FC_ENTRY(cuModuleLoadFatBinary, 2000);
    return module_load(module, "cuModuleLoadFatBinary", fatCubin);
}
FC_ALIAS(cuModuleLoadFatBinary);

FC_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    FC_ENTRY(cuModuleUnload, 2000);
    if (!hmod || hmod->magic != FC_MAGIC_MOD) return CUDA_ERROR_INVALID_HANDLE;
    hmod->magic = FC_MAGIC_DEAD;
    free_handles(hmod->handles);
    fc_image_free(hmod->img);
    fc_unkeep(&hmod->link);
    free(hmod);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuModuleUnload);

FC_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FC_ENTRY(cuModuleGetFunction, 2000);
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != FC_MAGIC_MOD) return CUDA_ERROR_INVALID_HANDLE;
    return owner_handle(&hmod->handles, hmod->img, name, FC_MAGIC_FUNC, (void **)hfunc);
}
FC_ALIAS(cuModuleGetFunction);

/* cuda.h: "Both parameters dptr and bytes are optional. If one of them is NULL, it is
 * ignored." A module of the registry has no globals. */
FC_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    FC_ENTRY(cuModuleGetGlobal_v2, 3020);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != FC_MAGIC_MOD) return CUDA_ERROR_INVALID_HANDLE;
    return hmod->img ? fc_image_global(hmod->img, name, dptr, bytes) : CUDA_ERROR_NOT_FOUND;
}
FC_ALIAS(cuModuleGetGlobal_v2);

/* CUDA 12.4, cuda.h: "Returns in functions a maximum number of numFunctions function
 * handles within mod"; the entries past the module's count are left alone. */
FC_EXPORT CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule hmod)
{
    FC_ENTRY(cuModuleGetFunctionCount, 12040);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != FC_MAGIC_MOD) return CUDA_ERROR_INVALID_HANDLE;
    *count = owner_count(hmod->img);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuModuleGetFunctionCount);

FC_EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned int numFunctions, CUmodule mod)
{
    FC_ENTRY(cuModuleEnumerateFunctions, 12040);
    if (!functions) return CUDA_ERROR_INVALID_VALUE;
    if (!mod || mod->magic != FC_MAGIC_MOD) return CUDA_ERROR_INVALID_HANDLE;
    return owner_enumerate(&mod->handles, mod->img, (void **)functions, numFunctions, FC_MAGIC_FUNC);
}
FC_ALIAS(cuModuleEnumerateFunctions);

/* A library is loaded without a context (CUDA 12.0, context-independent loading); its cubin is
 * chosen for the current context's device, or device 0 (every device here is of one kind). JIT
 * and library options are taken and not modelled. */
static CUresult library_load(CUlibrary *library, const char *entry, const void *code)
{
    if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
    struct CUlib_st *o = calloc(1, sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fc_image_load(entry, code, &o->img);
    if (r != CUDA_SUCCESS) {
        free(o);
        return r;
    }
    o->magic = FC_MAGIC_LIB;
    fc_keep(&o->link);
    *library = o;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions)
{
    FC_ENTRY(cuLibraryLoadData, 12000);
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    return library_load(library, "cuLibraryLoadData", code);
}
FC_ALIAS(cuLibraryLoadData);

/* cuLibraryLoadFromFile (cuda.h, CUDA 12.0): cuLibraryLoadData of the file's bytes. cuDNN 9 looks
 * it up in libcuda by dlsym; the real driver exports it (535.261 and 550.163). */
FC_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                                         void **jitOptionsValues, unsigned int numJitOptions,
                                         CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                         unsigned int numLibraryOptions)
{
    FC_ENTRY(cuLibraryLoadFromFile, 12000);
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    if (!library || !fileName) return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    CUresult r = read_image_file(fileName, &buf);
    if (r == CUDA_SUCCESS) {
        r = library_load(library, "cuLibraryLoadFromFile", buf);
        free(buf);
    }
    return r;
}
FC_ALIAS(cuLibraryLoadFromFile);

FC_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    FC_ENTRY(cuLibraryUnload, 12000);
    if (!library || library->magic != FC_MAGIC_LIB) return CUDA_ERROR_INVALID_HANDLE;
    library->magic = FC_MAGIC_DEAD;
    free_handles(library->handles);
    fc_image_free(library->img);
    fc_unkeep(&library->link);
    free(library);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLibraryUnload);

FC_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    FC_ENTRY(cuLibraryGetKernel, 12000);
    if (!pKernel || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->magic != FC_MAGIC_LIB) return CUDA_ERROR_INVALID_HANDLE;
    return owner_handle(&library->handles, library->img, name, FC_MAGIC_KERN, (void **)pKernel);
}
FC_ALIAS(cuLibraryGetKernel);

/* cuda.h: the global "for the requested library library and the current context". */
FC_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    FC_ENTRY(cuLibraryGetGlobal, 12000);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->magic != FC_MAGIC_LIB) return CUDA_ERROR_INVALID_HANDLE;
    return library->img ? fc_image_global(library->img, name, dptr, bytes) : CUDA_ERROR_NOT_FOUND;
}
FC_ALIAS(cuLibraryGetGlobal);

/* CUDA 12.4: as cuModuleEnumerateFunctions, CUkernel handles. */
FC_EXPORT CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    FC_ENTRY(cuLibraryGetKernelCount, 12040);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!lib || lib->magic != FC_MAGIC_LIB) return CUDA_ERROR_INVALID_HANDLE;
    *count = owner_count(lib->img);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLibraryGetKernelCount);

FC_EXPORT CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib)
{
    FC_ENTRY(cuLibraryEnumerateKernels, 12040);
    if (!kernels) return CUDA_ERROR_INVALID_VALUE;
    if (!lib || lib->magic != FC_MAGIC_LIB) return CUDA_ERROR_INVALID_HANDLE;
    return owner_enumerate(&lib->handles, lib->img, (void **)kernels, numKernels, FC_MAGIC_KERN);
}
FC_ALIAS(cuLibraryEnumerateKernels);

FC_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    FC_ENTRY(cuKernelGetFunction, 12000);
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    fc_kdef *d = fc_kernel_def_of(kernel, FC_MAGIC_KERN);
    if (!d) return CUDA_ERROR_INVALID_HANDLE;
    if (!fc_ctx_valid(fc_current_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    /* The library's kernel's function: made once, freed with the library. */
    struct fc_handle *k = (struct fc_handle *)(void *)kernel;
    pthread_mutex_lock(&fc_handle_lock);
    struct fc_handle *f = k->func;
    if (!f && (f = handle_locked(&k->func, d, FC_MAGIC_FUNC)) != NULL) f->next = NULL;
    pthread_mutex_unlock(&fc_handle_lock);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    *pFunc = (CUfunction)&f->h;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuKernelGetFunction);

