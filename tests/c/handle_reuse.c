/* handle_reuse.c: a kernel handle's address handed to another kernel after an unload, for
 * tests/test_handle_reuse.py. The driver frees an unloaded module's (or library's) function
 * objects and may give the next one loaded the same address (fakecuda does, as a heap
 * would): pump must not scan the new kernel's launch with the old kernel's layout, which
 * would read kernelParams past the end of the new launch's array.
 *
 *   handle_reuse HOW PARAMS
 * HOW: module (wide from one module, narrow from the next) or library (wide a CUkernel of
 * a library, narrow a CUfunction of the next module: the address comes back as the other
 * kind). wide(float *a0, ..., float *a15) adds 1 to 16 arrays; narrow(float *x, uint64_t n)
 * doubles n floats. PARAMS: exact (narrow's kernelParams array holds its 2 entries, on the
 * heap: a read past it is ASan's heap-buffer-overflow) or padded (14 more entries after
 * them, each pointing at a zero word: a read past the 2 is counted, not a crash). One JSON
 * line: whether the address came back, narrow's GPU faults, a checksum of x.
 *
 *   handle_reuse race exact
 * A second thread loads a module, launches wide or narrow (in turn: the same address each
 * time, its layout changing) and unloads it, ROUNDS times, while the first launches narrow
 * of a module of its own, whose layout each unload makes pump ask again: for the
 * sanitizers (the layout table's compare-and-swap, the retired layouts). One JSON line:
 * whether every round got the same address, and the first thread's launches.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "cuda_api.h"

#define WIDE 16
#define N ((uint64_t)1 << 16) /* floats: 256 KiB */

#include "procaddr_entry.h"

static void wide_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    for (int i = 0; i < WIDE; i++) {
        float *a = arg_floats(params, i);
        api.touch(a, 64 * sizeof *a);
        for (int j = 0; j < 64; j++)
            a[j] += 1.0f;
    }
}

static void narrow_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] *= 2.0f;
}

static void register_kernels(void)
{
    size_t sizes[WIDE], aligns[WIDE];
    for (int i = 0; i < WIDE; i++) {
        sizes[i] = sizeof(float *);
        aligns[i] = _Alignof(float *);
    }
    const size_t narrow_sizes[] = {sizeof(float *), sizeof(uint64_t)};
    const size_t narrow_aligns[] = {_Alignof(float *), _Alignof(uint64_t)};
    if (api.register_kernel("wide", wide_kernel, WIDE, sizes, aligns) != 0 ||
        api.register_kernel("narrow", narrow_kernel, 2, narrow_sizes, narrow_aligns) != 0)
        exit(3);
}

