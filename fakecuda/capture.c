/* capture.c: why it exists: stream capture, apart from the streams and graphs it joins:
 * a capture begun on a stream turns the work launched into it (kernels, host functions, graph
 * launches) into nodes of a graph (graphs.c) instead of running it; streams join a capture by
 * waiting on an event recorded in it; capture status and info queries; the per-thread capture
 * mode and the potentially unsafe calls it prohibits. */
#include "fakecuda_internal.h"

#include <stdlib.h>

/* Which forks were joined back: each member stream (the origin first) keeps a vector clock,
 * the work it knows of each member's (its own counted at each node appended on it, others'
 * taken from the events it waits on). At the end every member's work must be known to the
 * origin, directly or through other members ("the capture sequence contains a fork that was
 * not joined to the primary stream": CUDA_ERROR_STREAM_CAPTURE_UNJOINED); members past
 * FC_CAPTURE_MEMBERS_MAX are not followed. */
typedef struct fc_capture {
    uint64_t id;
    CUstreamCaptureMode mode; /* given to cuStreamBeginCapture */
    pthread_t thread;         /* the thread that began it */
    struct CUstream_st *origin;
    struct CUgraph_st *graph;
    int invalidated;
    struct CUstream_st **members;
    size_t nmembers, cap;
    uint64_t clock[FC_CAPTURE_MEMBERS_MAX][FC_CAPTURE_MEMBERS_MAX]; /* [member][member] */
    CUgraphNode last;
    struct fc_capture *next;
} fc_capture;

/* Guards every stream's capture pointer, captures, capture graphs, events' capture ids. */
static pthread_mutex_t fc_capture_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_capture *fc_captures;
static uint64_t fc_capture_ids = 1;
static _Thread_local CUstreamCaptureMode fc_tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

int fc_stream_capturing(CUstream s) { return atomic_load_explicit(&s->capture, memory_order_acquire) != NULL; }

/* s's place among cap's members that are followed (FC_CAPTURE_MEMBERS_MAX: none). */
static size_t member_of(const fc_capture *cap, const struct CUstream_st *s)
{
    for (size_t i = 0; i < cap->nmembers && i < FC_CAPTURE_MEMBERS_MAX; i++)
        if (cap->members[i] == s) return i;
    return FC_CAPTURE_MEMBERS_MAX;
}

/* Appends a node to s's capture under fc_capture_mu: a CUresult or FC_NOT_CAPTURING. */
int fc_capture_append(CUstream s, CUgraphNode n)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    int r;
    if (!cap) r = FC_NOT_CAPTURING;
    else if (cap->invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (fc_graph_append(cap->graph, n) != 0) { n = NULL; r = CUDA_ERROR_OUT_OF_MEMORY; }
    else {
        size_t i = member_of(cap, s);
        if (i < FC_CAPTURE_MEMBERS_MAX) cap->clock[i][i]++;
        cap->last = n;
        n = NULL;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fc_capture_mu);
    fc_node_free(n);
    return r;
}

int fc_capture_add_kernel(CUstream s, fc_kdef *def, const fakecuda_dims *d, const void *args)
{
    struct CUgraphNode_st *n = fc_node_kernel(def, d, args);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    return fc_capture_append(s, n);
}

int fc_capture_add_host(CUstream s, CUhostFn fn, void *ud)
{
    struct CUgraphNode_st *n = fc_node_host(fn, ud);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    return fc_capture_append(s, n);
}

int fc_capture_add_copy(CUstream s, const fc_copy *c)
{
    struct CUgraphNode_st *n = fc_node_copy(c);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    return fc_capture_append(s, n);
}

void fc_capture_invalidate(CUstream s)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    if (cap) cap->invalidated = 1;
    pthread_mutex_unlock(&fc_capture_mu);
}

/* cuCtxRecordEvent and cuCtxWaitEvent (cuda.h): a context "has a stream in the capture mode":
 * the call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates "all the conflicting
 * captures", each capture a stream of ctx belongs to. 1 if there was one, else 0. */
int fc_capture_invalidate_ctx(CUcontext ctx)
{
    int found = 0;
    pthread_mutex_lock(&fc_capture_mu);
    for (fc_capture *c = fc_captures; c; c = c->next)
        for (size_t i = 0; i < c->nmembers; i++)
            if (c->members[i]->ctx == ctx) {
                c->invalidated = found = 1;
                break;
            }
    pthread_mutex_unlock(&fc_capture_mu);
    return found;
}

static fc_capture *capture_find(uint64_t id);

/* An event recorded outside every capture (cuCtxRecordEvent): its mark names none. */
void fc_capture_mark_clear(fc_capture_mark *mark)
{
    pthread_mutex_lock(&fc_capture_mu);
    mark->id = 0;
    pthread_mutex_unlock(&fc_capture_mu);
}

