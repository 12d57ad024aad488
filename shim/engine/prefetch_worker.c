/* prefetch_worker.c: pump's worker thread per device (see prefetch_worker.h).
 *
 * Each device's queue is guarded by its own lock, held only to link and
 * unlink jobs, never across a job's calls. The worker takes the oldest job
 * and makes it outside the lock (`busy`); a drain unlinks every job not begun,
 * waits for the one in progress and for any other drain (`draining`: the
 * worker takes no new job meanwhile, so no later job passes an earlier one),
 * then makes their calls itself, in order, and finishes them later, out of its
 * turn. A job is so made once, in the order it was handed over; what waits
 * for the worker is its calls, never its finish (which takes pump's locks).
 *
 * The thread starts at its device's first job, with every signal blocked (a
 * program's handlers never run on it). It never waits for the launching
 * thread, and the launching thread waits for it only in a drain, for one
 * job's calls. Each device also has a lane of the same kind that no thread
 * serves (the launchers'): its jobs are made by its drains, in order, so
 * that the launching threads' decisions keep their order among themselves
 * without waiting for the worker's. Before a context goes
 * (pump_worker_quiesce) every queue is left with no job under way or
 * queued, so none calls the driver with the context's streams and events
 * once they are destroyed (issue 42, risk 2). At
 * exit it takes no more jobs, and the exit waits for the job under way, a
 * while at most; across fork the queues are locked, and the child has no
 * worker and drops the parent's jobs (the child passes through: it makes no
 * driver call of pump's).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "locks.h"
#include "prefetch_worker.h"

struct worker {
    pthread_mutex_t lock;
    pthread_cond_t work;      /* a job was queued, or a drain ended */
    pthread_cond_t idle;      /* the job in progress, or a drain, ended */
    struct pump_job *head, *tail;
    bool started;             /* atomic (written under the lock): the thread runs (the lane is in use) */
    bool threadless;          /* the launchers' lane: no thread takes its jobs */
    bool broken;              /* the thread could not be started (said once) */
    bool busy;                /* the worker makes a job now */
    bool busy_ordered;        /* ... one a drain must wait for */
    uint32_t draining;        /* threads draining the queue now */
    uint32_t pending;         /* atomic: ordered jobs handed over and not yet made */
};

static struct worker workers[PUMP_DEVICES_MAX] = {
    [0 ... PUMP_DEVICES_MAX - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER},
};
/* The launchers' lanes: each a worker's queue without its thread. */
static struct worker launchers[PUMP_DEVICES_MAX] = {
    [0 ... PUMP_DEVICES_MAX - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
                                    .idle = PTHREAD_COND_INITIALIZER, .threadless = true},
};
/* The k-th queue: the workers', then the launchers' lanes. */
#define QUEUES (2 * PUMP_DEVICES_MAX)

static struct worker *queue(int k)
{
    return k < PUMP_DEVICES_MAX ? &workers[k] : &launchers[k - PUMP_DEVICES_MAX];
}

static bool stopping; /* atomic: the process exits */
static bool in_child; /* a forked child: no worker */

static void made(struct worker *w, const struct pump_job *job)
{
    if (!job->unordered)
        __atomic_fetch_sub(&w->pending, 1, __ATOMIC_RELEASE);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    pthread_setname_np(pthread_self(), "pump-worker");  /* as top, gdb and perf show it */
    pump_mutex_lock(&w->lock);
    for (;;) {
        while ((w->head == NULL || w->draining > 0) && !__atomic_load_n(&stopping, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&w->work, &w->lock);
        if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE))
            break;
        struct pump_job *job = w->head;
        w->head = job->next;
        if (w->head == NULL)
            w->tail = NULL;
        w->busy = true;
        w->busy_ordered = !job->unordered;
        pump_mutex_unlock(&w->lock);
        job->calls(job);
        pump_mutex_lock(&w->lock);
        made(w, job);
        w->busy = false;
        pthread_cond_broadcast(&w->idle);
        pump_mutex_unlock(&w->lock);
        job->finish(job, true);
        PUMP_COUNT(worker_jobs, 1);
        pump_mutex_lock(&w->lock);
    }
    w->busy = false;
    pthread_cond_broadcast(&w->idle);
    pump_mutex_unlock(&w->lock);
    return NULL;
}

