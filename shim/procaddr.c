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
#include "hooks_common.h"

static void substitute_hook(const char *symbol, void **pfn)
{
    if (*pfn == NULL || !pump_active())
        return;
    for (int i = 0; i < PUMP_HOOK_COUNT; i++) {
        if (pump_real[i] == *pfn) {
            pump_log(2, "cuGetProcAddress(%s) -> pump's %s", symbol, pump_hooks[i].name);
            *pfn = pump_hooks[i].hook;
            PUMP_COUNT(procaddr_hooks, 1);
            return;
        }
    }
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
