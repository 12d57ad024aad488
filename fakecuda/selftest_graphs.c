/* selftest_graphs.c: why it exists: the stream topics of fakecuda's self-test main sequence
 * (selftest.c runs them in order on what it set up): events across streams and their timing;
 * capture (a captured launch runs only when its graph is launched); streams joining a capture
 * through events, what invalidates a capture (a prefetch, a potentially unsafe call in global
 * mode); graphs built by hand, instantiated with params, their exec's nodes and whole graph
 * updated. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"
#include "selftest.h"

#define PAGE (64u * 1024u)

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Host functions block until the main thread says go (or 10 s pass): no timing luck. */
static atomic_int go_a;
static int flag_a, flag_seen;
static void host_slow_set(void *ud) { (void)ud; selftest_wait_for(&go_a); sleep_ms(30); flag_a = 1; }
static void host_observe(void *ud) { (void)ud; flag_seen = flag_a; }
static void host_sleep20(void *ud) { (void)ud; sleep_ms(20); }

/* Copies from and to page-locked host memory are captured as memcpy nodes that read their source
 * when the graph runs, not at capture; one between two host operands is refused. d: device memory
 * of at least 2 floats, none of them 7 or 9. */
static void captured_pinned_copies(CUstream s, float *d)
{
    float *h = NULL;
    CUgraph g;
    CUgraphExec ge;
    OK(cuMemHostAlloc((void **)&h, 4 * sizeof *h, 0));
    h[0] = 1.0f;
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d, h, sizeof *h, s));
    OK(cuMemcpyDtoHAsync(h + 1, (CUdeviceptr)(uintptr_t)d, sizeof *h, s));
    OK(cuStreamEndCapture(s, &g));
    h[0] = 7.0f; /* after the capture: the node reads it at launch */
    OK(cuStreamSynchronize(s));
    CHECK(d[0] != 7.0f && d[0] != 1.0f && h[1] != 1.0f, "captured copies did not run at capture");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s));
    OK(cuStreamSynchronize(s));
    CHECK(d[0] == 7.0f && h[1] == 7.0f, "pinned copies ran at launch with the source as it was then (%g, %g)",
          (double)d[0], (double)h[1]);
    h[0] = 9.0f;
    OK(cuGraphLaunch(ge, s));
    OK(cuStreamSynchronize(s));
    CHECK(d[0] == 9.0f && h[1] == 9.0f, "and again at the next launch");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));
    OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)(h + 2), (CUdeviceptr)(uintptr_t)h, sizeof *h, s) ==
              CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "pinned to pinned host copy in capture");
    CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated by it");
    OK(cuMemFreeHost(h));
}

/* A captured copy from registered host memory, unregistered before the graph runs: fakecuda stops
 * the process, naming it (copies.c). Unregistered, the memory is still mapped: without the check
 * the copy would read it as if nothing had changed. Returns only if it did not stop. */
int selftest_child_pinned_unregistered(void)
{
    static float h[16];
    float *d = NULL;
    CUcontext c;
    CUstream s;
    CUgraph g;
    CUgraphExec ge;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuStreamCreate(&s, 0) ||
        cuMemAlloc((CUdeviceptr *)&d, sizeof h) || cuMemHostRegister(h, sizeof h, 0) ||
        cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) ||
        cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d, h, sizeof h, s) || cuStreamEndCapture(s, &g) ||
        cuGraphInstantiate(&ge, g, 0) || cuMemHostUnregister(h)) {
        fprintf(stderr, "pinned-unregistered: setup failed\n");
        return 1;
    }
    cuGraphLaunch(ge, s);
    cuStreamSynchronize(s);
    fprintf(stderr, "pinned-unregistered: the copy ran\n");
    return 0;
}

void selftest_events(struct selftest_main *m)
{
    CUstream s1 = m->s1, s2 = m->s2, s3 = m->s3;

    /* 8. events across streams */
    CUevent ev, never, t0, t1;
    OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&never, 0));
    OK(cuEventCreate(&t0, 0));
    OK(cuEventCreate(&t1, 0));
    OK(cuEventQuery(never));
    OK(cuStreamWaitEvent(s2, never, 0));
    OK(cuLaunchHostFunc(s1, host_slow_set, NULL));
    OK(cuEventRecord(ev, s1));
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY, "event pending");
    OK(cuStreamWaitEvent(s2, ev, 0));
    OK(cuLaunchHostFunc(s2, host_observe, NULL));
    atomic_store(&go_a, 1);
    OK(cuStreamSynchronize(s2));
    CHECK(flag_seen == 1, "s2 waited for s1's event");
    OK(cuEventSynchronize(ev));
    OK(cuEventRecord(t0, s3));
    OK(cuLaunchHostFunc(s3, host_sleep20, NULL));
    OK(cuEventRecord(t1, s3));
    OK(cuEventSynchronize(t1));
    float ms = 0;
    OK(cuEventElapsedTime(&ms, t0, t1));
    CHECK(ms >= 19.0f && ms < 2000.0f, "elapsed %.3f ms", (double)ms);
    CHECK(cuEventElapsedTime(&ms, ev, t1) == CUDA_ERROR_INVALID_HANDLE, "timing disabled");
    m->ev = ev;
    m->never = never;
    m->t0 = t0;
    m->t1 = t1;
}

