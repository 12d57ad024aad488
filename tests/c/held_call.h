/* held_call.h: a test's hand on a driver call that fakecuda holds (FAKECUDA_HOLD_PREFETCH=PATH:
 * the call makes PATH.entered and stays in the driver until PATH exists; fakecuda/prefetch.c),
 * shared by the programs that hold one (fork_turn.c, worker_stall.c). A watchdog lets the call
 * go after a while, so that a program whose thread waits for it still ends. */
#ifndef PUMP_TEST_HELD_CALL_H
#define PUMP_TEST_HELD_CALL_H

#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

struct held_call {
    const char *release;  /* PATH */
    char entered[4096];   /* PATH.entered */
    long most_ms;         /* the watchdog lets the call go after this long */
    atomic_bool released;
};

static inline void nap_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static inline void held_call_init(struct held_call *h, const char *release, long most_ms)
{
    h->release = release;
    snprintf(h->entered, sizeof h->entered, "%s.entered", release);
    h->most_ms = most_ms;
    atomic_store(&h->released, false);
}

/* Lets the call go (once more does nothing). */
static inline void held_call_let_go(struct held_call *h)
{
    atomic_store(&h->released, true);
    int fd = open(h->release, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
}

/* Whether a call entered the driver and is held, waiting up to 10 s for one. */
static inline bool held_call_entered(struct held_call *h)
{
    for (int i = 0; i < 1000 && access(h->entered, F_OK) != 0 && !atomic_load(&h->released); i++)
        nap_ms(10);
    return access(h->entered, F_OK) == 0 && !atomic_load(&h->released);
}

/* A thread's body: lets the call go after most_ms, unless it was let go before. */
static inline void *held_call_watchdog(void *arg)
{
    struct held_call *h = arg;
    for (long waited = 0; waited < h->most_ms && !atomic_load(&h->released); waited += 10)
        nap_ms(10);
    held_call_let_go(h);
    return NULL;
}

#endif
