/* log.c: the shim's voice. Off by default (PUMP_LOG=1 or 2 turns it on),
 * rate-limited when on, one write(2) per line so lines from threads and
 * processes never interleave, and no locks: it may run anywhere.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

/* At most this many lines per second; the rest are counted and reported. */
#define PUMP_LOG_LINES_PER_SECOND 20

static _Atomic int level_on; /* PUMP_LOG (pump_log_set_level) */
static _Atomic uint64_t window_second;
static _Atomic uint32_t window_lines;
static _Atomic uint32_t suppressed;

static void emit(const char *fmt, va_list ap)
{
    char line[512];
    int n = snprintf(line, sizeof line, "pump[%d]: ", (int)getpid());
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t written = write(STDERR_FILENO, line, len);
    (void)written;
}

static bool within_rate(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    uint64_t second = (uint64_t)now.tv_sec;
    uint64_t current = atomic_load_explicit(&window_second, memory_order_relaxed);
    if (second != current &&
        atomic_compare_exchange_strong_explicit(&window_second, &current, second, memory_order_relaxed,
                                                memory_order_relaxed)) {
        atomic_store_explicit(&window_lines, 0, memory_order_relaxed);
        uint32_t dropped = atomic_exchange_explicit(&suppressed, 0, memory_order_relaxed);
        if (dropped > 0)
            pump_notice("(%u log lines suppressed)", dropped);
    }
    if (atomic_fetch_add_explicit(&window_lines, 1, memory_order_relaxed) < PUMP_LOG_LINES_PER_SECOND)
        return true;
    atomic_fetch_add_explicit(&suppressed, 1, memory_order_relaxed);
    return false;
}

PUMP_HIDDEN void pump_log_set_level(int level)
{
    atomic_store_explicit(&level_on, level, memory_order_relaxed);
}

PUMP_HIDDEN int pump_log_level(void)
{
    return atomic_load_explicit(&level_on, memory_order_relaxed);
}

PUMP_HIDDEN void pump_log(int level, const char *fmt, ...)
{
    if (level > pump_log_level() || !within_rate())
        return;
    va_list ap;
    va_start(ap, fmt);
    emit(fmt, ap);
    va_end(ap);
}

PUMP_HIDDEN void pump_notice(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit(fmt, ap);
    va_end(ap);
}