/* Under w's lock. */
static bool start(struct worker *w)
{
    if (w->started || w->broken)
        return w->started;
    if (w->threadless) {
        __atomic_store_n(&w->started, true, __ATOMIC_RELEASE);
        return true;
    }
    pthread_attr_t attr;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    bool started = pthread_attr_init(&attr) == 0 && pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
                   pthread_create(&thread, &attr, work, w) == 0;
    __atomic_store_n(&w->started, started, __ATOMIC_RELEASE);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    w->broken = !w->started;
    if (w->broken)
        pump_log_once("cannot start pump's worker thread: the launching thread makes every prefetch and eviction");
    return w->started;
}

/* Queues job on w, waking its thread or not: false when w takes no job (the caller makes it). */
static bool submit(struct worker *w, struct pump_job *job, bool wake)
{
    pump_mutex_lock(&w->lock);
    bool taken = start(w);
    if (taken) {
        job->next = NULL;
        if (w->tail != NULL)
            w->tail->next = job;
        else
            w->head = job;
        w->tail = job;
        if (!job->unordered)
            __atomic_fetch_add(&w->pending, 1, __ATOMIC_RELAXED);
        if (wake)
            pthread_cond_signal(&w->work);
    }
    pump_mutex_unlock(&w->lock);
    return taken;
}

static bool worker_submit(int device, struct pump_job *job, bool wake)
{
    return device >= 0 && device < PUMP_DEVICES_MAX && pump_config.worker && !in_child &&
           !__atomic_load_n(&stopping, __ATOMIC_ACQUIRE) && submit(&workers[device], job, wake);
}

PUMP_HIDDEN bool pump_worker_submit(int device, struct pump_job *job)
{
    return worker_submit(device, job, true);
}

PUMP_HIDDEN bool pump_worker_submit_to_drain(int device, struct pump_job *job)
{
    return worker_submit(device, job, false);
}

PUMP_HIDDEN bool pump_launchers_submit(int device, struct pump_job *job)
{
    return device >= 0 && device < PUMP_DEVICES_MAX && !in_child && !job->unordered &&
           submit(&launchers[device], job, false);
}

PUMP_HIDDEN bool pump_worker_pending(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX && __atomic_load_n(&workers[device].pending, __ATOMIC_ACQUIRE) > 0;
}

/* Under w's lock, `taken` out of its queue: makes their calls, in order, as a drain (the
 * worker takes no job meanwhile); returns with the lock let go. */
static void make_taken(struct worker *w, struct pump_job *taken)
{
    w->draining++;
    pump_mutex_unlock(&w->lock);
    for (struct pump_job *job = taken; job != NULL; job = job->next) {
        job->calls(job);
        if (!w->threadless)
            PUMP_COUNT(worker_takeovers, 1);
        made(w, job);
    }
    pump_mutex_lock(&w->lock);
    w->draining--;
    pthread_cond_broadcast(&w->idle);
    pthread_cond_signal(&w->work);
    pump_mutex_unlock(&w->lock);
}

/* See pump_worker_drain. */
static struct pump_job *drain(struct worker *w)
{
    pump_wait_for_calls();
    pump_mutex_lock(&w->lock);
    bool wait = (w->busy && w->busy_ordered) || w->draining > 0;
    if (wait && !w->threadless)
        PUMP_COUNT(worker_waits, 1);
    while ((w->busy && w->busy_ordered) || w->draining > 0)
        pthread_cond_wait(&w->idle, &w->lock);
    /* The ordered jobs leave the queue, in their order; the others stay for the worker. */
    struct pump_job *taken = NULL, *taken_last = NULL, *queue = w->head;
    w->head = w->tail = NULL;
    for (struct pump_job *job = queue, *next; job != NULL; job = next) {
        next = job->next;
        job->next = NULL;
        struct pump_job **first = job->unordered ? &w->head : &taken, **last = job->unordered ? &w->tail : &taken_last;
        if (*last != NULL)
            (*last)->next = job;
        else
            *first = job;
        *last = job;
    }
    make_taken(w, taken);
    return taken;
}

