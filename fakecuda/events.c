/* events.c: why it exists: events, apart from the streams they order: a record is a
 * refcounted fence (defined here) the stream signals when it reaches it (streams.c); queries,
 * synchronisation, elapsed time, a stream's wait on an event (which makes a stream join the
 * capture the event was recorded in: capture.c), and a context's record of and wait on one. */
#include "fakecuda_internal.h"

#include <stdlib.h>

/* ---- fences: what a record signals on its stream and a wait waits for (streams.c) ---- */
fc_fence *fc_fence_new(void)
{
    fc_fence *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    atomic_init(&f->refs, 1);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    return f;
}
void fc_fence_unref(fc_fence *f)
{
    if (f && atomic_fetch_sub(&f->refs, 1) == 1) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
        free(f);
    }
}
void fc_fence_signal(fc_fence *f)
{
    pthread_mutex_lock(&f->mu);
    f->done = 1;
    f->t_ns = fc_model_clock_ns();
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}
void fc_fence_wait(fc_fence *f)
{
    pthread_mutex_lock(&f->mu);
    while (!f->done) pthread_cond_wait(&f->cv, &f->mu);
    uint64_t t = f->t_ns;
    pthread_mutex_unlock(&f->mu);
    fc_start_no_earlier(t); /* what follows the wait comes after what it waited for */
}
int fc_fence_done(fc_fence *f, uint64_t *t)
{
    pthread_mutex_lock(&f->mu);
    int d = f->done;
    if (t) *t = f->t_ns;
    pthread_mutex_unlock(&f->mu);
    return d;
}

struct CUevent_st {
    fc_link link;
    uint32_t magic;
    unsigned flags;
    CUcontext ctx;       /* made in ctx's epoch: gone when ctx is destroyed or reset */
    unsigned epoch;
    pthread_mutex_t mu;
    fc_fence *fence;     /* latest record outside capture; NULL: never recorded (complete) */
    fc_capture_mark *capture; /* under capture.c's lock: its last record inside a capture (NULL: none yet) */
};

static int event_ok(CUevent e)
{
    return e && e->magic == FC_MAGIC_EVENT && atomic_load(&e->ctx->epoch) == e->epoch;
}

/* The event's latest fence, referenced (NULL if none). */
static fc_fence *event_fence(CUevent e)
{
    pthread_mutex_lock(&e->mu);
    fc_fence *f = e->fence;
    if (f) atomic_fetch_add(&f->refs, 1);
    pthread_mutex_unlock(&e->mu);
    return f;
}

static void event_set_fence(CUevent e, fc_fence *f)
{
    pthread_mutex_lock(&e->mu);
    fc_fence *old = e->fence;
    e->fence = f;
    pthread_mutex_unlock(&e->mu);
    fc_fence_unref(old);
}

FC_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FC_ENTRY(cuEventCreate, 2000);
    if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = fc_current_ctx();
    if (!fc_ctx_valid(c)) return fc_ctx_error(c);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FC_MAGIC_EVENT;
    e->flags = Flags;
    e->ctx = c;
    e->epoch = atomic_load(&c->epoch);
    pthread_mutex_init(&e->mu, NULL);
    fc_keep(&e->link);
    *phEvent = e;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuEventCreate);

FC_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    FC_ENTRY(cuEventDestroy_v2, 4000);
    if (!event_ok(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = FC_MAGIC_DEAD;
    fc_unkeep(&hEvent->link);
    fc_fence_unref(hEvent->fence); /* a pending record keeps its own reference */
    pthread_mutex_destroy(&hEvent->mu);
    free(hEvent->capture);
    free(hEvent);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuEventDestroy_v2);

/* Recorded in a capturing stream, the event belongs to that capture; otherwise a new
 * fence is signalled when the stream reaches the record. */
static CUresult event_record(CUevent e, CUstream h, unsigned flags)
{
    (void)flags; /* CU_EVENT_RECORD_EXTERNAL is not modelled */
    if (!event_ok(e)) return CUDA_ERROR_INVALID_HANDLE;
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_EVENT_RECORD, FAKECUDA_EVENT_RECORD_HOST_NS);
    if (!e->capture && !(e->capture = calloc(1, sizeof *e->capture))) return CUDA_ERROR_OUT_OF_MEMORY;
    if (fc_capture_record(s, e->capture)) {
        event_set_fence(e, NULL);
        return CUDA_SUCCESS;
    }
    fc_fence *f = fc_fence_new();
    fc_op *op = calloc(1, sizeof *op);
    if (!f || !op) { free(op); fc_fence_unref(f); return CUDA_ERROR_OUT_OF_MEMORY; }
    atomic_fetch_add(&f->refs, 1); /* one for the event, one for the op */
    event_set_fence(e, f);
    op->kind = FC_OP_RECORD;
    op->u.fence = f;
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}
FC_DEF(cuEventRecord, 2000, (CUevent hEvent, CUstream hStream), event_record(hEvent, hStream, 0));
FC_DEF(cuEventRecord_ptsz, 7000, (CUevent hEvent, CUstream hStream), event_record(hEvent, hStream, 0));
FC_DEF(cuEventRecordWithFlags, 11010, (CUevent hEvent, CUstream hStream, unsigned int flags),
       event_record(hEvent, hStream, flags));
FC_DEF(cuEventRecordWithFlags_ptsz, 11010, (CUevent hEvent, CUstream hStream, unsigned int flags),
       event_record(hEvent, hStream, flags));

