/* dlsym_misses.c: why it exists: libraries look driver entry points up with dlsym on
 * libcuda.so.1 as well as through cuGetProcAddress (cuDNN's libcudnn_graph asks dlsym for
 * cuCtxPushCurrent, cuLibraryLoadFromFile and cuStreamGetGreenCtx; cuBLAS for
 * cuKernelGetLibrary), and a name fakecuda does not define would leave no trace: the dynamic
 * linker answers NULL and fakecuda never hears of it. This is a library of its own,
 * libfakecuda_dlsym.so, which libcuda.so.1 names as a dependency (sources.cmake): a dlsym on
 * libcuda.so.1's handle searches libcuda.so.1 first, then its dependencies (ELF gABI, "Shared
 * Object Dependencies": the breadth-first order of the lookup scope), so what fakecuda defines is
 * found there and only a name it lacks reaches this library. Each driver name CUDA's headers
 * declare and fakecuda's cuGetProcAddress table does not name (fakecuda_driver_names.h, written by
 * sources.cmake) is defined here as a GNU indirect function whose resolver reports the lookup to
 * libcuda.so.1 (fakecuda_dlsym_missed: not_found's "dlsym" kind) and resolves to NULL. Kept out of
 * libcuda.so.1 itself so that its exports stay what it implements: a tool that checks every
 * export of a driver resolves (bench/gpu/probes/handle_kind.py) sees only those.
 *
 * What the caller sees is what a missing symbol gives it: a null pointer, and dlerror() naming the
 * symbol, which the resolver sets by a lookup that fails (glibc keeps "an error even if this call
 * did not cause it" from a recursive call, dlfcn/dlerror.c, since 2.34; with an older glibc no
 * name is defined here: dlerror() could not be set, and Python's ctypes crashes on a NULL
 * message, as it did on the first form of this, a weak indirect function in libcuda.so.1 itself,
 * answering without an error). A program linked against libcuda.so.1 that binds one of these
 * names gets the null pointer at load instead of an undefined symbol: it fails when it calls it,
 * as it would have failed to load. A name no header declares is not counted. The
 * resolver runs inside dlsym, under the dynamic linker's lock, which is recursive.
 *
 * The indirect functions are made in assembly (.type %gnu_indirect_function, GNU as), so that no
 * prototype has to be written for each name: what a caller does with the pointer is its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>

#include "fakecuda.h"

__attribute__((unused)) static void *missed(const char *name)
{
    fakecuda_dlsym_missed(name);
    char why[160];
    snprintf(why, sizeof why, "%s (fakecuda does not define it)", name);
    (void)dlsym(RTLD_DEFAULT, why); /* fails: dlerror() then says "...: undefined symbol: <name> (...)" */
    return NULL;
}

/* Before glibc 2.34 the caller would get a null pointer with dlerror() unset, on which Python's
 * ctypes crashes: no name is defined there, and nothing is counted. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
#define FC_DRIVER_NAME(name)                                                                        \
    __attribute__((used)) static void *fc_miss_##name(void) { return missed(#name); }              \
    __asm__(".globl " #name "\n\t.type " #name ", %gnu_indirect_function\n\t.set " #name ", fc_miss_" #name);
#include "fakecuda_driver_names.h"
#endif