void selftest_capture(struct selftest_main *m)
{
    CUstream s1 = m->s1;
    CUfunction fdouble = m->fdouble;

    /* 9. capture: a captured launch runs only when the graph is launched */
    CUstreamCaptureStatus cs;
    CUgraph g;
    CUgraphExec ge;
    float *d = selftest_managed_filled(PAGE, 1.0f);
    size_t nd = PAGE / sizeof(float);
    void *args_d[] = { &d, &nd };
    CHECK(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "legacy stream cannot capture");
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuStreamIsCapturing(s1, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "capturing");
    uint64_t ran = selftest_stats().kernels_run;
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_d, NULL));
    cuuint64_t cid = 0;
    CUgraph cg = NULL;
    const CUgraphNode *deps = NULL;
    size_t ndeps = 0;
    OK(cuStreamGetCaptureInfo(s1, &cs, &cid, &cg, &deps, NULL, &ndeps));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && cg && ndeps == 1, "capture info");
    OK(cuStreamEndCapture(s1, &g));
    OK(cuStreamIsCapturing(s1, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "capture ended");
    OK(cuCtxSynchronize());
    CHECK(selftest_stats().kernels_run == ran && d[0] == 1.0f, "captured launch did not run");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s1));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_all_equal(d, nd, 4.0f), "graph launched twice (d[0]=%g)", (double)d[0]);
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));
    m->d = d;
}

void selftest_capture_join(struct selftest_main *m)
{
    CUstream s1 = m->s1, s2 = m->s2, s3 = m->s3;
    CUfunction fdouble = m->fdouble;
    CUevent ev = m->ev;
    float *d = m->d;
    size_t nd = PAGE / sizeof(float);
    void *args_d[] = { &d, &nd };
    CUmemLocation dloc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    CUstreamCaptureStatus cs;
    CUgraph g;
    CUgraphExec ge;

    /* 10. a stream joins a capture by waiting on an event recorded in it */
    CUevent fork_ev, join_ev;
    OK(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_d, NULL));
    OK(cuEventRecord(fork_ev, s1));
    OK(cuStreamWaitEvent(s2, fork_ev, 0));
    OK(cuStreamIsCapturing(s2, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "s2 joined the capture");
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s2, args_d, NULL));
    OK(cuEventRecord(join_ev, s2));
    OK(cuStreamWaitEvent(s1, join_ev, 0));
    OK(cuStreamEndCapture(s1, &g));
    OK(cuStreamIsCapturing(s2, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "s2 left the capture");
    OK(cuCtxSynchronize());
    CHECK(d[0] == 4.0f, "joined launches captured, not run");
    size_t nn = 0;
    OK(cuGraphGetNodes(g, NULL, &nn));
    CHECK(nn == 2, "graph has %zu nodes", nn);
    CUgraphNode nodes[2];
    CUDA_KERNEL_NODE_PARAMS kp;
    OK(cuGraphGetNodes(g, nodes, &nn));
    OK(cuGraphKernelNodeGetParams(nodes[1], &kp));
    const char *node_name = NULL, *launched_name = NULL;
    OK(cuFuncGetName(&node_name, kp.func));
    OK(cuFuncGetName(&launched_name, fdouble));
    CHECK(strcmp(node_name, launched_name) == 0 && *(float **)kp.kernelParams[0] == d, "kernel node params");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s3));
    OK(cuStreamSynchronize(s3));
    CHECK(selftest_all_equal(d, nd, 16.0f), "joined graph ran both kernels");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));
    /* a fork not joined back: the end is refused, and the capture is over for both streams */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(cuEventRecord(fork_ev, s1));
    OK(cuStreamWaitEvent(s2, fork_ev, 0));
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s2, args_d, NULL));
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED && g == NULL, "unjoined fork refused");
    OK(cuStreamIsCapturing(s1, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "unjoined capture over on its origin");
    OK(cuStreamIsCapturing(s2, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE, "unjoined capture over on its fork");
    OK(cuCtxSynchronize());
    CHECK(selftest_all_equal(d, nd, 16.0f), "the unjoined capture's launch did not run");
    /* an async memset and a device-to-device copy captured become memset and memcpy nodes that
     * run at each launch; a copy from host memory in a capture is refused and invalidates it */
    float three = 3.0f;
    unsigned three_bits;
    memcpy(&three_bits, &three, sizeof three_bits);
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(cuMemsetD32Async((CUdeviceptr)(uintptr_t)d, three_bits, nd / 2, s1));
    OK(cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)(d + nd / 2), (CUdeviceptr)(uintptr_t)d, nd / 2 * sizeof *d, s1));
    OK(cuStreamEndCapture(s1, &g));
    CUgraphNodeType types[2];
    OK(cuGraphGetNodes(g, nodes, &nn));
    OK(cuGraphNodeGetType(nodes[0], &types[0]));
    OK(cuGraphNodeGetType(nodes[1], &types[1]));
    CHECK(nn == 2 && types[0] == CU_GRAPH_NODE_TYPE_MEMSET && types[1] == CU_GRAPH_NODE_TYPE_MEMCPY,
          "captured memset and memcpy nodes");
    CHECK(selftest_all_equal(d, nd, 16.0f), "captured memset not run at capture");
    OK(cuGraphInstantiate(&ge, g, 0));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_all_equal(d, nd, 3.0f), "memset and memcpy nodes ran at launch");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(g));
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d, &three, sizeof three, s1) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "copy from pageable host memory in capture");
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated by it");
    captured_pinned_copies(s1, d);
    /* a prefetch into a capture invalidates it */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)d, PAGE, dloc, 0, s1) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "prefetch in capture");
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated capture");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL, "capture mode exchanged");
    /* potentially unsafe calls (cuEventQuery) under a capture: allowed in relaxed mode,
     * prohibited in global mode, which invalidates the capture */
    OK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cuEventQuery(ev));
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    CHECK(cuEventQuery(ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "event query in global mode");
    CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL,
          "capture invalidated by an unsafe call");
    OK(cuEventQuery(ev));
    OK(cuThreadExchangeStreamCaptureMode(&mode));
    m->fork_ev = fork_ev;
    m->join_ev = join_ev;
}

