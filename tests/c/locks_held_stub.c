/* locks_held_stub.c: a stand-in for libpump's exports of shim/base/locks.h, so that
 * tests/test_driver_locks.py can show fakecuda's check reports what they say: every thread
 * always holds one pump lock (pump_locks_held), or, with LOCKS_STUB=waits, holds none but one
 * wait for other threads' driver calls was made holding one (pump_lock_waits_held). */
#include <stdlib.h>
#include <string.h>

unsigned int pump_locks_held(void);
unsigned int pump_lock_waits_held(void);

static int waits(void)
{
    const char *v = getenv("LOCKS_STUB");
    return v != NULL && strcmp(v, "waits") == 0;
}

unsigned int pump_locks_held(void)
{
    return waits() ? 0 : 1;
}

unsigned int pump_lock_waits_held(void)
{
    return waits() ? 1 : 0;
}
