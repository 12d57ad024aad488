/* selftest.h: what fakecuda's self-test files share: the check counters and macros, and the
 * child modes of selftest_driver.c, which selftest.c runs each in a process of its own with
 * the given knob in the environment. */
#ifndef SELFTEST_H
#define SELFTEST_H

#include <stdio.h>

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
int selftest_child_contexts(void);        /* selftest_contexts.c */
int selftest_child_default_streams(void); /* selftest_contexts.c */
int selftest_child_copies(void);         /* selftest_copies.c */
int selftest_child_pools(void);          /* selftest_pools.c */

#endif
