/* hooks_capture.c: every way to begin and to end a stream capture, counted (captures.h), so
 * that a launch asks whether its stream is being captured only while a capture is open. They
 * count in pass-through too: the count must hold whenever pump may act again. A capture the
 * driver refused to begin leaves the count as it was; one it ended (its graph made, or
 * invalidated: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ends it, cuda.h's cuStreamEndCapture)
 * lowers it. An end the driver refused otherwise (another thread's capture, streams left
 * unjoined) leaves it raised: pump then asks at every launch, never too seldom. */
#include "captures.h"
#include "hooks_common.h"

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

#define PUMP_CAPTURE_END_HOOK(id, params, args)                                        \
    CUresult pump_##id params                                                          \
    {                                                                                  \
        PUMP_REAL_OR_RETURN(id, real);                                                 \
        CUresult r = real args;                                                        \
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)          \
            pump_captures_ended();                                                     \
        return r;                                                                      \
    }
PUMP_CAPTURE_END_HOOK(stream_end_capture, (CUstream stream, CUgraph *graph), (stream, graph))
PUMP_CAPTURE_END_HOOK(stream_end_capture_ptsz, (CUstream stream, CUgraph *graph), (stream, graph))
PUMP_CAPTURE_END_HOOK(stream_end_capture_to_cig, (CUstream stream), (stream))
PUMP_CAPTURE_END_HOOK(stream_end_capture_to_cig_ptsz, (CUstream stream), (stream))
