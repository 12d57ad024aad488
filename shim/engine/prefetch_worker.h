/* prefetch_worker.h: pump's own thread per device, which makes the driver
 * calls of moves decided ahead (the daemon's plan, evictions after a kernel)
 * so that the launching thread pays for deciding, not for moving.
 *
 * A job is handed over (pump_worker_submit) and made by the device's worker
 * in the order handed over; a thread whose own calls must come after the jobs
 * handed over so far (pump_worker_drain) takes over those not begun, in their
 * order, and waits only for the one the worker is making then: the worker
 * never holds up the launching thread longer than one job's calls, and a job
 * is made once, by whichever thread takes it first. Without a worker (off,
 * not startable, in a forked child, at exit) a job is refused and the caller
 * makes its calls itself. No lock is held across a job's calls.
 */
#ifndef PUMP_PREFETCH_WORKER_H
#define PUMP_PREFETCH_WORKER_H

#include "shim.h"

struct pump_job {
    struct pump_job *next;
    /* Nothing has to follow it: a drain neither makes it nor waits for it, and
     * it is not counted pending. */
    bool unordered;
    /* Makes the job's driver calls, holding no pump lock. */
    void (*calls)(struct pump_job *job);
    /* Then settles what they made (may take pump's locks) and frees the job,
     * which is not touched after; `made` false: its calls were never made. */
    void (*finish)(struct pump_job *job, bool made);
};

/* Hands a job to `device`'s worker (started at its first job): false when
 * there is none (the caller then runs the job itself). */
PUMP_HIDDEN bool pump_worker_submit(int device, struct pump_job *job);
/* The same, for a job the caller drains at once: the worker is not woken for
 * it (woken, it would take the job, and the drain would wait for its calls
 * where it could have made them). */
PUMP_HIDDEN bool pump_worker_submit_to_drain(int device, struct pump_job *job);
/* The calls of every (ordered) job handed to `device`'s worker so far have
 * been made on return. Returns the jobs the caller made, to be finished with
 * pump_worker_finish (a finish takes the device locks). It may wait for
 * another thread's driver calls: the caller holds no pump lock or turn. */
PUMP_HIDDEN struct pump_job *pump_worker_drain(int device);
PUMP_HIDDEN void pump_worker_finish(struct pump_job *jobs);
/* The same as a drain, but the caller waits for the worker to make the jobs
 * rather than taking them over (policy off's emulation of a smaller card,
 * residency.c: the driver's evictions there are no thread's host time); at
 * exit, those the worker left the caller makes. */
PUMP_HIDDEN void pump_worker_wait(int device);
/* The launchers' lane of `device`: a job handed over there is made by a
 * drain of the lane, never by the worker, in the order handed over. The
 * launching threads' decisions whose kernels wait for their calls go there:
 * they keep their order among themselves without waiting for the worker's
 * jobs, which they need not follow (a decision that must follow those goes
 * to the worker's queue and drains it). False in a forked child or for an
 * unordered job; the caller then makes the job itself. */
PUMP_HIDDEN bool pump_launchers_submit(int device, struct pump_job *job);
PUMP_HIDDEN struct pump_job *pump_launchers_drain(int device);
/* Whether jobs handed to `device`'s worker may still be unmade (a hint,
 * read without a lock: a thread that must order its calls after them drains). */
PUMP_HIDDEN bool pump_worker_pending(int device);

/* A context is about to go: on return no worker or drain makes a job, and
 * every job queued so far (in the workers' queues and the launchers' lanes)
 * was made by the caller, in order, and finished. The caller holds no pump
 * lock. */
PUMP_HIDDEN void pump_worker_quiesce(void);
/* Exit: the workers stop taking jobs (those queued are made by whoever
 * drains, or never: they are hints), and a job under way is waited for, up
 * to 2 s. */
PUMP_HIDDEN void pump_worker_at_exit(void);
/* Fork: no queue is mid-change across it; the child has no worker, and the
 * jobs queued in the parent are dropped there (the child makes no calls of
 * the parent's). */
PUMP_HIDDEN void pump_worker_before_fork(void);
PUMP_HIDDEN void pump_worker_after_fork(bool child);

#endif
