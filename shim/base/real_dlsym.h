/* real_dlsym.h: glibc's dlsym, found without going through pump's own.
 *
 * The bottom of the bootstrap: the dlsym interposer (dlsym.c) and the driver
 * loader (driver.c) both look symbols up through these, and these call
 * nothing of pump's, so the lookups read one way.
 */
#ifndef PUMP_REAL_DLSYM_H
#define PUMP_REAL_DLSYM_H

#include "shim.h"

typedef void *(*pump_dlsym_fn)(void *, const char *);

/* The next dlsym after pump's (dlvsym(RTLD_NEXT, ...): never pump's own, and
 * another interposer's when one comes after pump); never NULL (a stand-in
 * that finds nothing when there is none). */
PUMP_HIDDEN pump_dlsym_fn pump_real_dlsym(void);
/* Read by dlsym.c's trampoline: pump_real_dlsym()'s answer once it was asked. */
extern PUMP_HIDDEN pump_dlsym_fn pump_real_dlsym_ptr;
/* glibc's own dlsym, from libc's handle (libdl's before glibc 2.34): unlike
 * RTLD_NEXT's, never another interposer's; NULL when it cannot be found. */
PUMP_HIDDEN pump_dlsym_fn pump_libc_dlsym(void);

#endif
