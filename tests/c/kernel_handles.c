/* kernel_handles.c: one kernel launched through each kind of handle the driver hands out,
 * for tests/test_kernel_handles.py: pump must ask each handle's parameter layout of the
 * call that takes its kind, so that it finds the pointer argument and prefetches.
 *
 *   kernel_handles HOW
 * HOW: function (cuModuleGetFunction), kernel (cuLibraryGetKernel, launched cast to
 * CUfunction as cuda.h allows), kernel_function (cuLibraryGetKernel then
 * cuKernelGetFunction), enumerated_kernel (cuLibraryEnumerateKernels), enumerated_function
 * (cuModuleEnumerateFunctions), captured_kernel (cuLibraryGetKernel, the launch captured
 * into a graph and replayed: the graph's node holds a CUfunction the driver made, which
 * pump never saw handed out). scale(float *x, uint64_t n, float factor) runs over 1 MiB
 * of managed memory the host wrote. One JSON line: the kernel's GPU faults, a checksum.
 */
#include <string.h>

#include "cuda_api.h"

#define N ((uint64_t)1 << 18) /* floats: 1 MiB */

#include "procaddr_entry.h"

static CUfunction handle(const char *how, const char *name)
{
    CUlibrary library;
    CUmodule module;
    CUkernel kernel;
    CUfunction f = NULL;
    if (strncmp(how, "kernel", 6) == 0 || strcmp(how, "enumerated_kernel") == 0 ||
        strcmp(how, "captured_kernel") == 0)
        CHECK(api.library_load_data(&library, "fakecuda", NULL, NULL, 0, NULL, NULL, 0));
    else
        CHECK(api.module_load_data(&module, "fakecuda"));
    if (strcmp(how, "function") == 0) {
        CHECK(api.module_get_function(&f, module, name));
    } else if (strcmp(how, "kernel") == 0 || strcmp(how, "captured_kernel") == 0) {
        CHECK(api.library_get_kernel(&kernel, library, name));
        f = (CUfunction)(void *)kernel;
    } else if (strcmp(how, "kernel_function") == 0) {
        CHECK(api.library_get_kernel(&kernel, library, name));
        CHECK(ENTRY(cuKernelGetFunction, 12000)(&f, kernel));
    } else if (strcmp(how, "enumerated_kernel") == 0) {
        CHECK(ENTRY(cuLibraryEnumerateKernels, 12040)(&kernel, 1, library));
        f = (CUfunction)(void *)kernel;
    } else if (strcmp(how, "enumerated_function") == 0) {
        CHECK(ENTRY(cuModuleEnumerateFunctions, 12040)(&f, 1, module));
    }
    return f;
}

int main(int argc, char **argv)
{
    static const char *const hows[] = {"function", "kernel", "kernel_function", "enumerated_kernel",
                                       "enumerated_function", "captured_kernel"};
    const char *how = argc == 2 ? argv[1] : "";
    int known = 0;
    for (size_t i = 0; i < sizeof hows / sizeof *hows; i++)
        known = known || strcmp(how, hows[i]) == 0;
    if (!known) {
        fprintf(stderr, "usage: kernel_handles function|kernel|kernel_function|enumerated_kernel|"
                        "enumerated_function|captured_kernel\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t sizes[] = {sizeof(float *), sizeof(uint64_t), sizeof(float)};
    const size_t aligns[] = {_Alignof(float *), _Alignof(uint64_t), _Alignof(float)};
    if (api.register_kernel("scale", scale_kernel, 3, sizes, aligns) != 0)
        return 3;
    CUfunction f = handle(how, "scale");
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr x;
    CHECK(api.mem_alloc_managed(&x, N * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    host_fill((float *)(uintptr_t)x, N, 1.0f);

    struct fakecuda_stats s;
    uint64_t n = N;
    float factor = 3.0f;
    void *params[] = {&x, &n, &factor};
    if (strcmp(how, "captured_kernel") == 0) {
        CUgraph graph;
        CUgraphExec exec;
        CHECK(api.stream_begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(api.launch_kernel(f, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        CHECK(api.stream_end_capture(stream, &graph));
        CHECK(api.graph_instantiate(&exec, graph, 0));
        api.reset_stats();
        CHECK(api.graph_launch(exec, stream));
    } else {
        api.reset_stats();
        CHECK(api.launch_kernel(f, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    }
    CHECK(api.stream_synchronize(stream));
    api.get_stats(&s);
    api.host_touch((void *)(uintptr_t)x, N * sizeof(float));
    uint64_t h = fnv1a(0xcbf29ce484222325ull, (const void *)(uintptr_t)x, N * sizeof(float));
    CHECK(api.mem_free(x));
    printf("{\"faults\": %llu, \"checksum\": \"%016llx\"}\n", (unsigned long long)s.gpu_faults,
           (unsigned long long)h);
    return 0;
}
