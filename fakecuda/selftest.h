/* selftest.h: what fakecuda's self-test files share: the check counters and macros; the main
 * sequence's state, topics (selftest_memory.c, selftest_launches.c, selftest_graphs.c) and
 * helpers; and the child modes (selftest_driver.c's and the others'), which selftest.c runs
 * each in a process of its own with the given knob in the environment. */
#ifndef SELFTEST_H
#define SELFTEST_H

#include <stdatomic.h>
#include <stdio.h>

#include "cuda_compat.h" /* 13.1's names with 13.0's cuda.h */
#include "fakecuda.h"

extern int passed, failed; /* selftest.c's */
#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (cond) passed++;                                              \
        else {                                                           \
            failed++;                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);         \
            fprintf(stderr, __VA_ARGS__);                                \
            fprintf(stderr, "\n");                                       \
        }                                                                \
    } while (0)
#define OK(call) CHECK((call) == CUDA_SUCCESS, "%s", #call)

/* The counters now (call after synchronizing). */
static inline struct fakecuda_stats selftest_stats(void)
{
    struct fakecuda_stats s;
    fakecuda_get_stats(&s);
    return s;
}

struct selftest_driver_mode {
    const char *name;
    const char *env;  /* NAME=value, or NULL */
    int (*run)(void); /* 0: every check passed */
};
extern const struct selftest_driver_mode selftest_driver_modes[]; /* ends with a NULL name */
/* The main sequence: selftest.c's main sets this up, runs the topics in order, and tears it
 * down; what a topic makes that a later one or the teardown uses is kept here. */
struct selftest_main {
    void *libcuda; /* dlopen'd libcuda.so.1 */
    CUdevice dev;
    CUfunction fdouble, frace, flayout, fnoop; /* the kernels "double", "race", "layout", "noop" */
    CUstream s1, s2, s3;                       /* non-blocking */
    float *a, *b, *c, *d;                      /* managed buffers, freed at the teardown */
    CUlibrary lib;
    CUevent ev, never, t0, t1, fork_ev, join_ev;
};
void selftest_managed(struct selftest_main *m);        /* selftest_memory.c */
void selftest_memory(struct selftest_main *m);         /* selftest_memory.c */
void selftest_launches(struct selftest_main *m);       /* selftest_launches.c */
void selftest_routing(struct selftest_main *m);        /* selftest_launches.c */
void selftest_events(struct selftest_main *m);         /* selftest_graphs.c */
void selftest_capture(struct selftest_main *m);        /* selftest_graphs.c */
void selftest_capture_join(struct selftest_main *m);   /* selftest_graphs.c */
void selftest_graphs_by_hand(struct selftest_main *m); /* selftest_graphs.c */
void selftest_clock(struct selftest_main *m);          /* selftest_clock.c */
/* Kernels and helpers of the main sequence (selftest.c's, k_race selftest_memory.c's). */
void selftest_k_double(void **params, const fakecuda_dims *d); /* doubles float[n] (p, n) */
void selftest_k_race(void **params, const fakecuda_dims *d);   /* k_double, once started says so */
float *selftest_managed_filled(size_t bytes, float v);          /* managed, host-written with v */
int selftest_all_equal(const float *f, size_t n, float v);
void selftest_wait_for(atomic_int *flag); /* until set, or 10 s: no timing luck */

int selftest_child_contexts(void);        /* selftest_contexts.c */
int selftest_child_default_streams(void); /* selftest_contexts.c */
int selftest_child_copies(void);         /* selftest_copies.c */
int selftest_child_pools(void);          /* selftest_pools.c */
int selftest_child_faults(void);                  /* selftest_faults.c */
int selftest_child_faults_prefetch_off(void);     /* selftest_faults.c */
int selftest_child_faults_min_faults(void);       /* selftest_faults.c */
int selftest_child_faults_threshold_50(void);     /* selftest_faults.c */
int selftest_child_faults_batch_one(void);        /* selftest_faults.c */
int selftest_child_faults_evict(void);            /* selftest_faults.c */
int selftest_child_read_mostly(void);             /* selftest_read_mostly.c */
int selftest_child_discard_fill_none(void);       /* selftest_memory.c */
int selftest_child_pool_prefetch(void);  /* selftest_pools.c */
int selftest_child_pool_prefetch_refuse_after(void);  /* selftest_pools.c */
int selftest_child_runtime(void);        /* selftest_runtime.c */
int selftest_child_context_work(void);   /* selftest_context_work.c */
/* Stops the process (SIGABRT): a graph's copy from host memory no longer page-locked
   (tests/test_fakecuda.py runs it; not one of the child modes that must pass). */
int selftest_child_pinned_unregistered(void); /* selftest_graphs.c */
int selftest_child_launch_uses(void);    /* selftest_launch_uses.c */
int selftest_child_dead_moves(void);     /* selftest_launch_uses.c */

#endif