void selftest_graphs_by_hand(struct selftest_main *m)
{
    CUstream s1 = m->s1;
    CUfunction fdouble = m->fdouble;
    size_t nd = PAGE / sizeof(float), nn = 0;
    CUgraphExec ge;

    /* 10b. graphs built by hand: kernel nodes, a child graph (copied into its node),
     * instantiation with params, and an exec's kernel node or whole graph updated */
    float *e = selftest_managed_filled(PAGE, 1.0f), *e2 = selftest_managed_filled(PAGE, 1.0f);
    void *args_e[] = { &e, &nd }, *args_e2[] = { &e2, &nd };
    CUDA_KERNEL_NODE_PARAMS np = { .func = fdouble, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                   .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1, .kernelParams = args_e };
    CUgraph inner_graph, outer, got;
    CUgraphNode kn, kn_outer, cn;
    CUgraphNodeType nt;
    OK(cuGraphCreate(&inner_graph, 0));
    OK(cuGraphAddKernelNode(&kn, inner_graph, NULL, 0, &np));
    OK(cuGraphCreate(&outer, 0));
    OK(cuGraphAddKernelNode(&kn_outer, outer, NULL, 0, &np));
    OK(cuGraphAddChildGraphNode(&cn, outer, &kn_outer, 1, inner_graph));
    OK(cuGraphDestroy(inner_graph));
    OK(cuGraphNodeGetType(cn, &nt));
    OK(cuGraphChildGraphNodeGetGraph(cn, &got));
    OK(cuGraphGetNodes(got, NULL, &nn));
    CHECK(nt == CU_GRAPH_NODE_TYPE_GRAPH && nn == 1, "child graph node");
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = { .hUploadStream = s1 };
    OK(cuGraphInstantiateWithParams(&ge, outer, &ip));
    CHECK(ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS, "instantiate result");
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_all_equal(e, nd, 4.0f), "parent and child kernels ran");
    np.kernelParams = args_e2;
    OK(cuGraphExecKernelNodeSetParams(ge, kn_outer, &np));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_all_equal(e, nd, 8.0f) && selftest_all_equal(e2, nd, 2.0f), "exec kernel node set params");
    CUgraphExecUpdateResultInfo ui;
    OK(cuGraphCreate(&inner_graph, 0));
    OK(cuGraphAddKernelNode(&kn, inner_graph, NULL, 0, &np));
    CHECK(cuGraphExecUpdate(ge, inner_graph, &ui) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
              ui.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, "update with another topology");
    OK(cuGraphAddKernelNode(&kn, inner_graph, &kn, 1, &np));
    OK(cuGraphExecUpdate(ge, inner_graph, &ui));
    OK(cuGraphLaunch(ge, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(ui.result == CU_GRAPH_EXEC_UPDATE_SUCCESS && selftest_all_equal(e, nd, 8.0f) && selftest_all_equal(e2, nd, 8.0f),
          "exec update");
    OK(cuGraphExecDestroy(ge));
    OK(cuGraphDestroy(inner_graph));
    OK(cuGraphDestroy(outer));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)e));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)e2));
}
