/* capture_count.c: pump asks the driver whether a launch's stream is being captured only
 * while a capture is open in the process (shim/base/captures.h): the count of fakecuda's capture
 * queries over four launches on a stream, in each phase (tests/test_capture_threads.py).
 *
 *   capture_count
 * Phases: before any capture; while another stream captures (a launch into it is captured);
 * after that capture ended; after an end the driver refused (on a stream that was not
 * capturing) while a capture is open, and after that one ended; after an end the driver refused
 * because a fork of the capture was not joined back (which ends the capture on fakecuda); after
 * a dlsym of a way to begin a capture that pump does not hook. One JSON line: the queries per
 * phase, what the refused ends returned, and a checksum.
 */
#include "cuda_api.h"

#define BYTES ((size_t)4 << 20)
#define LAUNCHES 4

static int (*entry_cost)(const char *, struct fakecuda_entry_cost *);
static CUfunction inc;

static uint64_t capture_queries(void)
{
    struct fakecuda_entry_cost c = {0};
    if (entry_cost("capture_query", &c) != 0)
        exit(3);
    return c.calls;
}

static void launch(CUstream stream, CUdeviceptr x)
{
    uint64_t n = BYTES / sizeof(float);
    void *params[] = {&x, &n};
    CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
}

/* The capture queries LAUNCHES launches on `stream` cost. */
static uint64_t launches(CUstream stream, CUdeviceptr x)
{
    uint64_t before = capture_queries();
    for (int i = 0; i < LAUNCHES; i++)
        launch(stream, x);
    return capture_queries() - before;
}

int main(void)
{
    if (cuda_api_load(&api, 0) != 0)
        return 4;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&entry_cost = driver != NULL ? dlsym(driver, "fakecuda_get_entry_cost") : NULL;
    if (entry_cost == NULL)
        return 3;
    cuda_api_start(&api);
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);
    CUstream stream, other, fork;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(api.stream_create(&other, CU_STREAM_NON_BLOCKING));
    CHECK(api.stream_create(&fork, CU_STREAM_NON_BLOCKING));
    CUdeviceptr x, captured;
    CHECK(api.mem_alloc_managed(&x, BYTES, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&captured, BYTES, CU_MEM_ATTACH_GLOBAL));

    uint64_t before = launches(stream, x);
    CHECK(api.stream_begin_capture(other, CU_STREAM_CAPTURE_MODE_GLOBAL));
    launch(other, captured);
    uint64_t during = launches(stream, x);
    CUgraph graph = NULL;
    CHECK(api.stream_end_capture(other, &graph));
    uint64_t after = launches(stream, x);

    CHECK(api.stream_begin_capture(other, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUgraph none = NULL;
    CUresult refused = api.stream_end_capture(stream, &none);  /* not capturing: nothing ends */
    uint64_t still_open = launches(stream, x);
    CHECK(api.stream_end_capture(other, &graph));
    uint64_t closed = launches(stream, x);

    CUevent forked;
    CHECK(api.event_create(&forked, CU_EVENT_DISABLE_TIMING));
    CHECK(api.stream_begin_capture(other, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(api.event_record(forked, other));
    CHECK(api.stream_wait_event(fork, forked, 0));
    launch(fork, captured);
    CUresult unjoined = api.stream_end_capture(other, &none);  /* the fork was not joined back */
    uint64_t after_unjoined = launches(stream, x);

    void *unknown = dlsym(driver, "cuStreamBeginCapture_v9");  /* a variant pump has no hook for */
    uint64_t untracked = launches(stream, x);

    CHECK(api.stream_synchronize(stream));
    api.host_touch((const void *)(uintptr_t)x, BYTES);
    float first = *(const float *)(uintptr_t)x;
    printf("{\"before\": %llu, \"during\": %llu, \"after\": %llu, \"refused_end\": %d, \"still_open\": %llu, "
           "\"closed\": %llu, \"unjoined_end\": %d, \"after_unjoined\": %llu, \"unknown_found\": %d, "
           "\"untracked\": %llu, \"x0\": %.1f}\n",
           (unsigned long long)before, (unsigned long long)during, (unsigned long long)after, (int)refused,
           (unsigned long long)still_open, (unsigned long long)closed, (int)unjoined,
           (unsigned long long)after_unjoined, unknown != NULL, (unsigned long long)untracked, first);
    return 0;
}
