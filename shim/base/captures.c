/* captures.c: the count of the process's open stream captures (captures.h).
 *
 * A stream is being captured only between a capture begun on it, or on a stream whose
 * capture it joined (a wait on an event recorded in that capture, while it is open), and
 * that capture's end: with no capture open, none is. Every way to begin one is a driver
 * entry point pump hooks (hooks_capture.c), reached by direct linking to pump's exports,
 * by dlsym (dlsym.c) or by cuGetProcAddress (procaddr.c); those two say when they hand a
 * capture's beginning out unhooked, and a driver newer than pump's headers may have a way
 * pump does not know (driver.c). The CUDA runtime begins captures through
 * cuGetProcAddress's public entry points, not its private export tables: on fakecuda, whose
 * unmodelled private slots fail visibly (fakecuda/export_tables.c), PyTorch's CUDA
 * build captures and replays a training step (tests/test_real_client_allocators.py).
 *
 * A program that begins a capture on a stream while another thread launches on it races
 * pump's calls for that launch, as it did when pump asked the driver first: the capture may
 * begin between the answer and pump's calls. */
#include <string.h>

#include "captures.h"

static _Atomic int64_t open_captures;
static _Atomic bool untracked;

PUMP_HIDDEN void pump_captures_begun(void)
{
    atomic_fetch_add_explicit(&open_captures, 1, memory_order_seq_cst);
}

PUMP_HIDDEN void pump_captures_ended(void)
{
    if (atomic_fetch_sub_explicit(&open_captures, 1, memory_order_seq_cst) <= 0)
        pump_captures_untracked("a capture ended that pump did not see begin");
}

PUMP_HIDDEN void pump_captures_untracked(const char *why)
{
    if (!atomic_exchange_explicit(&untracked, true, memory_order_seq_cst))
        pump_log(1, "%s: every launch under a budget or a plan asks the driver whether its stream is being "
                 "captured from now on", why);
}

PUMP_HIDDEN bool pump_captures_none(void)
{
    return atomic_load_explicit(&open_captures, memory_order_seq_cst) == 0 &&
           !atomic_load_explicit(&untracked, memory_order_seq_cst);
}

PUMP_HIDDEN bool pump_captures_begin_name(const char *symbol)
{
    return strncmp(symbol, "cuStreamBeginCapture", 20) == 0 || strncmp(symbol, "cuStreamBeginRecapture", 22) == 0;
}
