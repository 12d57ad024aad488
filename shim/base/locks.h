/* locks.h: every lock pump takes goes through these, so that the rule "no
 * pump lock held across a driver call" can be checked: each thread counts
 * the locks it holds, and libpump exports the count (pump_locks_held), which
 * fakecuda reads at every entry point and reports when it is not 0. A hold
 * that is not a mutex (a device's turn, residency_blocks.h) counts as one.
 * A wait for other threads' driver calls (a drain of pump's worker, a turn)
 * is made holding none, else every thread that wants the lock waits for the
 * GPU too: one made holding one is counted (pump_lock_waits_held), and
 * fakecuda reports that as well. The count costs one thread-local add per
 * lock and unlock.
 */
#ifndef PUMP_LOCKS_H
#define PUMP_LOCKS_H

#include <pthread.h>

#include "shim.h"

/* The pump locks the calling thread holds now. */
extern PUMP_HIDDEN _Thread_local unsigned int pump_lock_depth
    __attribute__((tls_model("initial-exec"))); /* preloaded: static TLS, no call per access */

/* Waits made holding a pump lock, in all threads (atomic). */
extern PUMP_HIDDEN unsigned int pump_lock_waits_bad;

static inline void pump_hold_begin(void)
{
    pump_lock_depth++;
}

static inline void pump_hold_end(void)
{
    pump_lock_depth--;
}

/* Before a wait for other threads' driver calls. */
static inline void pump_wait_for_calls(void)
{
    if (pump_lock_depth != 0)
        __atomic_fetch_add(&pump_lock_waits_bad, 1, __ATOMIC_RELAXED);
}

static inline void pump_mutex_lock(pthread_mutex_t *m)
{
    pthread_mutex_lock(m);
    pump_lock_depth++;
}

static inline bool pump_mutex_trylock(pthread_mutex_t *m)
{
    if (pthread_mutex_trylock(m) != 0)
        return false;
    pump_lock_depth++;
    return true;
}

static inline void pump_mutex_unlock(pthread_mutex_t *m)
{
    pump_lock_depth--;
    pthread_mutex_unlock(m);
}

static inline void pump_rwlock_rdlock(pthread_rwlock_t *l)
{
    pthread_rwlock_rdlock(l);
    pump_lock_depth++;
}

static inline void pump_rwlock_wrlock(pthread_rwlock_t *l)
{
    pthread_rwlock_wrlock(l);
    pump_lock_depth++;
}

static inline bool pump_rwlock_tryrdlock(pthread_rwlock_t *l)
{
    if (pthread_rwlock_tryrdlock(l) != 0)
        return false;
    pump_lock_depth++;
    return true;
}

static inline bool pump_rwlock_trywrlock(pthread_rwlock_t *l)
{
    if (pthread_rwlock_trywrlock(l) != 0)
        return false;
    pump_lock_depth++;
    return true;
}

static inline void pump_rwlock_unlock(pthread_rwlock_t *l)
{
    pump_lock_depth--;
    pthread_rwlock_unlock(l);
}

#endif
