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

/* Records the kind the driver handed `handle` out as, and the module or library that did
 * (owner, a CUmodule or CUlibrary; NULL when not known, which keeps an owner noted before).
 * The latest answer wins: an address the driver reuses after an unload may come back as
 * the other kind. Lock-free. */
PUMP_HIDDEN void pump_handle_note(const void *handle, enum pump_handle_kind kind, const void *owner);

/* The kind last noted for `handle`, or PUMP_HANDLE_UNKNOWN. Lock-free, no driver call. */
PUMP_HIDDEN enum pump_handle_kind pump_handle_kind_of(const void *handle);

/* The module or library noted as handing `handle` out, or NULL. */
PUMP_HIDDEN const void *pump_handle_owner_of(const void *handle);

/* The kernel's name as the driver gives it, asked by the handle's kind (both ways for one of
 * unknown origin, as cuda.h lets a CUkernel stand for a CUfunction); "" where it gives none.
 * A driver call: never under a pump lock. */
PUMP_HIDDEN const char *pump_handle_name(CUfunction f);

/* owner is being unloaded: the kinds of its handles, and of those of no known owner, become
 * unknown (the driver may reuse their addresses). Lock-free; a pass over the table. */
PUMP_HIDDEN void pump_handles_forget(const void *owner);

#endif
