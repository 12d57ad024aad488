/* procaddr_entry.h: ENTRY(name, version), a driver entry point reached the way the program
 * under test is built to: linked (the symbol itself), or with PUMP_TEST_PROCADDR through
 * cuGetProcAddress, as the CUDA runtime and frameworks reach it, so that both paths into
 * pump's hooks are tested by one program. */
#ifndef PUMP_TEST_PROCADDR_ENTRY_H
#define PUMP_TEST_PROCADDR_ENTRY_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

#ifdef PUMP_TEST_PROCADDR
static void *entry(const char *name, int version)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_cuGetProcAddress_v12000 gpa = lib != NULL ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    if (gpa == NULL || gpa(name, &fn, version, 0, &status) != CUDA_SUCCESS || fn == NULL) {
        fprintf(stderr, "error: cuGetProcAddress(%s) failed\n", name);
        exit(3);
    }
    return fn;
}
#define ENTRY(name, version) ((PFN_##name##_v##version)entry(#name, version))
#else
#define ENTRY(name, version) ((PFN_##name##_v##version)name)
#endif

#endif
