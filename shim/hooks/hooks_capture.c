/* hooks_capture.c: every way to begin and to end a stream capture, counted (captures.h), so
 * that a launch asks whether its stream is being captured only while a capture is open. They
 * count in pass-through too: the count must hold whenever pump may act again. A capture the
 * driver refused to begin leaves the count as it was; one it ended (its graph made, or
 * invalidated: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ends it, cuda.h's cuStreamEndCapture)
 * lowers it; so does one it refused (a fork not joined back) where the stream, capturing before
 * the call, is no longer (issue 42, risk 5). An end refused with the capture still open
 * (another thread's, in global mode) leaves it raised. */
#include "captures.h"
#include "hooks_common.h"
#include "prefetch.h"

static CUresult begun(CUresult r)
{
    if (r != CUDA_SUCCESS)
        pump_captures_ended();
    return r;
}

#define PUMP_CAPTURE_BEGIN_HOOK(id, params, args) \
    CUresult pump_##id params                     \
    {                                             \
        PUMP_REAL_OR_RETURN(id, real);            \
        pump_captures_begun();                    \
        return begun(real args);                  \
    }
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture, (CUstream stream), (stream))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_ptsz, (CUstream stream), (stream))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_to_graph,
                        (CUstream stream, CUgraph graph, const CUgraphNode *dependencies,
                         const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode),
                        (stream, graph, dependencies, edges, n, mode))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_to_graph_ptsz,
                        (CUstream stream, CUgraph graph, const CUgraphNode *dependencies,
                         const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode),
                        (stream, graph, dependencies, edges, n, mode))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_recapture_to_graph,
                        (CUstream stream, CUstreamCaptureMode mode, CUgraph graph,
                         CUgraphRecaptureCallback callback, void *user_data),
                        (stream, mode, graph, callback, user_data))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_recapture_to_graph_ptsz,
                        (CUstream stream, CUstreamCaptureMode mode, CUgraph graph,
                         CUgraphRecaptureCallback callback, void *user_data),
                        (stream, mode, graph, callback, user_data))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_to_cig, (CUstream stream, CUstreamCigCaptureParams *params),
                        (stream, params))
PUMP_CAPTURE_BEGIN_HOOK(stream_begin_capture_to_cig_ptsz, (CUstream stream, CUstreamCigCaptureParams *params),
                        (stream, params))

/* An end the driver refused (a fork not joined back, another thread's end in global mode): the
 * capture is over if the stream was capturing before the call and is not after it (whether the
 * driver ends a capture it refuses to end is not documented; a stream it cannot say about
 * counts as capturing, as at a launch). */
#define PUMP_CAPTURE_END_HOOK(id, params, args, per_thread)                            \
    CUresult pump_##id params                                                          \
    {                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                 \
        CUstream own = pump_stream_of(stream, per_thread);                             \
        bool was = pump_stream_capturing(own);                                         \
        CUresult r = real args;                                                        \
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||         \
            (was && !pump_stream_capturing(own)))                                      \
            pump_captures_ended();                                                     \
        return r;                                                                      \
    }
PUMP_CAPTURE_END_HOOK(stream_end_capture, (CUstream stream, CUgraph *graph), (stream, graph), false)
PUMP_CAPTURE_END_HOOK(stream_end_capture_ptsz, (CUstream stream, CUgraph *graph), (stream, graph), true)
PUMP_CAPTURE_END_HOOK(stream_end_capture_to_cig, (CUstream stream), (stream), false)
PUMP_CAPTURE_END_HOOK(stream_end_capture_to_cig_ptsz, (CUstream stream), (stream), true)
