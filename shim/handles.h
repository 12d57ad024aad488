/* handles.h: where each kernel handle came from, so that its parameter layout is asked of
 * the call that takes its kind.
 *
 * cuLaunchKernel takes a CUfunction, and cuda.h lets a CUkernel (from cuLibraryGetKernel)
 * be cast to one for the launch and occupancy calls only; cuFuncGetParamInfo takes a
 * CUfunction, cuKernelGetParamInfo a CUkernel, and neither says what it does with the
 * other kind. The hooks on the calls that hand out handles (hooks_handles.c) note each
 * one's kind here; the layout cache asks by it (layouts.c says what it asks of a handle
 * of unknown origin).
 */
#ifndef PUMP_HANDLES_H
#define PUMP_HANDLES_H

#include "shim.h"

enum pump_handle_kind {
    PUMP_HANDLE_UNKNOWN,   /* made where pump did not see it (a private entry point, a graph node's copy) */
    PUMP_HANDLE_FUNCTION,  /* a CUfunction: cuModuleGetFunction, cuModuleEnumerateFunctions, cuKernelGetFunction */
    PUMP_HANDLE_KERNEL,    /* a CUkernel: cuLibraryGetKernel, cuLibraryEnumerateKernels, or one the driver took
                              as a CUkernel (cuKernelGetFunction's argument, a graph node's `kern`) */
};

/* Records the kind the driver handed `handle` out as (the latest answer wins: an address
 * the driver reuses after an unload may come back as the other kind). Lock-free. */
PUMP_HIDDEN void pump_handle_note(const void *handle, enum pump_handle_kind kind);

/* The kind last noted for `handle`, or PUMP_HANDLE_UNKNOWN. Lock-free, no driver call. */
PUMP_HIDDEN enum pump_handle_kind pump_handle_kind_of(const void *handle);

#endif
