/* rtld_next_a.c: a library that wraps `rtld_next_probe` and finds the next
 * definition with dlsym(RTLD_NEXT, ...), as interposers and sanitizers do.
 * glibc resolves RTLD_NEXT relative to the CALLER: a dlsym hook that forwards
 * with an ordinary call would make this find its own definition. */
#include <dlfcn.h>
#include <stddef.h>

int rtld_next_probe(void) { return 1; }

int rtld_next_from_a(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "rtld_next_probe");
    return next != NULL ? next() : -1;
}
