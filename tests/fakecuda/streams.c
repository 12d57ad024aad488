/* streams.c: why it exists: streams that run their work in order on a worker thread each,
 * asynchronously to the host; events (a record is a refcounted fence the stream signals);
 * host functions; stream capture (launches into a capturing stream become graph nodes,
 * streams join a capture by waiting on an event recorded in it); graphs and their launch. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

/* ---- fences ---- */
static fc_fence *fence_new(void)
{
    fc_fence *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    atomic_init(&f->refs, 1);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    return f;
}
static void fence_unref(fc_fence *f)
{
    if (f && atomic_fetch_sub(&f->refs, 1) == 1) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
        free(f);
    }
}
static void fence_signal(fc_fence *f)
{
    pthread_mutex_lock(&f->mu);
    f->done = 1;
    f->t_ns = fc_now_ns();
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}
static void fence_wait(fc_fence *f)
{
    pthread_mutex_lock(&f->mu);
    while (!f->done) pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}
static int fence_done(fc_fence *f, uint64_t *t)
{
    pthread_mutex_lock(&f->mu);
    int d = f->done;
    if (t) *t = f->t_ns;
    pthread_mutex_unlock(&f->mu);
    return d;
}

/* ---- streams ---- */
static pthread_mutex_t fc_streams_mu = PTHREAD_MUTEX_INITIALIZER; /* list and refs */
static struct CUstream_st *fc_all_streams;
static pthread_mutex_t fc_default_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned long long fc_stream_ids = 1;

static struct CUstream_st *stream_new(CUcontext c, unsigned flags, int prio, int is_default)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->magic = FC_MAGIC_STREAM;
    s->ctx = c;
    s->device = c->device;
    s->flags = flags;
    s->priority = prio;
    s->is_default = is_default;
    s->id = atomic_fetch_add(&fc_stream_ids, 1);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_idle, NULL);
    s->refs = 1; /* the owner's */
    pthread_mutex_lock(&fc_streams_mu);
    s->next_all = fc_all_streams;
    fc_all_streams = s;
    pthread_mutex_unlock(&fc_streams_mu);
    return s;
}

static void stream_ref(struct CUstream_st *s)
{
    pthread_mutex_lock(&fc_streams_mu);
    s->refs++;
    pthread_mutex_unlock(&fc_streams_mu);
}

static void stream_unref(struct CUstream_st *s)
{
    pthread_mutex_lock(&fc_streams_mu);
    int left = --s->refs;
    pthread_mutex_unlock(&fc_streams_mu);
    if (left == 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv_work);
        pthread_cond_destroy(&s->cv_idle);
        free(s);
    }
}

CUstream fc_ctx_default_stream(CUcontext c)
{
    struct CUstream_st *s = atomic_load_explicit(&c->default_stream, memory_order_acquire);
    if (s) return s;
    pthread_mutex_lock(&fc_default_mu);
    s = atomic_load_explicit(&c->default_stream, memory_order_relaxed);
    if (!s && (s = stream_new(c, 0, 0, 1)) != NULL) {
        s->legacy = 1;
        atomic_store_explicit(&c->default_stream, s, memory_order_release);
    }
    pthread_mutex_unlock(&fc_default_mu);
    return s;
}

static void stream_drop(struct CUstream_st *s);

/* Per-thread default streams: one per thread and context, made on first use, dropped when the
 * thread exits (its pending work still runs) or made anew after the context is reset. A
 * thread keeps those of FC_PER_THREAD_CTXS contexts; one more replaces the oldest. */
#define FC_PER_THREAD_CTXS 8
typedef struct {
    struct { CUcontext ctx; unsigned epoch; struct CUstream_st *s; } e[FC_PER_THREAD_CTXS];
    unsigned next;
} fc_per_thread;
static pthread_key_t fc_per_thread_key;
static pthread_once_t fc_per_thread_once = PTHREAD_ONCE_INIT;

static void per_thread_free(void *p)
{
    fc_per_thread *t = p;
    for (int i = 0; i < FC_PER_THREAD_CTXS; i++)
        if (t->e[i].s) stream_drop(t->e[i].s);
    free(t);
}
static void per_thread_key_make(void) { pthread_key_create(&fc_per_thread_key, per_thread_free); }

static struct CUstream_st *per_thread_stream(CUcontext c)
{
    pthread_once(&fc_per_thread_once, per_thread_key_make);
    fc_per_thread *t = pthread_getspecific(fc_per_thread_key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t)) || pthread_setspecific(fc_per_thread_key, t) != 0) { free(t); return NULL; }
    }
    unsigned epoch = atomic_load(&c->epoch);
    int slot = -1;
    for (int i = 0; i < FC_PER_THREAD_CTXS && slot < 0; i++)
        if (t->e[i].ctx == c) slot = i;
    if (slot >= 0 && t->e[slot].epoch == epoch) return t->e[slot].s;
    if (slot < 0) slot = (int)(t->next++ % FC_PER_THREAD_CTXS);
    struct CUstream_st *s = stream_new(c, 0, 0, 1); /* blocking: it synchronizes with the legacy stream */
    if (!s) return NULL;
    if (t->e[slot].s) stream_drop(t->e[slot].s);
    t->e[slot].ctx = c;
    t->e[slot].epoch = epoch;
    t->e[slot].s = s;
    return s;
}

