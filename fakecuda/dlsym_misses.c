/* dlsym_misses.c: why it exists: libraries look driver entry points up with dlsym on
 * libcuda.so.1 as well as through cuGetProcAddress (cuDNN's libcudnn_graph asks dlsym for
 * cuCtxPushCurrent, cuLibraryLoadFromFile and cuStreamGetGreenCtx; cuBLAS for
 * cuKernelGetLibrary), and a name fakecuda does not define would leave no trace: the dynamic
 * linker answers NULL and fakecuda never hears of it. So that what a client asked for and
 * fakecuda lacks is counted however it asked (not_found.c's "dlsym" kind, the real client's
 * ledger), every driver entry point name CUDA's headers declare (fakecuda_driver_names.h,
 * generated from them by sources.cmake) is defined here as a weak GNU indirect function whose
 * resolver counts the lookup by name and resolves to NULL. The names fakecuda models are strong
 * definitions in the other files and take precedence at link time (a weak definition yields to
 * a strong one of the same name, ELF gABI, "Symbol Table": STB_WEAK); whatever fakecuda adds
 * later leaves this list by itself.
 *
 * What the caller sees is what a missing symbol gives it, a null pointer; only dlerror() differs
 * (no error is set, since the symbol exists). A program linked against libcuda.so.1 that binds
 * one of these names gets the null pointer at load instead of an undefined symbol: it fails when
 * it calls it, as it would have failed to load. A name no header declares is not counted. The
 * resolver runs inside dlsym, under the dynamic linker's lock: it takes only not_found.c's mutex.
 *
 * GCC refuses a weak ifunc attribute ("weak cannot be defined ifunc"), so the symbol is made
 * in assembly: .weak, .type %gnu_indirect_function (GNU as, "Type" directive), and .set to the
 * resolver. */
#include "fakecuda_internal.h"

#define FC_DRIVER_NAME(name)                                                              \
    __attribute__((used)) static void *fc_miss_##name(void)                               \
    {                                                                                     \
        fc_not_found(FC_NF_DLSYM, #name);                                                 \
        return NULL;                                                                      \
    }                                                                                     \
    __asm__(".weak " #name "\n\t.type " #name ", %gnu_indirect_function\n\t.set " #name \
            ", fc_miss_" #name);
#include "fakecuda_driver_names.h"
