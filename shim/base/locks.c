/* locks.c: the count of pump locks each thread holds, and of waits made
 * holding one (locks.h), and their exports for the test driver. */
#include "locks.h"

PUMP_HIDDEN _Thread_local unsigned int pump_lock_depth __attribute__((tls_model("initial-exec")));

PUMP_HIDDEN unsigned int pump_lock_waits_bad;

/* Exported (exports.map): fakecuda asks them at every entry point. */
__attribute__((visibility("default"))) unsigned int pump_locks_held(void);
__attribute__((visibility("default"))) unsigned int pump_lock_waits_held(void);

__attribute__((visibility("default"))) unsigned int pump_locks_held(void)
{
    return pump_lock_depth;
}

__attribute__((visibility("default"))) unsigned int pump_lock_waits_held(void)
{
    return __atomic_load_n(&pump_lock_waits_bad, __ATOMIC_RELAXED);
}
