/* real_dlsym.c: glibc's dlsym, found without going through pump's own (see
 * real_dlsym.h). The real dlsym comes from dlvsym, never from the public
 * dlsym (that would be pump's), and dlvsym is not interposed. Not
 * instrumented (CMakeLists.txt): sanitizer runtimes call dlsym, and so this,
 * while they start.
 */
#include <dlfcn.h>

#include "real_dlsym.h"

PUMP_HIDDEN pump_dlsym_fn pump_real_dlsym_ptr;

static void *dlsym_unavailable(void *handle, const char *name)
{
    (void)handle;
    (void)name;
    return NULL;
}

PUMP_HIDDEN pump_dlsym_fn pump_real_dlsym(void)
{
    pump_dlsym_fn fn = __atomic_load_n(&pump_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (PUMP_LIKELY(fn != NULL))
        return fn;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && fn == NULL; i++)
        fn = (pump_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (fn == NULL)
        fn = dlsym_unavailable;  /* never jump to NULL */
    __atomic_store_n(&pump_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    return fn;
}

PUMP_HIDDEN pump_dlsym_fn pump_libc_dlsym(void)
{
    static const char *const where[][2] = {
        {"libc.so.6", "GLIBC_2.34"}, {"libdl.so.2", "GLIBC_2.2.5"}, {"libdl.so.2", "GLIBC_2.17"}};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        void *lib = dlopen(where[i][0], RTLD_NOW | RTLD_NOLOAD);
        pump_dlsym_fn fn = lib != NULL ? (pump_dlsym_fn)dlvsym(lib, "dlsym", where[i][1]) : NULL;
        if (lib != NULL)
            dlclose(lib);
        if (fn != NULL)
            return fn;
    }
    return NULL;
}