static int is_default_handle(CUstream h) { return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD; }

CUstream fc_resolve_stream(CUstream h, CUresult *err)
{
    if (is_default_handle(h)) {
        CUcontext c = fc_current_ctx();
        if (!fc_ctx_valid(c)) { *err = fc_ctx_error(c); return NULL; }
        int per_thread = h == CU_STREAM_PER_THREAD || (h == NULL && fc_tls_ptsz);
        CUstream s = per_thread ? per_thread_stream(c) : fc_ctx_default_stream(c);
        if (!s) *err = CUDA_ERROR_OUT_OF_MEMORY;
        return s;
    }
    if (h->magic != FC_MAGIC_STREAM) { *err = CUDA_ERROR_INVALID_HANDLE; return NULL; }
    return h;
}

static void run_op(struct CUstream_st *s, fc_op *op)
{
    switch (op->kind) {
    case FC_OP_KERNEL:
        fc_wait_until(op->u.k.not_before);
        fc_run_kernel(op->u.k.def, &op->u.k.dims, op->u.k.args, s->device);
        break;
    case FC_OP_PREFETCH: fc_run_prefetch(op); break;
    case FC_OP_HOSTFN: op->u.h.fn(op->u.h.ud); break;
    case FC_OP_RECORD: fence_signal(op->u.fence); fence_unref(op->u.fence); break;
    case FC_OP_WAIT: fence_wait(op->u.fence); fence_unref(op->u.fence); break;
    case FC_OP_FREE: fc_run_free(op); break;
    case FC_OP_COPY: fc_run_copy(op, s->device); break;
    }
    free(op);
}

static void *worker_main(void *arg)
{
    struct CUstream_st *s = arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* short modelled sleeps stay short */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv_work, &s->mu);
        fc_op *op = s->head;
        if (!op) break; /* destroyed and drained */
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_op(s, op);
        pthread_mutex_lock(&s->mu);
        if (--s->pending == 0) pthread_cond_broadcast(&s->cv_idle);
    }
    s->worker_running = 0;
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
    return NULL;
}

static void enqueue_raw(CUstream s, fc_op *first, fc_op *last, uint64_t n)
{
    last->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = first;
    else s->head = first;
    s->tail = last;
    s->pending += n;
    int start = !s->worker_running;
    if (start) s->worker_running = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (start) {
        stream_ref(s); /* the worker's */
        pthread_attr_t at;
        pthread_t t;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, worker_main, s) != 0) {
            fprintf(stderr, "fakecuda: cannot start a stream worker thread\n");
            abort();
        }
        pthread_attr_destroy(&at);
    }
}

/* The live streams for which where(s, arg) holds, each referenced (stream_unref each, then
 * free the array; NULL if it cannot be made); *n their count. */
static struct CUstream_st **streams_where(int (*where)(const struct CUstream_st *, const void *), const void *arg,
                                          size_t *n)
{
    size_t cap = 16;
    struct CUstream_st **v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v) return NULL;
    pthread_mutex_lock(&fc_streams_mu);
    for (struct CUstream_st *s = fc_all_streams; s; s = s->next_all) {
        if (!where(s, arg)) continue;
        if (*n == cap) {
            struct CUstream_st **nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        s->refs++;
        v[(*n)++] = s;
    }
    pthread_mutex_unlock(&fc_streams_mu);
    return v;
}

/* Another blocking stream of s's context. */
static int other_blocking(const struct CUstream_st *o, const void *s)
{
    const struct CUstream_st *self = s;
    return o != self && o->ctx == self->ctx && !(o->flags & CU_STREAM_NON_BLOCKING);
}

static int stream_busy(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    int busy = s->pending > 0;
    pthread_mutex_unlock(&s->mu);
    return busy;
}

/* `to`'s later work waits (on the device) for everything enqueued on `from` so far. */
static void order_after(struct CUstream_st *to, struct CUstream_st *from)
{
    fc_fence *f = fence_new();
    fc_op *rec = calloc(1, sizeof *rec), *wait = calloc(1, sizeof *wait);
    if (!f || !rec || !wait) {
        fprintf(stderr, "fakecuda: out of memory ordering the legacy stream\n");
        abort();
    }
    atomic_fetch_add(&f->refs, 1); /* one for each op */
    rec->kind = FC_OP_RECORD;
    rec->u.fence = f;
    wait->kind = FC_OP_WAIT;
    wait->u.fence = f;
    enqueue_raw(from, rec, rec, 1);
    enqueue_raw(to, wait, wait, 1);
}

/* The legacy default stream's implicit synchronisation ("Stream synchronization behavior",
 * CUDA Runtime API docs; cuda.h, cuStreamCreate's CU_STREAM_NON_BLOCKING): work on the
 * legacy stream waits for all earlier work of every blocking stream of its context (the
 * per-thread default streams included), and work on a blocking stream waits for all earlier
 * work on the legacy stream. Streams made with CU_STREAM_NON_BLOCKING take no part. */
