/* locks_held_stub.c: a stand-in for libpump's pump_locks_held (shim/base/locks.h) that says the
 * calling thread always holds one pump lock, so that tests/test_driver_locks.py can show
 * fakecuda's check reports every driver call made under one. */
unsigned int pump_locks_held(void);

unsigned int pump_locks_held(void)
{
    return 1;
}
