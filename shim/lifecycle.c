/* lifecycle.c: what happens when libpump loads, when the process forks and
 * when it exits.
 *
 * Loading reads the configuration and nothing else (no driver, no threads;
 * the daemon channel's thread starts when CUDA is first used). Fork keeps
 * the range table consistent in the child and drops the parent's channel. Exit only marks the
 * record: no driver call and no lock, so a process that exits while another
 * thread is inside the driver never hangs on pump.
 */
#include <pthread.h>
#include <stdlib.h>

#include "channel.h"
#include "device_memory.h"
#include "pool_memory.h"
#include "prefetch_worker.h"
#include "ranges.h"
#include "residency.h"

static void at_exit(void)
{
    pump_worker_at_exit();
    pump_channel_at_exit();
    pump_stats_at_exit(pump_driver_was_used());
}

/* The range table's lock comes first: removing a range detaches its blocks. */
static void before_fork(void)
{
    pump_ranges_before_fork();
    pump_residency_before_fork();
    pump_worker_before_fork();
    pump_device_memory_before_fork();
    pump_pool_memory_before_fork();
}

static void parent_after_fork(void)
{
    pump_pool_memory_after_fork();
    pump_device_memory_after_fork();
    pump_worker_after_fork(false);
    pump_residency_after_fork();
    pump_ranges_after_fork();
}

static void child_after_fork(void)
{
    pump_pool_memory_after_fork();
    pump_device_memory_after_fork();
    pump_worker_after_fork(true);
    pump_residency_after_fork();
    pump_ranges_after_fork();
    pump_channel_after_fork_in_child();
    pump_stats_after_fork_in_child(pump_driver_was_used());
}

__attribute__((constructor)) static void pump_load(void)
{
    pump_config_load();
    pump_ranges_observe((struct pump_range_observer){
        .gone = pump_residency_detach, .freed = pump_residency_freed, .replaced = pump_residency_replaced });
    pthread_atfork(before_fork, parent_after_fork, child_after_fork);
    atexit(at_exit);
}