static void legacy_sync(struct CUstream_st *s)
{
    if (s->flags & CU_STREAM_NON_BLOCKING) return;
    if (!s->legacy) {
        struct CUstream_st *legacy = atomic_load_explicit(&s->ctx->default_stream, memory_order_acquire);
        if (legacy && legacy != s && stream_busy(legacy)) order_after(s, legacy);
        return;
    }
    size_t n;
    struct CUstream_st **v = streams_where(other_blocking, s, &n);
    for (size_t i = 0; v && i < n; i++) {
        if (stream_busy(v[i])) order_after(s, v[i]);
        stream_unref(v[i]);
    }
    free(v);
}

void fc_enqueue_chain(CUstream s, fc_op *first, fc_op *last, uint64_t n)
{
    if (!first) return;
    legacy_sync(s);
    enqueue_raw(s, first, last, n);
}

void fc_enqueue(CUstream s, fc_op *op) { fc_enqueue_chain(s, op, op, 1); }

static void stream_sync(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->pending) pthread_cond_wait(&s->cv_idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void fc_stream_wait_idle(CUstream s) { stream_sync(s); }

static int of_ctx(const struct CUstream_st *s, const void *ctx) { return s->ctx == ctx; }
static int of_device(const struct CUstream_st *s, const void *device) { return s->device == *(const int *)device; }

/* Synchronizes every stream of ctx (or, with ctx NULL, of device). */
void fc_sync_ctx_streams(CUcontext ctx, int device)
{
    size_t n;
    struct CUstream_st **v = ctx ? streams_where(of_ctx, ctx, &n) : streams_where(of_device, &device, &n);
    for (size_t i = 0; v && i < n; i++) {
        stream_sync(v[i]);
        stream_unref(v[i]);
    }
    free(v);
}

/* Streams of destroyed or reset contexts: kept (never freed), so a later use of the handle
 * reads a dead stream and fails instead of reading freed memory. */
static struct CUstream_st *fc_gone_streams;

/* The driver destroys a context's streams and events with it ("Destroys and cleans up all
 * resources associated with the context ... CUstream, CUevent", cuda.h, cuCtxDestroy; a primary
 * context's reset "destroys and cleans up all resources", cuDevicePrimaryCtxReset). Using them
 * afterwards is undefined behaviour there; here it is CUDA_ERROR_INVALID_HANDLE ("a resource
 * handle passed to the API call was not valid", cuda.h), so a program that keeps them shows. */
void fc_ctx_invalidate(CUcontext ctx)
{
    fc_sync_ctx_streams(ctx, -1);
    pthread_mutex_lock(&fc_default_mu);
    atomic_store_explicit(&ctx->default_stream, NULL, memory_order_release);
    atomic_fetch_add(&ctx->epoch, 1); /* its events */
    pthread_mutex_unlock(&fc_default_mu);
    pthread_mutex_lock(&fc_streams_mu);
    for (struct CUstream_st **pp = &fc_all_streams; *pp;) {
        struct CUstream_st *s = *pp;
        if (s->ctx != ctx) { pp = &s->next_all; continue; }
        *pp = s->next_all;
        s->next_all = fc_gone_streams; /* its owner's reference stays: never freed */
        fc_gone_streams = s;
        pthread_mutex_lock(&s->mu);
        s->magic = FC_MAGIC_GONE;
        s->destroyed = 1; /* its worker ends */
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&fc_streams_mu);
}

static CUresult stream_create(CUstream *ph, unsigned flags, int prio)
{
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = fc_current_ctx();
    if (!fc_ctx_valid(c)) return fc_ctx_error(c);
    struct CUstream_st *s = stream_new(c, flags, prio, 0);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = s;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamCreate, 2000, (CUstream *phStream, unsigned int Flags), stream_create(phStream, Flags, 0));
FC_DEF(cuStreamCreateWithPriority, 5050, (CUstream *phStream, unsigned int flags, int priority),
       stream_create(phStream, flags, priority < -5 ? -5 : priority > 0 ? 0 : priority));

/* Pending work still runs; the worker frees the stream once drained. */
FC_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    FC_ENTRY(cuStreamDestroy_v2, 4000);
    if (is_default_handle(hStream) || hStream->magic != FC_MAGIC_STREAM || hStream->is_default)
        return CUDA_ERROR_INVALID_HANDLE;
    if (fc_stream_capturing(hStream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    stream_drop(hStream);
    return CUDA_SUCCESS;
}

/* Its owner lets go: pending work still runs; the worker frees it once drained. A stream
 * whose context went is left alone (kept on fc_gone_streams). */
static void stream_drop(struct CUstream_st *s)
{
    int found = 0;
    pthread_mutex_lock(&fc_streams_mu);
    for (struct CUstream_st **pp = &fc_all_streams; *pp; pp = &(*pp)->next_all)
        if (*pp == s) { *pp = s->next_all; found = 1; break; }
    pthread_mutex_unlock(&fc_streams_mu);
    if (!found) return;
    pthread_mutex_lock(&s->mu);
    s->magic = FC_MAGIC_DEAD;
    s->destroyed = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
}
FC_ALIAS(cuStreamDestroy_v2);

#define STREAM_OR_RETURN(h)                                  \
    CUresult err_ = CUDA_SUCCESS;                            \
    struct CUstream_st *s = fc_resolve_stream((h), &err_);   \
    if (!s) return err_

static CUresult stream_synchronize(CUstream h)
{
    STREAM_OR_RETURN(h);
    if (fc_stream_capturing(s)) { /* illegal during capture: invalidates it, as in the driver */
        fc_capture_invalidate(s);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    stream_sync(s);
    fc_cost(FC_E_SYNCHRONIZE, FAKECUDA_SYNC_HOST_NS);
    fc_pools_synchronized();
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamSynchronize, 2000, (CUstream hStream), stream_synchronize(hStream));
FC_DEF(cuStreamSynchronize_ptsz, 7000, (CUstream hStream), stream_synchronize(hStream));

static CUresult stream_query(CUstream h)
{
    STREAM_OR_RETURN(h);
    fc_cost(FC_E_STREAM_QUERY, FAKECUDA_QUERY_HOST_NS);
    pthread_mutex_lock(&s->mu);
    uint64_t pending = s->pending;
    pthread_mutex_unlock(&s->mu);
    return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
FC_DEF(cuStreamQuery, 2000, (CUstream hStream), stream_query(hStream));
FC_DEF(cuStreamQuery_ptsz, 7000, (CUstream hStream), stream_query(hStream));

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx, CUgreenCtx *pgreen)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *pctx = s->ctx;
    if (pgreen) *pgreen = NULL;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetCtx, 9020, (CUstream hStream, CUcontext *pctx), stream_get_ctx(hStream, pctx, NULL));
FC_DEF(cuStreamGetCtx_ptsz, 9020, (CUstream hStream, CUcontext *pctx), stream_get_ctx(hStream, pctx, NULL));
FC_DEF(cuStreamGetCtx_v2, 12050, (CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx),
       stream_get_ctx(hStream, pCtx, pGreenCtx));
FC_DEF(cuStreamGetCtx_v2_ptsz, 12050, (CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx),
       stream_get_ctx(hStream, pCtx, pGreenCtx));

static CUresult stream_get_device(CUstream h, CUdevice *dev)
{
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    *dev = s->device;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetDevice, 12080, (CUstream hStream, CUdevice *device), stream_get_device(hStream, device));
FC_DEF(cuStreamGetDevice_ptsz, 12080, (CUstream hStream, CUdevice *device), stream_get_device(hStream, device));

static CUresult stream_get_flags(CUstream h, unsigned *flags, int *prio, unsigned long long *id)
{
    if (!flags && !prio && !id) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    if (flags) *flags = s->flags;
    if (prio) *prio = s->priority;
    if (id) *id = s->id;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetFlags, 5050, (CUstream hStream, unsigned int *flags),
       stream_get_flags(hStream, flags, NULL, NULL));
FC_DEF(cuStreamGetFlags_ptsz, 7000, (CUstream hStream, unsigned int *flags),
       stream_get_flags(hStream, flags, NULL, NULL));
FC_DEF(cuStreamGetPriority, 5050, (CUstream hStream, int *priority),
       stream_get_flags(hStream, NULL, priority, NULL));
FC_DEF(cuStreamGetPriority_ptsz, 7000, (CUstream hStream, int *priority),
       stream_get_flags(hStream, NULL, priority, NULL));
FC_DEF(cuStreamGetId, 12000, (CUstream hStream, unsigned long long *streamId),
       stream_get_flags(hStream, NULL, NULL, streamId));
FC_DEF(cuStreamGetId_ptsz, 12000, (CUstream hStream, unsigned long long *streamId),
       stream_get_flags(hStream, NULL, NULL, streamId));

/* ---- graphs and capture ---- */
enum { FC_NODE_KERNEL, FC_NODE_HOST, FC_NODE_GRAPH };
struct CUgraph_st;
struct CUgraphNode_st {
    int type;
    fc_kdef *def;
    fakecuda_dims dims;
    void *args;    /* argument bytes, device layout */
    void **params; /* params[i] = args + offsets[i] (the node's kernelParams) */
    CUhostFn fn;
    void *ud;
    struct CUgraph_st *child; /* FC_NODE_GRAPH: the node's own copy of the child graph */
};
struct CUgraph_st { fc_link link; uint32_t magic; struct CUgraphNode_st **nodes; size_t n, cap; };
/* An executable graph: its graph's kernel and host nodes, child graphs flattened in
 * order; orig[i] is the graph node nodes[i] was copied from (what exec updates name). */
struct CUgraphExec_st {
    fc_link link;
    uint32_t magic;
    struct CUgraphNode_st **nodes;
    CUgraphNode *orig;
    size_t n, cap;
};
static void graph_free(struct CUgraph_st *g);
static struct CUgraph_st *graph_clone(const struct CUgraph_st *g);

typedef struct fc_capture {
    uint64_t id;
    CUstreamCaptureMode mode; /* given to cuStreamBeginCapture */
    pthread_t thread;         /* the thread that began it */
    struct CUstream_st *origin;
    struct CUgraph_st *graph;
    int invalidated;
    struct CUstream_st **members;
    size_t nmembers, cap;
    CUgraphNode last;
    struct fc_capture *next;
} fc_capture;

/* Guards every stream's capture pointer, captures, capture graphs, events' capture ids. */
static pthread_mutex_t fc_capture_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_capture *fc_captures;
static uint64_t fc_capture_ids = 1;
static _Thread_local CUstreamCaptureMode fc_tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

int fc_stream_capturing(CUstream s) { return atomic_load_explicit(&s->capture, memory_order_acquire) != NULL; }

static void node_free(struct CUgraphNode_st *n)
{
    if (!n) return;
    free(n->args);
    free(n->params);
    if (n->child) graph_free(n->child);
    free(n);
}

static struct CUgraphNode_st *node_kernel(fc_kdef *def, const fakecuda_dims *d, const void *args)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = FC_NODE_KERNEL;
    n->def = def;
    n->dims = *d;
    n->args = malloc(def->argsize ? def->argsize : 1);
    n->params = calloc(def->nparams ? def->nparams : 1, sizeof(void *));
    if (!n->args || !n->params) { node_free(n); return NULL; }
    if (def->argsize) memcpy(n->args, args, def->argsize);
    for (unsigned i = 0; i < def->nparams; i++) n->params[i] = (char *)n->args + def->offsets[i];
    return n;
}

static struct CUgraphNode_st *node_copy(const struct CUgraphNode_st *o)
{
    if (o->type == FC_NODE_KERNEL) return node_kernel(o->def, &o->dims, o->args);
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    *n = *o;
    if (o->type == FC_NODE_GRAPH && !(n->child = graph_clone(o->child))) {
        free(n);
        return NULL;
    }
    return n;
}

/* A kernel node from a kernel node's parameters (the arguments are copied). */
static CUresult node_from_params(const CUDA_KERNEL_NODE_PARAMS *p, struct CUgraphNode_st **out)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    fc_kdef *def = fc_kernel_def(p->func ? (const void *)p->func : (const void *)p->kern);
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY || !p->blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *args = malloc(def->argsize ? def->argsize : 1);
    if (!args) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fc_pack_args(def, p->kernelParams, p->extra, args);
    fakecuda_dims d = { { p->gridDimX, p->gridDimY, p->gridDimZ }, { p->blockDimX, p->blockDimY, p->blockDimZ },
                        p->sharedMemBytes };
    if (r == CUDA_SUCCESS && !(*out = node_kernel(def, &d, args))) r = CUDA_ERROR_OUT_OF_MEMORY;
    free(args);
    return r;
}

static int graph_append(struct CUgraph_st *g, struct CUgraphNode_st *n)
{
    if (!n) return -1;
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 8;
        struct CUgraphNode_st **v = realloc(g->nodes, nc * sizeof *v);
        if (!v) { node_free(n); return -1; }
        g->nodes = v;
        g->cap = nc;
    }
    g->nodes[g->n++] = n;
    return 0;
}

static struct CUgraph_st *graph_new(void)
{
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->magic = FC_MAGIC_GRAPH;
    fc_keep(&g->link);
    return g;
}

static void graph_free(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) node_free(g->nodes[i]);
    free(g->nodes);
    g->magic = FC_MAGIC_DEAD;
    fc_unkeep(&g->link);
    free(g);
}

static struct CUgraph_st *graph_clone(const struct CUgraph_st *g)
{
    struct CUgraph_st *c = graph_new();
    for (size_t i = 0; c && i < g->n; i++)
        if (graph_append(c, node_copy(g->nodes[i])) != 0) {
            graph_free(c);
            c = NULL;
        }
    return c;
}

/* Appends a node to s's capture under fc_capture_mu: a CUresult or FC_NOT_CAPTURING. */
static int capture_append(struct CUstream_st *s, struct CUgraphNode_st *n)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    int r;
    if (!cap) r = FC_NOT_CAPTURING;
    else if (cap->invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (graph_append(cap->graph, n) != 0) { n = NULL; r = CUDA_ERROR_OUT_OF_MEMORY; }
    else { cap->last = n; n = NULL; r = CUDA_SUCCESS; }
    pthread_mutex_unlock(&fc_capture_mu);
    node_free(n);
    return r;
}