PUMP_HIDDEN struct pump_job *pump_worker_drain(int device)
{
    return pump_worker_pending(device) ? drain(&workers[device]) : NULL;
}

PUMP_HIDDEN struct pump_job *pump_launchers_drain(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX && __atomic_load_n(&launchers[device].pending, __ATOMIC_ACQUIRE) > 0
               ? drain(&launchers[device])
               : NULL;
}

PUMP_HIDDEN void pump_worker_wait(int device)
{
    if (!pump_worker_pending(device))
        return;
    struct worker *w = &workers[device];
    pump_wait_for_calls();
    pump_mutex_lock(&w->lock);
    while (__atomic_load_n(&w->pending, __ATOMIC_ACQUIRE) > 0 && !__atomic_load_n(&stopping, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&w->idle, &w->lock);
    pump_mutex_unlock(&w->lock);
    pump_worker_finish(pump_worker_drain(device));  /* at exit: what the worker left */
}

PUMP_HIDDEN void pump_worker_finish(struct pump_job *jobs)
{
    for (struct pump_job *job = jobs, *next; job != NULL; job = next) {
        next = job->next;
        job->finish(job, true);
    }
}

PUMP_HIDDEN void pump_worker_quiesce(void)
{
    pump_wait_for_calls();
    for (int k = 0; k < QUEUES; k++) {
        struct worker *w = queue(k);
        if (!__atomic_load_n(&w->started, __ATOMIC_ACQUIRE))
            continue;
        pump_mutex_lock(&w->lock);
        while (w->busy || w->draining > 0)
            pthread_cond_wait(&w->idle, &w->lock);
        struct pump_job *taken = w->head;  /* unordered jobs too: each names a context */
        w->head = w->tail = NULL;
        make_taken(w, taken);
        pump_worker_finish(taken);
    }
}

/* A job under way at exit is waited for this long at most: its calls may follow the GPU (an
 * eviction waits for its copy), and a driver that hangs must not hang the exit. */
#define EXIT_WAIT_NS 2000000000ll

PUMP_HIDDEN void pump_worker_at_exit(void)
{
    __atomic_store_n(&stopping, true, __ATOMIC_RELEASE);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += EXIT_WAIT_NS / 1000000000ll;
    for (int d = 0; d < PUMP_DEVICES_MAX; d++) {
        struct worker *w = &workers[d];
        if (!__atomic_load_n(&w->started, __ATOMIC_ACQUIRE))
            continue;
        pump_mutex_lock(&w->lock);
        pthread_cond_broadcast(&w->work);  /* an idle worker sees it stops */
        int r = 0;
        while (w->busy && r != ETIMEDOUT)
            r = pthread_cond_timedwait(&w->idle, &w->lock, &until);
        pump_mutex_unlock(&w->lock);
        if (r == ETIMEDOUT)
            pump_log_once("exit: pump's worker was still in a driver call after 2 s: the process exits without it");
    }
}

/* Only the queues in use are locked (the others are made anew in the child): a fork holds
 * few locks at once. */
static bool fork_locked[QUEUES];

PUMP_HIDDEN void pump_worker_before_fork(void)
{
    for (int k = 0; k < QUEUES; k++) {
        fork_locked[k] = __atomic_load_n(&queue(k)->started, __ATOMIC_ACQUIRE);
        if (fork_locked[k])
            pump_mutex_lock(&queue(k)->lock);
    }
}

PUMP_HIDDEN void pump_worker_after_fork(bool child)
{
    for (int k = QUEUES - 1; k >= 0; k--) {
        struct worker *w = queue(k);
        bool locked = fork_locked[k];
        if (child) {
            for (struct pump_job *job = locked ? w->head : NULL, *next; job != NULL; job = next) {
                next = job->next;
                job->finish(job, false);
            }
            w->head = w->tail = NULL;
            w->started = w->busy = false;
            w->draining = 0;
            __atomic_store_n(&w->pending, 0, __ATOMIC_RELAXED);
            pthread_cond_init(&w->work, NULL);
            pthread_cond_init(&w->idle, NULL);
            if (!locked)
                pthread_mutex_init(&w->lock, NULL);  /* a thread the child lacks may have held it */
        }
        if (locked)
            pump_mutex_unlock(&w->lock);
    }
    in_child = in_child || child;
}
