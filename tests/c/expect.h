/* expect.h: the unit-test programs' (units, units_channel, units_tables, evict_order) checks:
 * EXPECT counts a condition passed or failed, naming a failed one with its line, and
 * expect_report prints "NAME: N passed, M failed" and gives the exit status (1 if any failed). */
#ifndef PUMP_TEST_EXPECT_H
#define PUMP_TEST_EXPECT_H
#include <stdio.h>

static int passed, failed;

#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (cond) {                                                             \
            passed++;                                                           \
        } else {                                                                \
            failed++;                                                           \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

__attribute__((unused)) static int expect_report(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, passed, failed);
    return failed != 0;
}

#endif
