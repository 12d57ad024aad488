/* hooks_handles.c: the calls that hand out kernel handles, forwarded, and each handle's
 * kind noted (handles.h) so that its parameter layout is asked of the matching call.
 *
 * CUfunction: cuModuleGetFunction, cuModuleEnumerateFunctions (CUDA 12.4),
 * cuKernelGetFunction (whose argument the driver has just taken as a CUkernel).
 * CUkernel: cuLibraryGetKernel, cuLibraryEnumerateKernels (12.4). A module from
 * cuLibraryGetModule hands out its functions through cuModuleGetFunction (noted as that
 * module's: a CUfunction, whose kind left stale costs no more than an unknown one's, since
 * those are asked as CUfunctions first). The CUDA runtime reaches these through
 * cuGetProcAddress, as it does the launches. Noting takes no lock and calls nothing, so it
 * is done in every hook but pass-through's.
 *
 * cuModuleUnload and cuLibraryUnload free the handles the module or library handed out,
 * and the driver may give their addresses to the next kernels it loads (fakecuda does):
 * before the driver is called, so that no thread can be handed a reused address while pump
 * still holds the old kernel's layout or kind, every cached layout is marked to be asked
 * again and the owner's kinds are forgotten (layouts.h, handles.h); after it, once more,
 * for a lookup or launch the program raced with its own unload (a program bug, which then
 * costs pump no more than a layout asked twice).
 */
#include "handles.h"
#include "hooks_common.h"
#include "layouts.h"

static void note(const void *handle, enum pump_handle_kind kind, const void *owner)
{
    if (!atomic_load_explicit(&pump_passthrough, memory_order_relaxed))
        pump_handle_note(handle, kind, owner);
}

/* Done in pass-through too: cheap, and nothing cached outlives the handles it is about. */
static void forget(const void *owner)
{
    pump_layouts_forget();
    pump_handles_forget(owner);
}

CUresult pump_module_get_function(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    PUMP_REAL_OR_RETURN(module_get_function, real);
    CUresult r = real(hfunc, hmod, name);
    if (r == CUDA_SUCCESS && hfunc != NULL)
        note(*hfunc, PUMP_HANDLE_FUNCTION, hmod);
    return r;
}

CUresult pump_module_enumerate_functions(CUfunction *functions, unsigned int numFunctions, CUmodule mod)
{
    PUMP_REAL_OR_RETURN(module_enumerate_functions, real);
    CUresult r = real(functions, numFunctions, mod);
    /* cuda.h: "a maximum number of numFunctions" handles; callers size the array by
     * cuModuleGetFunctionCount. Entries past the module's would keep what the caller
     * had there: NULL is skipped, anything else noted costs one stale table word. */
    for (unsigned int i = 0; r == CUDA_SUCCESS && functions != NULL && i < numFunctions; i++)
        note(functions[i], PUMP_HANDLE_FUNCTION, mod);
    return r;
}

CUresult pump_kernel_get_function(CUfunction *pFunc, CUkernel kernel)
{
    PUMP_REAL_OR_RETURN(kernel_get_function, real);
    CUresult r = real(pFunc, kernel);
    if (r == CUDA_SUCCESS && pFunc != NULL) {
        const void *library = pump_handle_owner_of(kernel);  /* its function goes with it */
        note(kernel, PUMP_HANDLE_KERNEL, NULL);
        note(*pFunc, PUMP_HANDLE_FUNCTION, library);
    }
    return r;
}

CUresult pump_library_get_kernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    PUMP_REAL_OR_RETURN(library_get_kernel, real);
    CUresult r = real(pKernel, library, name);
    if (r == CUDA_SUCCESS && pKernel != NULL)
        note(*pKernel, PUMP_HANDLE_KERNEL, library);
    return r;
}

CUresult pump_library_enumerate_kernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib)
{
    PUMP_REAL_OR_RETURN(library_enumerate_kernels, real);
    CUresult r = real(kernels, numKernels, lib);
    for (unsigned int i = 0; r == CUDA_SUCCESS && kernels != NULL && i < numKernels; i++)
        note(kernels[i], PUMP_HANDLE_KERNEL, lib);
    return r;
}

CUresult pump_module_unload(CUmodule hmod)
{
    PUMP_REAL_OR_RETURN(module_unload, real);
    forget(hmod);
    CUresult r = real(hmod);
    forget(hmod);
    return r;
}

CUresult pump_library_unload(CUlibrary library)
{
    PUMP_REAL_OR_RETURN(library_unload, real);
    forget(library);
    CUresult r = real(library);
    forget(library);
    return r;
}