/* wide launched once, from a module or a library then unloaded: its handle. */
static CUfunction launch_wide_and_unload(const char *how, CUstream stream)
{
    static CUdeviceptr arrays[WIDE];
    void *params[WIDE];
    for (int i = 0; i < WIDE; i++) {
        CHECK(api.mem_alloc_managed(&arrays[i], 64 * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        params[i] = &arrays[i];
    }
    CUfunction wide;
    CUmodule module = NULL;
    CUlibrary library = NULL;
    if (strcmp(how, "module") == 0) {
        CHECK(api.module_load_data(&module, "fakecuda"));
        CHECK(api.module_get_function(&wide, module, "wide"));
    } else {
        CUkernel kernel;
        CHECK(api.library_load_data(&library, "fakecuda", NULL, NULL, 0, NULL, NULL, 0));
        CHECK(api.library_get_kernel(&kernel, library, "wide"));
        wide = (CUfunction)(void *)kernel;
    }
    CHECK(api.launch_kernel(wide, 1, 1, 1, 64, 1, 1, 0, stream, params, NULL));
    CHECK(api.stream_synchronize(stream));
    if (module != NULL)
        CHECK(ENTRY(cuModuleUnload, 2000)(module));
    else
        CHECK(ENTRY(cuLibraryUnload, 12000)(library));
    for (int i = 0; i < WIDE; i++)
        CHECK(api.mem_free(arrays[i]));
    return wide;
}

#define ROUNDS 200

static CUcontext context;
static atomic_bool churn_done;
static atomic_bool churn_same = true;

/* The second thread of `race`: modules loaded, launched and unloaded in turn. */
static void *churn(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr arrays[WIDE];
    for (int i = 0; i < WIDE; i++)
        CHECK(api.mem_alloc_managed(&arrays[i], 64 * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    uint64_t n = 64;
    CUfunction first = NULL;
    for (int round = 0; round < ROUNDS; round++) {
        bool wide = round % 2 == 0;
        CUmodule module;
        CUfunction f;
        CHECK(api.module_load_data(&module, "fakecuda"));
        CHECK(api.module_get_function(&f, module, wide ? "wide" : "narrow"));
        first = first != NULL ? first : f;
        if (f != first)
            atomic_store(&churn_same, false);
        void **params = malloc((wide ? WIDE : 2) * sizeof *params);  /* exact: ASan sees a read past it */
        if (params == NULL)
            exit(3);
        for (int i = 0; i < (wide ? WIDE : 1); i++)
            params[i] = &arrays[i];
        if (!wide)
            params[1] = &n;
        CHECK(api.launch_kernel(f, 1, 1, 1, 64, 1, 1, 0, stream, params, NULL));
        CHECK(api.stream_synchronize(stream));
        free(params);
        CHECK(ENTRY(cuModuleUnload, 2000)(module));
    }
    for (int i = 0; i < WIDE; i++)
        CHECK(api.mem_free(arrays[i]));
    atomic_store(&churn_done, true);
    return NULL;
}

/* The first thread of `race`: its own module's narrow, launched until the churn ends. */
static int race(void)
{
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUmodule module;
    CUfunction narrow;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&narrow, module, "narrow"));
    CUdeviceptr x;
    CHECK(api.mem_alloc_managed(&x, 64 * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    uint64_t n = 64, launches = 0;
    pthread_t thread;
    if (pthread_create(&thread, NULL, churn, NULL) != 0)
        return 3;
    while (!atomic_load(&churn_done) || launches == 0) {
        void **params = malloc(2 * sizeof *params);
        if (params == NULL)
            return 3;
        params[0] = &x;
        params[1] = &n;
        CHECK(api.launch_kernel(narrow, 1, 1, 1, 64, 1, 1, 0, stream, params, NULL));
        CHECK(api.stream_synchronize(stream));
        free(params);
        launches++;
    }
    pthread_join(thread, NULL);
    CHECK(api.mem_free(x));
    CHECK(ENTRY(cuModuleUnload, 2000)(module));
    printf("{\"same_handle\": %s, \"launches\": %llu}\n", atomic_load(&churn_same) ? "true" : "false",
           (unsigned long long)launches);
    return 0;
}

int main(int argc, char **argv)
{
    const char *how = argc == 3 ? argv[1] : "";
    const char *layout = argc == 3 ? argv[2] : "";
    if ((strcmp(how, "module") != 0 && strcmp(how, "library") != 0 && strcmp(how, "race") != 0) ||
        (strcmp(layout, "exact") != 0 && strcmp(layout, "padded") != 0)) {
        fprintf(stderr, "usage: handle_reuse module|library|race exact|padded\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CHECK(api.primary_ctx_retain(&context, cuda_api_start(&api)));
    register_kernels();
    if (strcmp(how, "race") == 0)
        return race();
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUfunction wide = launch_wide_and_unload(how, stream);

    CUmodule module;
    CUfunction narrow;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&narrow, module, "narrow"));
    CUdeviceptr x;
    CHECK(api.mem_alloc_managed(&x, N * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    host_fill((float *)(uintptr_t)x, N, 1.0f);
    uint64_t n = N, zero = 0;
    void **params = malloc((strcmp(layout, "padded") == 0 ? WIDE : 2) * sizeof *params);
    if (params == NULL)
        return 3;
    params[0] = &x;
    params[1] = &n;
    for (int i = 2; strcmp(layout, "padded") == 0 && i < WIDE; i++)
        params[i] = &zero;
    struct fakecuda_stats s;
    api.reset_stats();
    CHECK(api.launch_kernel(narrow, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    CHECK(api.stream_synchronize(stream));
    api.get_stats(&s);
    free(params);
    api.host_touch((void *)(uintptr_t)x, N * sizeof(float));
    uint64_t h = fnv1a(0xcbf29ce484222325ull, (const void *)(uintptr_t)x, N * sizeof(float));
    CHECK(api.mem_free(x));
    CHECK(ENTRY(cuModuleUnload, 2000)(module));
    printf("{\"same_handle\": %s, \"faults\": %llu, \"checksum\": \"%016llx\"}\n", narrow == wide ? "true" : "false",
           (unsigned long long)s.gpu_faults, (unsigned long long)h);
    return 0;
}