/* cuCtxWaitEvent (cuda.h): an event that "is part of an ongoing capture sequence" fails the call
 * with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates that capture. 1 if the event's last
 * record (mark) was in a capture still going on, else 0. */
int fc_capture_invalidate_mark(const fc_capture_mark *mark)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *c = mark->id ? capture_find(mark->id) : NULL;
    if (c) c->invalidated = 1;
    pthread_mutex_unlock(&fc_capture_mu);
    return c != NULL;
}

static int capture_join(fc_capture *cap, struct CUstream_st *s)
{
    if (cap->nmembers == cap->cap) {
        size_t nc = cap->cap ? cap->cap * 2 : 4;
        struct CUstream_st **v = realloc(cap->members, nc * sizeof *v);
        if (!v) return -1;
        cap->members = v;
        cap->cap = nc;
    }
    cap->members[cap->nmembers++] = s;
    atomic_store_explicit(&s->capture, cap, memory_order_release);
    return 0;
}

static fc_capture *capture_find(uint64_t id)
{
    for (fc_capture *c = fc_captures; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

int fc_capture_record(CUstream s, fc_capture_mark *mark)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    mark->id = cap ? cap->id : 0;
    size_t i = cap ? member_of(cap, s) : FC_CAPTURE_MEMBERS_MAX;
    for (size_t m = 0; m < FC_CAPTURE_MEMBERS_MAX; m++)
        mark->clock[m] = i < FC_CAPTURE_MEMBERS_MAX ? cap->clock[i][m] : 0;
    pthread_mutex_unlock(&fc_capture_mu);
    return cap != NULL;
}

/* Under fc_capture_mu: member s of cap learns what the event's recorder knew. */
static void clock_merge(fc_capture *cap, const struct CUstream_st *s, const fc_capture_mark *mark)
{
    size_t i = member_of(cap, s);
    for (size_t m = 0; i < FC_CAPTURE_MEMBERS_MAX && m < FC_CAPTURE_MEMBERS_MAX; m++)
        if (mark->clock[m] > cap->clock[i][m]) cap->clock[i][m] = mark->clock[m];
}

int fc_capture_wait_event(CUstream s, const fc_capture_mark *mark, CUresult *r)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *mine = atomic_load_explicit(&s->capture, memory_order_relaxed);
    fc_capture *theirs = mark->id ? capture_find(mark->id) : NULL;
    *r = CUDA_SUCCESS;
    int handled = 1;
    if (theirs) {
        if (!mine) *r = capture_join(theirs, s) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        else if (mine != theirs) *r = CUDA_ERROR_STREAM_CAPTURE_MERGE;
        if (*r == CUDA_SUCCESS) clock_merge(theirs, s, mark);
    } else if (!mine) {
        handled = 0;
    } /* a capturing stream waiting on an outside event: no dependency is recorded */
    pthread_mutex_unlock(&fc_capture_mu);
    return handled;
}

