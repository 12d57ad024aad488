/* procaddr.c: cuGetProcAddress, the way the CUDA runtime (since 11.3, static
 * or shared), cuda-python and PyTorch reach nearly every driver function.
 *
 * pump never decides which ABI variant a caller gets: the driver does, from
 * the requested CUDA version and flags (legacy or per-thread default stream).
 * pump then swaps in its hook for exactly the pointer the driver returned,
 * by pointer identity, so the hook has the ABI that was asked for. Pointers
 * pump does not know stay the driver's. Asked for cuGetProcAddress itself,
 * the driver returns the 4- or 5-argument variant, and so does pump.
 */
#include <string.h>

#include "captures.h"
#include "hooks_common.h"
#include "locks.h"

/* Says once per name (the first 64 names) that the driver's answer for it passes pump by. */
static void say_unmatched(const char *symbol)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  /* never across a driver call */
    static char said[64][64];
    static int count;
    bool first = true;
    pump_mutex_lock(&lock);
    for (int i = 0; i < count && first; i++)
        first = strncmp(said[i], symbol, sizeof said[i] - 1) != 0;
    if (first && count < 64)
        strncpy(said[count++], symbol, sizeof said[0] - 1);
    pump_mutex_unlock(&lock);
    if (first)
        pump_notice("cuGetProcAddress(\"%s\") answered with a function that is not libcuda's %s: pump cannot "
                    "put its hook there, so the program's calls through it pass pump by (a launch is not "
                    "prefetched, an allocation not counted). PUMP_LOG=2 lists the lookups pump answered",
                    symbol, symbol);
}

/* A pointer pump cannot match, for a name it hooks: a silent pass-through unless it is an
 * ABI variant pump leaves to the driver on purpose (cuMemAlloc's 32-bit form: an export of
 * libcuda's of another variant of the name). */
static void unmatched(const char *symbol, const void *fn)
{
    if (pump_captures_begin_name(symbol))
        pump_captures_untracked("cuGetProcAddress answered for a capture's beginning with a function pump does "
                                "not hook");
    int id = pump_hook_of_base(symbol);
    if (id < 0)
        return;
    if (pump_hook_is_launch(id))
        PUMP_COUNT(launch_lookups, 1);
    if (pump_driver_exports(symbol, fn)) {
        pump_log(2, "cuGetProcAddress(%s): a variant pump does not hook", symbol);
        return;
    }
    PUMP_COUNT(procaddr_unmatched, 1);
    say_unmatched(symbol);
}

static void substitute_hook(const char *symbol, void **pfn)
{
    if (*pfn == NULL)
        return;
    if (!pump_active()) {
        if (pump_captures_begin_name(symbol))
            pump_captures_untracked("cuGetProcAddress answered for a capture's beginning while pump stood aside");
        return;
    }
    for (int i = 0; i < PUMP_HOOK_COUNT; i++) {
        if (pump_real[i] == *pfn) {
            pump_log(2, "cuGetProcAddress(%s) -> pump's %s", symbol, pump_hooks[i].name);
            *pfn = pump_hooks[i].hook;
            PUMP_COUNT(procaddr_hooks, 1);
            if (pump_hook_is_launch(i))
                PUMP_COUNT(launch_lookups, 1);
            return;
        }
    }
    unmatched(symbol, *pfn);
}

CUresult pump_get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    PUMP_REAL_OR_RETURN(get_proc_address, real);
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn != NULL)
        substitute_hook(symbol, pfn);
    return r;
}

CUresult pump_get_proc_address_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status)
{
    PUMP_REAL_OR_RETURN(get_proc_address_v2, real);
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn != NULL)
        substitute_hook(symbol, pfn);
    return r;
}
