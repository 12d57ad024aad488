/* naive_interposer.c: why it exists: a second LD_PRELOAD shim stacked after pump, of
 * the careless kind (tests/test_interposition.py). Its dlsym answers every driver name
 * from RTLD_DEFAULT, where pump's exports come first: asked by pump for the driver's
 * functions, it hands pump its own hooks. Exported as dlsym@GLIBC_2.34 (naive_interposer.map),
 * as nvshare exports its own, so that pump's dlvsym(RTLD_NEXT, "dlsym") finds it. Other names go to glibc's dlsym unchanged
 * (a plain call: RTLD_NEXT lookups through it are wrong, as in such shims). */
#include <dlfcn.h>
#include <stddef.h>

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn next_dlsym(void)
{
    static dlsym_fn fn;
    if (fn == NULL)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (fn == NULL)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return fn;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    dlsym_fn real = next_dlsym();
    if (real == NULL)
        return NULL;
    if (name[0] == 'c' && name[1] == 'u') {
        void *found = real(RTLD_DEFAULT, name);
        if (found != NULL)
            return found;
    }
    return real(handle, name);
}