/* The legacy NULL stream cannot capture; the per-thread default stream can. */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, int ptsz)
{
    if (h == CU_STREAM_LEGACY || (!ptsz && h == NULL)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    fc_capture *cap = calloc(1, sizeof *cap);
    struct CUgraph_st *g = fc_graph_new();
    if (!cap || !g) {
        free(cap);
        if (g) fc_graph_free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cap->graph = g;
    cap->origin = s;
    cap->mode = mode;
    cap->thread = pthread_self();
    pthread_mutex_lock(&fc_capture_mu);
    if (atomic_load_explicit(&s->capture, memory_order_relaxed) || capture_join(cap, s) != 0) {
        pthread_mutex_unlock(&fc_capture_mu);
        free(cap->members);
        free(cap);
        fc_graph_free(g);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    cap->id = fc_capture_ids++;
    cap->next = fc_captures;
    fc_captures = cap;
    pthread_mutex_unlock(&fc_capture_mu);
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamBeginCapture, 10000, (CUstream hStream), begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, 0));
FC_DEF(cuStreamBeginCapture_ptsz, 10000, (CUstream hStream),
       begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, 1));
FC_DEF(cuStreamBeginCapture_v2, 10010, (CUstream hStream, CUstreamCaptureMode mode),
       begin_capture(hStream, mode, 0));
FC_DEF(cuStreamBeginCapture_v2_ptsz, 10010, (CUstream hStream, CUstreamCaptureMode mode),
       begin_capture(hStream, mode, 1));

/* Under fc_capture_mu: whether every member's work is known to the origin. */
static int joined_back(const fc_capture *cap)
{
    for (size_t m = 1; m < cap->nmembers && m < FC_CAPTURE_MEMBERS_MAX; m++)
        if (cap->clock[0][m] < cap->clock[m][m]) return 0;
    return 1;
}

/* Ends the capture for the origin and every joined stream. A fork not joined back ends it too,
 * without a graph (CUDA_ERROR_STREAM_CAPTURE_UNJOINED; whether the driver ends the capture there
 * or leaves it open is not documented: ended, a program's later launches on those streams run
 * instead of being captured, and one that ends again learns it is not capturing). */
static CUresult end_capture(CUstream h, CUgraph *phGraph)
{
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    if (!cap || cap->origin != s) {
        pthread_mutex_unlock(&fc_capture_mu);
        return cap ? CUDA_ERROR_STREAM_CAPTURE_UNMATCHED : CUDA_ERROR_ILLEGAL_STATE;
    }
    int unjoined = !joined_back(cap);
    for (size_t i = 0; i < cap->nmembers; i++)
        atomic_store_explicit(&cap->members[i]->capture, NULL, memory_order_release);
    for (fc_capture **pp = &fc_captures; *pp; pp = &(*pp)->next)
        if (*pp == cap) { *pp = cap->next; break; }
    pthread_mutex_unlock(&fc_capture_mu);
    struct CUgraph_st *g = cap->graph;
    int invalid = cap->invalidated;
    free(cap->members);
    free(cap);
    if (invalid || unjoined) {
        fc_graph_free(g);
        *phGraph = NULL;
        return invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    }
    *phGraph = g;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamEndCapture, 10000, (CUstream hStream, CUgraph *phGraph), end_capture(hStream, phGraph));
FC_DEF(cuStreamEndCapture_ptsz, 10000, (CUstream hStream, CUgraph *phGraph), end_capture(hStream, phGraph));

static CUresult capture_info(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps)
{
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_CAPTURE_QUERY, FAKECUDA_CAPTURE_QUERY_HOST_NS);
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    *st = !cap ? CU_STREAM_CAPTURE_STATUS_NONE
               : cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (cap) {
        if (id) *id = cap->id;
        if (graph) *graph = cap->graph;
        if (deps) *deps = cap->last ? &cap->last : NULL;
        if (edges) *edges = NULL;
        if (ndeps) *ndeps = cap->last ? 1 : 0;
    }
    pthread_mutex_unlock(&fc_capture_mu);
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamIsCapturing, 10000, (CUstream hStream, CUstreamCaptureStatus *captureStatus),
       capture_info(hStream, captureStatus, NULL, NULL, NULL, NULL, NULL));
FC_DEF(cuStreamIsCapturing_ptsz, 10000, (CUstream hStream, CUstreamCaptureStatus *captureStatus),
       capture_info(hStream, captureStatus, NULL, NULL, NULL, NULL, NULL));
FC_DEF(cuStreamGetCaptureInfo, 10010, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out),
       capture_info(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL));
FC_DEF(cuStreamGetCaptureInfo_ptsz, 10010, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out),
       capture_info(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL));
FC_DEF(cuStreamGetCaptureInfo_v2, 11030, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out, size_t *numDependencies_out),
       capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL, numDependencies_out));
FC_DEF(cuStreamGetCaptureInfo_v2_ptsz, 11030, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out, size_t *numDependencies_out),
       capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL, numDependencies_out));
FC_DEF(cuStreamGetCaptureInfo_v3, 12030, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
        const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),
       capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out));
FC_DEF(cuStreamGetCaptureInfo_v3_ptsz, 12030, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
        cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
        const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),
       capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out));

/* The rule cuThreadExchangeStreamCaptureMode's documentation (cuda.h) states: a thread in
 * global mode is prohibited from potentially unsafe API calls while it has a capture not
 * begun in relaxed mode, or while any other thread has one begun in global mode; in
 * thread-local mode only its own captures count; in relaxed mode none. A prohibited call
 * fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures that
 * prohibit it ("operation not permitted when stream is capturing", then
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at the end of the capture: cuEventQuery from
 * PyTorch's NCCL watchdog thread, pytorch/pytorch#104487, #104555, #148594). */
CUresult fc_capture_check_unsafe_call(void)
{
    CUstreamCaptureMode mode = fc_tls_capture_mode;
    if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    int prohibited = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&fc_capture_mu);
    for (fc_capture *c = fc_captures; c; c = c->next) {
        int own = pthread_equal(c->thread, self);
        if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            prohibited = 1;
        }
    }
    pthread_mutex_unlock(&fc_capture_mu);
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* The mode is kept per thread and exchanged (fc_capture_check_unsafe_call reads it). */
FC_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FC_ENTRY(cuThreadExchangeStreamCaptureMode, 10010);
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = fc_tls_capture_mode;
    fc_tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuThreadExchangeStreamCaptureMode);
