/* streams.c: why it exists: streams that run their work in order on a worker thread each,
 * asynchronously to the host; the legacy and per-thread default streams and the legacy
 * stream's implicit synchronisation; a context's work as a whole (cuCtxRecordEvent,
 * cuCtxWaitEvent); host functions. The fences streams signal and wait for are events.c's.
 * Capture is in capture.c, graphs in graphs.c. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

/* ---- streams ---- */
static pthread_mutex_t fc_streams_mu = PTHREAD_MUTEX_INITIALIZER; /* list and refs */
static struct CUstream_st *fc_all_streams;
static pthread_mutex_t fc_default_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned long long fc_stream_ids = 1;

static void enqueue_fence(struct CUstream_st *s, int kind, fc_fence *f);

/* ---- a context's waits (cuCtxWaitEvent): fences each stream made in it later waits for ---- */
struct fc_ctx_wait { fc_fence *f; struct fc_ctx_wait *next; };

/* Under fc_streams_mu: ctx's waits not done yet, each referenced for the caller, in an array
 * (*n of them; NULL: none); the done ones are let go. */
static fc_fence **ctx_waits_pending(CUcontext ctx, size_t *n)
{
    size_t count = 0;
    for (struct fc_ctx_wait **pp = &ctx->waits; *pp;) {
        struct fc_ctx_wait *w = *pp;
        if (fc_fence_done(w->f, NULL)) {
            *pp = w->next;
            fc_fence_unref(w->f);
            free(w);
        } else {
            count++;
            pp = &w->next;
        }
    }
    fc_fence **v = count ? malloc(count * sizeof *v) : NULL;
    if (count && !v) {
        fprintf(stderr, "fakecuda: out of memory ordering a context's streams\n");
        abort();
    }
    *n = 0;
    for (struct fc_ctx_wait *w = ctx->waits; w && *n < count; w = w->next) {
        atomic_fetch_add(&w->f->refs, 1);
        v[(*n)++] = w->f;
    }
    return v;
}

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
    size_t nwaits;
    fc_fence **waits = ctx_waits_pending(c, &nwaits);
    pthread_mutex_unlock(&fc_streams_mu);
    for (size_t i = 0; i < nwaits; i++) enqueue_fence(s, FC_OP_WAIT, waits[i]);
    free(waits);
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
        fc_run_kernel(op->u.k.def, &op->u.k.dims, op->u.k.args, op->u.k.uses, op->u.k.nuses, s->device);
        break;
    case FC_OP_PREFETCH: fc_run_prefetch(op); break;
    case FC_OP_HOSTFN: op->u.h.fn(op->u.h.ud); break;
    case FC_OP_RECORD: fc_fence_signal(op->u.fence); fc_fence_unref(op->u.fence); break;
    case FC_OP_WAIT: fc_fence_wait(op->u.fence); fc_fence_unref(op->u.fence); break;
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
        if (!s->head) {
            while (!s->head && !s->destroyed) pthread_cond_wait(&s->cv_work, &s->mu);
            fc_start_no_earlier(fc_now_ns()); /* idle: the next op starts when it comes */
        }
        fc_op *op = s->head;
        if (!op) break; /* destroyed and drained */
        uint64_t floor_ns = s->floor_ns;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        fc_start_no_earlier(floor_ns);
        run_op(s, op);
        pthread_mutex_lock(&s->mu);
        if (--s->pending == 0) pthread_cond_broadcast(&s->cv_idle);
    }
    s->worker_running = 0;
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
    return NULL;
}

void fc_stream_floor(CUstream s, uint64_t t_ns)
{
    pthread_mutex_lock(&s->mu);
    if (s->floor_ns < t_ns) s->floor_ns = t_ns;
    pthread_mutex_unlock(&s->mu);
}

/* Work that reaches a stream after the stream went (cuStreamDestroy, or its context's
 * destruction or reset) was enqueued by a call that began before and whose handle went while
 * it ran: another thread ended the stream or its context under it. The driver frees the
 * stream there, and the call is undefined behaviour (a crash, or work lost); fakecuda stops
 * the process, naming the call, so that no test passes over it (issue 42, risk 2: pump's
 * worker calling the driver with a context's streams after the context went). */
static void check_alive(struct CUstream_st *s)
{
    if (s->magic == FC_MAGIC_STREAM) return;
    fprintf(stderr, "fakecuda: %s enqueued work on a stream that went while it ran (destroyed, or its context "
            "destroyed or reset, by another thread): undefined on the driver\n", fc_tls_call ? fc_tls_call : "a call");
    abort();
}

static void enqueue_raw(CUstream s, fc_op *first, fc_op *last, uint64_t n)
{
    last->next = NULL;
    pthread_mutex_lock(&s->mu);
    check_alive(s);
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

int fc_stream_busy(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    int busy = s->pending > 0;
    pthread_mutex_unlock(&s->mu);
    return busy;
}

/* `to`'s later work waits (on the device) for everything enqueued on `from` so far. */
static void order_after(struct CUstream_st *to, struct CUstream_st *from)
{
    fc_fence *f = fc_fence_new();
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
        if (legacy && legacy != s && fc_stream_busy(legacy)) order_after(s, legacy);
        return;
    }
    size_t n;
    struct CUstream_st **v = streams_where(other_blocking, s, &n);
    for (size_t i = 0; v && i < n; i++) {
        if (fc_stream_busy(v[i])) order_after(s, v[i]);
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

/* An op on s that signals (FC_OP_RECORD) or waits for (FC_OP_WAIT) f, taking over the caller's
 * reference to f; raw: no legacy-stream ordering, which neither a record nor a wait needs. */
static void enqueue_fence(struct CUstream_st *s, int kind, fc_fence *f)
{
    fc_op *op = calloc(1, sizeof *op);
    if (!op) {
        fprintf(stderr, "fakecuda: out of memory ordering a context's streams\n");
        abort();
    }
    op->kind = kind;
    op->u.fence = f;
    enqueue_raw(s, op, op, 1);
}

/* A fence signalled once every stream of ctx has run what was enqueued on it before this call
 * (cuCtxRecordEvent): a stream of fakecuda's own, dropped at once, waits on the device for each
 * busy stream, then signals it; with none busy it is signalled now. NULL: out of memory. */
fc_fence *fc_ctx_fence(CUcontext ctx)
{
    fc_fence *f = fc_fence_new();
    if (!f) return NULL;
    size_t n;
    struct CUstream_st **v = streams_where(of_ctx, ctx, &n), *join = NULL;
    for (size_t i = 0; v && i < n; i++) {
        if (fc_stream_busy(v[i]) && (join || (join = stream_new(ctx, CU_STREAM_NON_BLOCKING, 0, 0)) != NULL))
            order_after(join, v[i]);
        stream_unref(v[i]);
    }
    free(v);
    if (!join) {
        fc_fence_signal(f);
        return f;
    }
    atomic_fetch_add(&f->refs, 1); /* the record's */
    enqueue_fence(join, FC_OP_RECORD, f);
    stream_drop(join);
    return f;
}

/* All later work of ctx waits for f (cuCtxWaitEvent): each stream of ctx now, and each made in
 * it later while f is not done (stream_new). A done fence only sets where their next work starts
 * on the modelled clock, as a stream's wait on a done event does (events.c). */
int fc_ctx_wait(CUcontext ctx, fc_fence *f)
{
    uint64_t t = 0;
    int done = fc_fence_done(f, &t);
    struct fc_ctx_wait *w = done ? NULL : malloc(sizeof *w);
    if (!done && !w) return -1;
    size_t n;
    struct CUstream_st **v = streams_where(of_ctx, ctx, &n);
    for (size_t i = 0; v && i < n; i++) {
        if (done) fc_stream_floor(v[i], t);
        else {
            atomic_fetch_add(&f->refs, 1);
            enqueue_fence(v[i], FC_OP_WAIT, f);
        }
        stream_unref(v[i]);
    }
    free(v);
    if (done) return 0;
    atomic_fetch_add(&f->refs, 1);
    w->f = f;
    pthread_mutex_lock(&fc_streams_mu);
    w->next = ctx->waits;
    ctx->waits = w;
    pthread_mutex_unlock(&fc_streams_mu);
    return 0;
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
    while (ctx->waits) { /* the context's later streams wait for nothing made before the reset */
        struct fc_ctx_wait *w = ctx->waits;
        ctx->waits = w->next;
        fc_fence_unref(w->f);
        free(w);
    }
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

static CUresult stream_synchronize(CUstream h)
{
    FC_STREAM_OR_RETURN(h);
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
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_STREAM_QUERY, FAKECUDA_QUERY_HOST_NS);
    pthread_mutex_lock(&s->mu);
    uint64_t pending = s->pending;
    pthread_mutex_unlock(&s->mu);
    return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
FC_DEF(cuStreamQuery, 2000, (CUstream hStream), stream_query(hStream));
FC_DEF(cuStreamQuery_ptsz, 7000, (CUstream hStream), stream_query(hStream));

/* ---- host functions ---- */
static CUresult launch_host_func(CUstream h, CUhostFn fn, void *ud, unsigned sync_mode)
{
    (void)sync_mode; /* the 13.1 blocking/non-blocking choice is not modelled */
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    if (fc_stream_capturing(s)) {
        int r = fc_capture_add_host(s, fn, ud);
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