int fc_capture_add_kernel(CUstream s, fc_kdef *def, const fakecuda_dims *d, const void *args)
{
    struct CUgraphNode_st *n = node_kernel(def, d, args);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    return capture_append(s, n);
}

void fc_capture_invalidate(CUstream s)
{
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    if (cap) cap->invalidated = 1;
    pthread_mutex_unlock(&fc_capture_mu);
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

/* The legacy NULL stream cannot capture; the per-thread default stream can. */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, int ptsz)
{
    if (h == CU_STREAM_LEGACY || (!ptsz && h == NULL)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    fc_capture *cap = calloc(1, sizeof *cap);
    struct CUgraph_st *g = graph_new();
    if (!cap || !g) {
        free(cap);
        if (g) graph_free(g);
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
        graph_free(g);
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

/* Ends the capture for the origin and every joined stream (whether the joined streams
 * were joined back into the origin is not checked). */
static CUresult end_capture(CUstream h, CUgraph *phGraph)
{
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    if (!cap || cap->origin != s) {
        pthread_mutex_unlock(&fc_capture_mu);
        return cap ? CUDA_ERROR_STREAM_CAPTURE_UNMATCHED : CUDA_ERROR_ILLEGAL_STATE;
    }
    for (size_t i = 0; i < cap->nmembers; i++)
        atomic_store_explicit(&cap->members[i]->capture, NULL, memory_order_release);
    for (fc_capture **pp = &fc_captures; *pp; pp = &(*pp)->next)
        if (*pp == cap) { *pp = cap->next; break; }
    pthread_mutex_unlock(&fc_capture_mu);
    struct CUgraph_st *g = cap->graph;
    int invalid = cap->invalidated;
    free(cap->members);
    free(cap);
    if (invalid) {
        graph_free(g);
        *phGraph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
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
    STREAM_OR_RETURN(h);
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
static CUresult capture_check_unsafe_call(void)
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

/* The mode is kept per thread and exchanged (capture_check_unsafe_call reads it). */
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

static void exec_free(struct CUgraphExec_st *e)
{
    for (size_t i = 0; i < e->n; i++) node_free(e->nodes[i]);
    free(e->nodes);
    free(e->orig);
    e->magic = FC_MAGIC_DEAD;
    fc_unkeep(&e->link);
    free(e);
}

/* Appends copies of g's kernel and host nodes to e, child graphs flattened in place. */
static int exec_flatten(struct CUgraphExec_st *e, const struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *o = g->nodes[i];
        if (o->type == FC_NODE_GRAPH) {
            if (exec_flatten(e, o->child) != 0) return -1;
            continue;
        }
        if (e->n == e->cap) {
            size_t nc = e->cap ? e->cap * 2 : 8;
            struct CUgraphNode_st **v = realloc(e->nodes, nc * sizeof *v);
            if (v) e->nodes = v;
            CUgraphNode *w = v ? realloc(e->orig, nc * sizeof *w) : NULL;
            if (!v || !w) return -1;
            e->orig = w;
            e->cap = nc;
        }
        if (!(e->nodes[e->n] = node_copy(o))) return -1;
        e->orig[e->n++] = o;
    }
    return 0;
}

static struct CUgraphExec_st *exec_of(const struct CUgraph_st *g)
{
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->magic = FC_MAGIC_EXEC;
    fc_keep(&e->link);
    if (exec_flatten(e, g) != 0) {
        exec_free(e);
        return NULL;
    }
    return e;
}

static CUresult instantiate(CUgraphExec *ph, CUgraph g, unsigned long long flags, CUgraphNode *err_node, char *log,
                            size_t log_size)
{
    (void)flags; /* auto-free, upload, device launch, priority: not modelled */
    if (err_node) *err_node = NULL;
    if (log && log_size) log[0] = '\0';
    if (!ph || !g || g->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = exec_of(g);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = e;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphInstantiateWithFlags, 11040, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),
       instantiate(phGraphExec, hGraph, flags, NULL, NULL, 0));
FC_DEF(cuGraphInstantiate, 10000, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
        char *logBuffer, size_t bufferSize),
       instantiate(phGraphExec, hGraph, 0, phErrorNode, logBuffer, bufferSize));
FC_DEF(cuGraphInstantiate_v2, 11000, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
        char *logBuffer, size_t bufferSize),
       instantiate(phGraphExec, hGraph, 0, phErrorNode, logBuffer, bufferSize));

static CUresult instantiate_with_params(CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = instantiate(ph, g, p->flags, &p->hErrNode_out, NULL, 0);
    p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}
FC_DEF(cuGraphInstantiateWithParams, 12000, (CUgraphExec *phGraphExec, CUgraph hGraph,
        CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
       instantiate_with_params(phGraphExec, hGraph, instantiateParams));
FC_DEF(cuGraphInstantiateWithParams_ptsz, 12000, (CUgraphExec *phGraphExec, CUgraph hGraph,
        CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
       instantiate_with_params(phGraphExec, hGraph, instantiateParams));

/* The graph's nodes run in capture order, as one block of ops on the stream (into a
 * capturing stream they are appended to that capture instead). */
static CUresult graph_launch(CUgraphExec e, CUstream h)
{
    if (!e || e->magic != FC_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    fc_cost(FC_E_GRAPH_LAUNCH, FAKECUDA_GRAPH_LAUNCH_HOST_NS);
    if (fc_stream_capturing(s)) {
        for (size_t i = 0; i < e->n; i++) {
            int r = capture_append(s, node_copy(e->nodes[i]));
            if (r != FC_NOT_CAPTURING && r != CUDA_SUCCESS) return (CUresult)r;
        }
        return CUDA_SUCCESS;
    }
    fc_op *first = NULL, *last = NULL;
    for (size_t i = 0; i < e->n; i++) {
        struct CUgraphNode_st *n = e->nodes[i];
        fc_op *op;
        if (n->type == FC_NODE_KERNEL) {
            op = fc_kernel_op(n->def, &n->dims, n->args);
        } else if ((op = calloc(1, sizeof *op))) {
            op->kind = FC_OP_HOSTFN;
            op->u.h.fn = n->fn;
            op->u.h.ud = n->ud;
        }
        if (!op) {
            while (first) { fc_op *nx = first->next; free(first); first = nx; }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (last) last->next = op;
        else first = op;
        last = op;
    }
    fc_enqueue_chain(s, first, last, e->n);
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphLaunch, 10000, (CUgraphExec hGraphExec, CUstream hStream), graph_launch(hGraphExec, hStream));
FC_DEF(cuGraphLaunch_ptsz, 10000, (CUgraphExec hGraphExec, CUstream hStream), graph_launch(hGraphExec, hStream));

FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    FC_ENTRY(cuGraphDestroy, 10000);
    if (!hGraph || hGraph->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    graph_free(hGraph);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphDestroy);

FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FC_ENTRY(cuGraphExecDestroy, 10000);
    if (!hGraphExec || hGraphExec->magic != FC_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    exec_free(hGraphExec);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphExecDestroy);

/* ---- graphs built by hand, and exec updates (nodes are a linear list: dependencies
 * are validated, not recorded) ---- */
FC_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    FC_ENTRY(cuGraphCreate, 10000);
    if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
    return (*phGraph = graph_new()) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FC_ALIAS(cuGraphCreate);

static CUresult add_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                         struct CUgraphNode_st *n)
{
    if (!ph || !g || g->magic != FC_MAGIC_GRAPH || (ndeps && !deps)) {
        node_free(n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (graph_append(g, n) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = n;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                const CUDA_KERNEL_NODE_PARAMS *p)
{
    struct CUgraphNode_st *n = NULL;
    CUresult r = node_from_params(p, &n);
    return r == CUDA_SUCCESS ? add_node(ph, g, deps, ndeps, n) : r;
}
FC_DEF(cuGraphAddKernelNode_v2, 12000, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
        size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams),
       add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));

/* The child graph is copied, as the driver clones it. */
static CUresult add_child_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
    if (!child || child->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n || !(n->child = graph_clone(child))) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->type = FC_NODE_GRAPH;
    return add_node(ph, g, deps, ndeps, n);
}
FC_DEF(cuGraphAddChildGraphNode, 10000, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
        size_t numDependencies, CUgraph childGraph),
       add_child_node(phGraphNode, hGraph, dependencies, numDependencies, childGraph));

FC_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    FC_ENTRY(cuGraphChildGraphNodeGetGraph, 10000);
    if (!hNode || !phGraph || hNode->type != FC_NODE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = hNode->child;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphChildGraphNodeGetGraph);

/* The exec's copy of graph node hNode (a kernel node) gets new parameters. */
static CUresult exec_kernel_node_set(CUgraphExec e, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!e || e->magic != FC_MAGIC_EXEC || !hNode) return CUDA_ERROR_INVALID_VALUE;
    size_t i = 0;
    while (i < e->n && !(e->orig[i] == hNode && e->nodes[i]->type == FC_NODE_KERNEL)) i++;
    if (i == e->n) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = NULL;
    CUresult r = node_from_params(p, &n);
    if (r != CUDA_SUCCESS) return r;
    node_free(e->nodes[i]);
    e->nodes[i] = n;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphExecKernelNodeSetParams_v2, 12000, (CUgraphExec hGraphExec, CUgraphNode hNode,
        const CUDA_KERNEL_NODE_PARAMS *nodeParams),
       exec_kernel_node_set(hGraphExec, hNode, nodeParams));

/* The exec takes g's parameters when g has the same nodes in the same order. */
static CUresult exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    if (!e || e->magic != FC_MAGIC_EXEC || !g || g->magic != FC_MAGIC_GRAPH || !info)
        return CUDA_ERROR_INVALID_VALUE;
    memset(info, 0, sizeof *info);
    struct CUgraphExec_st *fresh = exec_of(g);
    if (!fresh) return CUDA_ERROR_OUT_OF_MEMORY;
    int same = fresh->n == e->n;
    for (size_t i = 0; same && i < e->n; i++) same = fresh->nodes[i]->type == e->nodes[i]->type;
    if (!same) {
        exec_free(fresh);
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    for (size_t i = 0; i < e->n; i++) {
        struct CUgraphNode_st *old = e->nodes[i];
        e->nodes[i] = fresh->nodes[i];
        fresh->nodes[i] = old;
        e->orig[i] = fresh->orig[i];
    }
    exec_free(fresh);
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphExecUpdate_v2, 12000, (CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo),
       exec_update(hGraphExec, hGraph, resultInfo));

FC_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FC_ENTRY(cuGraphGetNodes, 10000);
    if (!hGraph || hGraph->magic != FC_MAGIC_GRAPH || !numNodes) return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < *numNodes; i++) nodes[i] = i < hGraph->n ? hGraph->nodes[i] : NULL;
    if (!nodes || *numNodes > hGraph->n) *numNodes = hGraph->n;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphGetNodes);

FC_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    FC_ENTRY(cuGraphNodeGetType, 10000);
    if (!hNode || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = hNode->type == FC_NODE_KERNEL ? CU_GRAPH_NODE_TYPE_KERNEL
            : hNode->type == FC_NODE_GRAPH ? CU_GRAPH_NODE_TYPE_GRAPH
                                           : CU_GRAPH_NODE_TYPE_HOST;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphNodeGetType);

FC_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    FC_ENTRY(cuGraphKernelNodeGetParams_v2, 12000);
    if (!hNode || !nodeParams || hNode->type != FC_NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    memset(nodeParams, 0, sizeof *nodeParams);
    nodeParams->func = &hNode->def->func;
    nodeParams->gridDimX = hNode->dims.grid[0];
    nodeParams->gridDimY = hNode->dims.grid[1];
    nodeParams->gridDimZ = hNode->dims.grid[2];
    nodeParams->blockDimX = hNode->dims.block[0];
    nodeParams->blockDimY = hNode->dims.block[1];
    nodeParams->blockDimZ = hNode->dims.block[2];
    nodeParams->sharedMemBytes = hNode->dims.shared_mem;
    nodeParams->kernelParams = hNode->params;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphKernelNodeGetParams_v2);

/* ---- host functions ---- */
static CUresult launch_host_func(CUstream h, CUhostFn fn, void *ud, unsigned sync_mode)
{
    (void)sync_mode; /* the 13.1 blocking/non-blocking choice is not modelled */
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    STREAM_OR_RETURN(h);
    if (fc_stream_capturing(s)) {
        struct CUgraphNode_st *n = calloc(1, sizeof *n);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        n->type = FC_NODE_HOST;
        n->fn = fn;
        n->ud = ud;
        int r = capture_append(s, n);
        if (r != FC_NOT_CAPTURING) return (CUresult)r;
    }
    fc_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FC_OP_HOSTFN;
    op->u.h.fn = fn;
    op->u.h.ud = ud;
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}
FC_DEF(cuLaunchHostFunc, 10000, (CUstream hStream, CUhostFn fn, void *userData),
       launch_host_func(hStream, fn, userData, 0));
FC_DEF(cuLaunchHostFunc_ptsz, 10000, (CUstream hStream, CUhostFn fn, void *userData),
       launch_host_func(hStream, fn, userData, 0));
FC_DEF(cuLaunchHostFunc_v2, 13010, (CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode),
       launch_host_func(hStream, fn, userData, syncMode));
FC_DEF(cuLaunchHostFunc_v2_ptsz, 13010, (CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode),
       launch_host_func(hStream, fn, userData, syncMode));

/* ---- events ---- */
struct CUevent_st {
    fc_link link;
    uint32_t magic;
    unsigned flags;
    CUcontext ctx;       /* made in ctx's epoch: gone when ctx is destroyed or reset */
    unsigned epoch;
    pthread_mutex_t mu;
    fc_fence *fence;     /* latest record outside capture; NULL: never recorded (complete) */
    uint64_t capture_id; /* under fc_capture_mu: set when last recorded inside a capture */
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
    fence_unref(old);
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
    fence_unref(hEvent->fence); /* a pending record keeps its own reference */
    pthread_mutex_destroy(&hEvent->mu);
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
    STREAM_OR_RETURN(h);
    fc_cost(FC_E_EVENT_RECORD, FAKECUDA_EVENT_RECORD_HOST_NS);
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *cap = atomic_load_explicit(&s->capture, memory_order_relaxed);
    e->capture_id = cap ? cap->id : 0;
    pthread_mutex_unlock(&fc_capture_mu);
    if (cap) {
        event_set_fence(e, NULL);
        return CUDA_SUCCESS;
    }
    fc_fence *f = fence_new();
    fc_op *op = calloc(1, sizeof *op);
    if (!f || !op) { free(op); fence_unref(f); return CUDA_ERROR_OUT_OF_MEMORY; }
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
    CUresult unsafe = capture_check_unsafe_call();
    if (unsafe != CUDA_SUCCESS) return unsafe;
    fc_fence *f = event_fence(hEvent);
    int done = !f || fence_done(f, NULL);
    fence_unref(f);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FC_ALIAS(cuEventQuery);

FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    FC_ENTRY(cuEventSynchronize, 2000);
    if (!event_ok(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    fc_fence *f = event_fence(hEvent);
    if (f) fence_wait(f);
    fence_unref(f);
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
    else if (!fence_done(fa, &ta) || !fence_done(fb, &tb)) r = CUDA_ERROR_NOT_READY;
    else *ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
    fence_unref(fa);
    fence_unref(fb);
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
    STREAM_OR_RETURN(h);
    fc_cost(FC_E_STREAM_WAIT_EVENT, FAKECUDA_STREAM_WAIT_EVENT_HOST_NS);
    pthread_mutex_lock(&fc_capture_mu);
    fc_capture *mine = atomic_load_explicit(&s->capture, memory_order_relaxed);
    fc_capture *theirs = e->capture_id ? capture_find(e->capture_id) : NULL;
    CUresult r = CUDA_SUCCESS;
    int handled = 1;
    if (theirs) {
        if (!mine) r = capture_join(theirs, s) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        else if (mine != theirs) r = CUDA_ERROR_STREAM_CAPTURE_MERGE;
    } else if (!mine) {
        handled = 0;
    } /* a capturing stream waiting on an outside event: no dependency is recorded */
    pthread_mutex_unlock(&fc_capture_mu);
    if (handled) return r;
    fc_fence *f = event_fence(e);
    if (!f || fence_done(f, NULL)) {
        fence_unref(f);
        return CUDA_SUCCESS;
    }
    fc_op *op = calloc(1, sizeof *op);
    if (!op) { fence_unref(f); return CUDA_ERROR_OUT_OF_MEMORY; }
    op->kind = FC_OP_WAIT;
    op->u.fence = f;
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamWaitEvent, 3020, (CUstream hStream, CUevent hEvent, unsigned int Flags),
       stream_wait_event(hStream, hEvent, Flags));
FC_DEF(cuStreamWaitEvent_ptsz, 7000, (CUstream hStream, CUevent hEvent, unsigned int Flags),
       stream_wait_event(hStream, hEvent, Flags));
