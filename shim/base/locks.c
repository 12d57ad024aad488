/* locks.c: the count of pump locks each thread holds (locks.h), and its
 * export for the test driver. */
#include "locks.h"

PUMP_HIDDEN _Thread_local unsigned int pump_lock_depth __attribute__((tls_model("initial-exec")));

/* Exported (exports.map): fakecuda asks it at every entry point. */
__attribute__((visibility("default"))) unsigned int pump_locks_held(void);

__attribute__((visibility("default"))) unsigned int pump_locks_held(void)
{
    return pump_lock_depth;
}