FC_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    FC_ENTRY(cuEventQuery, 2000);
    if (!event_ok(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_EVENT_QUERY, FAKECUDA_QUERY_HOST_NS);
    CUresult unsafe = fc_capture_check_unsafe_call();
    if (unsafe != CUDA_SUCCESS) return unsafe;
    fc_fence *f = event_fence(hEvent);
    int done = !f || fc_fence_done(f, NULL);
    fc_fence_unref(f);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FC_ALIAS(cuEventQuery);

FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    FC_ENTRY(cuEventSynchronize, 2000);
    if (!event_ok(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    fc_fence *f = event_fence(hEvent);
    if (f) fc_fence_wait(f);
    fc_fence_unref(f);
    fc_cost(FC_E_SYNCHRONIZE, FAKECUDA_SYNC_HOST_NS);
    fc_pools_synchronized();
    return CUDA_SUCCESS;
}
FC_ALIAS(cuEventSynchronize);

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!event_ok(a) || !event_ok(b)) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    fc_fence *fa = event_fence(a), *fb = event_fence(b);
    uint64_t ta = 0, tb = 0;
    CUresult r = CUDA_SUCCESS;
    if (!fa || !fb) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!fc_fence_done(fa, &ta) || !fc_fence_done(fb, &tb)) r = CUDA_ERROR_NOT_READY;
    else *ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
    fc_fence_unref(fa);
    fc_fence_unref(fb);
    return r;
}
FC_DEF(cuEventElapsedTime, 2000, (float *pMilliseconds, CUevent hStart, CUevent hEnd),
       elapsed(pMilliseconds, hStart, hEnd));
FC_DEF(cuEventElapsedTime_v2, 12080, (float *pMilliseconds, CUevent hStart, CUevent hEnd),
       elapsed(pMilliseconds, hStart, hEnd));

/* Later work on the stream waits for the event's latest record as of this call. Waiting
 * on an event recorded in an active capture makes the stream join that capture. */
static CUresult stream_wait_event(CUstream h, CUevent e, unsigned flags)
{
    (void)flags;
    if (!event_ok(e)) return CUDA_ERROR_INVALID_HANDLE;
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_STREAM_WAIT_EVENT, FAKECUDA_STREAM_WAIT_EVENT_HOST_NS);
    CUresult r;
    static const fc_capture_mark none;
    if (fc_capture_wait_event(s, e->capture ? e->capture : &none, &r)) return r;
    fc_fence *f = event_fence(e);
    uint64_t t = 0;
    if (!f || fc_fence_done(f, &t)) {
        if (f) fc_stream_floor(s, t); /* done: nothing to wait for, but later work comes after it */
        fc_fence_unref(f);
        return CUDA_SUCCESS;
    }
    fc_op *op = calloc(1, sizeof *op);
    if (!op) { fc_fence_unref(f); return CUDA_ERROR_OUT_OF_MEMORY; }
    op->kind = FC_OP_WAIT;
    op->u.fence = f;
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamWaitEvent, 3020, (CUstream hStream, CUevent hEvent, unsigned int Flags),
       stream_wait_event(hStream, hEvent, Flags));
FC_DEF(cuStreamWaitEvent_ptsz, 7000, (CUstream hStream, CUevent hEvent, unsigned int Flags),
       stream_wait_event(hStream, hEvent, Flags));

/* cuda.h, cuCtxRecordEvent: "Captures in hEvent all the activities of the context hCtx at the time
 * of this call"; "hEvent and hCtx must be from the same CUDA context, otherwise
 * CUDA_ERROR_INVALID_HANDLE"; a context with a stream in capture mode fails it with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the conflicting captures. The record is a
 * fence signalled once every stream of the context ran what it held (streams.c, fc_ctx_fence).
 * No green context exists here, so none of their work is included. A NULL context is refused
 * (cuda.h names no current-context default). Charged as an event record. The CUDA 13.2 runtime
 * looks it up at start (cudaExecutionCtxRecordEvent). */
FC_EXPORT CUresult cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent)
{
    FC_ENTRY(cuCtxRecordEvent, 12050);
    if (!fc_ctx_valid(hCtx)) return fc_ctx_error(hCtx);
    if (!event_ok(hEvent) || hEvent->ctx != hCtx) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_EVENT_RECORD, FAKECUDA_EVENT_RECORD_HOST_NS);
    if (fc_capture_invalidate_ctx(hCtx)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    fc_fence *f = fc_ctx_fence(hCtx);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    if (hEvent->capture) fc_capture_mark_clear(hEvent->capture);
    event_set_fence(hEvent, f);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuCtxRecordEvent);

/* cuda.h, cuCtxWaitEvent: "Makes all future work submitted to context hCtx wait for all work
 * captured in hEvent", on the device; "hEvent may be from a different context or device". It fails
 * with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the capture, when the event is part of
 * an ongoing capture sequence or the context has a stream in capture mode (both invalidated when
 * both hold). An event never recorded is complete (as for cuStreamWaitEvent). Every stream of the
 * context waits, and each made in it later (streams.c, fc_ctx_wait). Charged as a stream's wait. */
FC_EXPORT CUresult cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent)
{
    FC_ENTRY(cuCtxWaitEvent, 12050);
    if (!fc_ctx_valid(hCtx)) return fc_ctx_error(hCtx);
    if (!event_ok(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    fc_cost(FC_E_STREAM_WAIT_EVENT, FAKECUDA_STREAM_WAIT_EVENT_HOST_NS);
    int captured = hEvent->capture && fc_capture_invalidate_mark(hEvent->capture);
    if (fc_capture_invalidate_ctx(hCtx) || captured) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    fc_fence *f = event_fence(hEvent);
    if (!f) return CUDA_SUCCESS;
    int r = fc_ctx_wait(hCtx, f);
    fc_fence_unref(f);
    return r ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
FC_ALIAS(cuCtxWaitEvent);
