/* graphs.c: CUDA graphs on managed memory. A graph of four kernels over four
 * 16 MiB managed buffers (A, B, C and D: 64 MiB) is replayed REPLAYS times;
 * before each replay but the first, the host rewrites A and the last
 * kernel's buffer (their pages go back to the host), so every replay needs
 * them moved again. It prints one JSON line: a checksum of every result, the
 * GPU faults fakecuda counted, and the faults expected with no prefetching.
 *
 *   graphs REPLAYS [--build=capture|hand|child] [--instantiate=flags|params|v10000|v11000|v12000]
 *                  [--reinstantiate] [--update=exec|node] [--nested]
 * --build: the graph is captured from a stream, built node by node, or built
 *   by hand inside a child graph node of another graph.
 * --instantiate: cuGraphInstantiateWithFlags, cuGraphInstantiateWithParams,
 *   or the pointer cuGetProcAddress gives for "cuGraphInstantiate" at that
 *   CUDA version (the 5-argument form at every version, as NVIDIA's drivers answer).
 * --reinstantiate: each replay's exec is destroyed and a new one made.
 * --update: from the second replay on, the last kernel works on a fifth
 *   buffer E instead of D, through cuGraphExecUpdate with a second graph, or
 *   cuGraphExecKernelNodeSetParams on that node.
 * --nested: the replays run a second graph, captured around a replay of the
 *   first (which must add nothing to the capturing stream).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define BUFFER_FLOATS ((size_t)4 << 20) /* 16 MiB of floats */
#define PAGE (64u << 10)                /* fakecuda's fault granularity */

static void axpy_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *x = arg_floats(params, 0);
    float *y = arg_floats(params, 1);
    uint64_t n = arg_u64(params, 2);
    float a = *(float *)params[3];
    fakecuda_touch(x, n * sizeof *x);
    fakecuda_touch(y, n * sizeof *y);
    for (uint64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* A whole buffer written by the host. */
static void buffer_fill(CUdeviceptr p, float base)
{
    host_fill((float *)(uintptr_t)p, BUFFER_FLOATS, base);
}

/* The graph's kernels and their arguments (kernel node parameters point here). */
struct work {
    CUfunction scale, axpy, add;
    CUdeviceptr a, b, c, last;
    uint64_t n;
    float two, half, three;
    void *scale_a[3], *axpy_ab[4], *add_abc[4], *scale_last[3];
};

static void work_params(struct work *w)
{
    w->scale_a[0] = &w->a, w->scale_a[1] = &w->n, w->scale_a[2] = &w->two;
    w->axpy_ab[0] = &w->a, w->axpy_ab[1] = &w->b, w->axpy_ab[2] = &w->n, w->axpy_ab[3] = &w->three;
    w->add_abc[0] = &w->a, w->add_abc[1] = &w->b, w->add_abc[2] = &w->c, w->add_abc[3] = &w->n;
    w->scale_last[0] = &w->last, w->scale_last[1] = &w->n, w->scale_last[2] = &w->half;
}

static CUDA_KERNEL_NODE_PARAMS node_params(CUfunction f, void **params)
{
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 256;
    p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = params;
    return p;
}

static void launch(CUfunction f, CUstream stream, void **params)
{
    CHECK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, stream, params, NULL));
}

static CUgraph build_by_hand(struct work *w)
{
    CUgraph graph;
    CUgraphNode node[4];
    CUDA_KERNEL_NODE_PARAMS p[4] = {node_params(w->scale, w->scale_a), node_params(w->axpy, w->axpy_ab),
                                    node_params(w->add, w->add_abc), node_params(w->scale, w->scale_last)};
    CHECK(cuGraphCreate(&graph, 0));
    for (int i = 0; i < 4; i++)
        CHECK(cuGraphAddKernelNode(&node[i], graph, i > 0 ? &node[i - 1] : NULL, i > 0, &p[i]));
    return graph;
}

static CUgraph build(struct work *w, const char *how, CUstream stream)
{
    if (strcmp(how, "hand") == 0)
        return build_by_hand(w);
    CUgraph graph;
    if (strcmp(how, "child") == 0) {
        /* the first kernel in the parent, the other three in a child graph */
        CUgraph inner = build_by_hand(w), outer;
        CUgraphNode first, child;
        CUDA_KERNEL_NODE_PARAMS p = node_params(w->scale, w->scale_a);
        CHECK(cuGraphCreate(&outer, 0));
        CHECK(cuGraphAddKernelNode(&first, outer, NULL, 0, &p));
        CHECK(cuGraphAddChildGraphNode(&child, outer, &first, 1, inner));
        CHECK(cuGraphDestroy(inner)); /* the node holds its own copy */
        return outer;
    }
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    launch(w->scale, stream, w->scale_a);
    launch(w->axpy, stream, w->axpy_ab);
    launch(w->add, stream, w->add_abc);
    launch(w->scale, stream, w->scale_last);
    CHECK(cuStreamEndCapture(stream, &graph));
    return graph;
}

typedef CUresult (*instantiate_5)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);

static CUgraphExec instantiate(CUgraph graph, const char *how, CUstream stream)
{
    CUgraphExec exec;
    if (strcmp(how, "flags") == 0) {
        CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    } else if (strcmp(how, "params") == 0) {
        CUDA_GRAPH_INSTANTIATE_PARAMS p = {.hUploadStream = stream};
        CHECK(cuGraphInstantiateWithParams(&exec, graph, &p));
        if (p.result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS)
            exit(3);
    } else {
        int version = atoi(how + 1);
        void *fn = NULL;
        CUdriverProcAddressQueryResult status;
        CHECK(cuGetProcAddress("cuGraphInstantiate", &fn, version, 0, &status));
        if (fn == NULL) {
            fprintf(stderr, "error: no cuGraphInstantiate at %d\n", version);
            exit(3);
        }
        /* the 5-argument form at every version, 12000 included (NVIDIA's drivers) */
        CHECK(((instantiate_5)fn)(&exec, graph, NULL, NULL, 0));
    }
    return exec;
}

/* From now on the last kernel works on `to`. */
static void switch_last(CUgraphExec exec, CUgraph graph, struct work *w, CUdeviceptr to, const char *how)
{
    w->last = to;
    if (strcmp(how, "exec") == 0) {
        CUgraph second = build_by_hand(w);
        CUgraphExecUpdateResultInfo info;
        CHECK(cuGraphExecUpdate(exec, second, &info));
        CHECK(cuGraphDestroy(second));
        return;
    }
    size_t n = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &n));
    CUgraphNode node[8];
    if (n != 4) {
        fprintf(stderr, "error: --update=node needs a flat graph of 4 nodes\n");
        exit(2);
    }
    CHECK(cuGraphGetNodes(graph, node, &n));
    CUDA_KERNEL_NODE_PARAMS p = node_params(w->scale, w->scale_last);
    CHECK(cuGraphExecKernelNodeSetParams(exec, node[3], &p));
}

int main(int argc, char **argv)
{
    int replays = argc > 1 ? atoi(argv[1]) : 4;
    const char *build_how = "capture", *instantiate_how = "flags", *update = NULL;
    int reinstantiate = 0, nested = 0;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "--build=", 8) == 0)
            build_how = argv[i] + 8;
        else if (strncmp(argv[i], "--instantiate=", 14) == 0)
            instantiate_how = argv[i] + 14;
        else if (strcmp(argv[i], "--reinstantiate") == 0)
            reinstantiate = 1;
        else if (strncmp(argv[i], "--update=", 9) == 0)
            update = argv[i] + 9;
        else if (strcmp(argv[i], "--nested") == 0)
            nested = 1;
        else {
            fprintf(stderr, "usage: graphs REPLAYS [--build=capture|hand|child] "
                            "[--instantiate=flags|params|v10000|v11000|v12000] [--reinstantiate] "
                            "[--update=exec|node] [--nested]\n");
            return 2;
        }
    }
    CUdevice device;
    CUcontext ctx;
    cuda_api_load(&api, 0);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
    CHECK(cuCtxSetCurrent(ctx));
    const size_t p8 = 8, f4 = 4;
    const size_t scale_sizes[] = {p8, p8, f4}, scale_aligns[] = {p8, p8, f4};
    const size_t axpy_sizes[] = {p8, p8, p8, f4}, axpy_aligns[] = {p8, p8, p8, f4};
    const size_t add_sizes[] = {p8, p8, p8, p8}, add_aligns[] = {p8, p8, p8, p8};
    if (fakecuda_register_kernel("scale", scale_kernel, 3, scale_sizes, scale_aligns) ||
        fakecuda_register_kernel("axpy", axpy_kernel, 4, axpy_sizes, axpy_aligns) ||
        fakecuda_register_kernel("add", add_kernel, 4, add_sizes, add_aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    struct work w = {.n = BUFFER_FLOATS, .two = 2.0f, .half = 0.5f, .three = 3.0f};
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&w.scale, module, "scale"));
    CHECK(cuModuleGetFunction(&w.axpy, module, "axpy"));
    CHECK(cuModuleGetFunction(&w.add, module, "add"));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr buffer[5];
    for (int i = 0; i < 5; i++) {
        CHECK(cuMemAllocManaged(&buffer[i], BUFFER_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        buffer_fill(buffer[i], (float)(i + 1));
    }
    w.a = buffer[0], w.b = buffer[1], w.c = buffer[2], w.last = buffer[3];
    work_params(&w);
    fakecuda_reset_stats();

    CUgraph graph = build(&w, build_how, stream);
    CUgraphExec exec = instantiate(graph, instantiate_how, stream);
    if (nested) {
        CUgraph around;
        CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuGraphLaunch(exec, stream));
        CHECK(cuStreamEndCapture(stream, &around));
        CHECK(cuGraphExecDestroy(exec));
        CHECK(cuGraphDestroy(graph));
        graph = around;
        exec = instantiate(graph, instantiate_how, stream);
    }
    const uint64_t pages = BUFFER_FLOATS * sizeof(float) / PAGE;
    uint64_t expected_faults = 0;
    for (int r = 0; r < replays; r++) {
        if (r > 0) {
            if (r == 1 && update != NULL)
                switch_last(exec, graph, &w, buffer[4], update);
            buffer_fill(w.a, (float)r); /* A and the last buffer go back to the host */
            buffer_fill(w.last, (float)(2 * r));
            if (reinstantiate) {
                CHECK(cuGraphExecDestroy(exec));
                exec = instantiate(graph, instantiate_how, stream);
            }
        }
        expected_faults += r == 0 ? 4 * pages : 2 * pages;
        CHECK(cuGraphLaunch(exec, stream));
        CHECK(cuStreamSynchronize(stream));
    }

    struct fakecuda_stats stats;
    fakecuda_get_stats(&stats);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 5; i++) {
        fakecuda_host_touch((void *)buffer[i], BUFFER_FLOATS * sizeof(float));
        h = fnv1a(h, (void *)buffer[i], BUFFER_FLOATS * sizeof(float));
    }
    printf("{\"checksum\": \"%016llx\", \"gpu_faults\": %llu, \"expected_faults\": %llu, \"kernels_run\": %llu, "
           "\"bytes_prefetched_h2d\": %llu, \"device_resident_peak\": %llu}\n",
           (unsigned long long)h, (unsigned long long)stats.gpu_faults, (unsigned long long)expected_faults,
           (unsigned long long)stats.kernels_run, (unsigned long long)stats.bytes_prefetched_h2d,
           (unsigned long long)stats.device_resident_peak);
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    for (int i = 0; i < 5; i++)
        CHECK(cuMemFree(buffer[i]));
    CHECK(cuStreamDestroy(stream));
    return 0;
}
