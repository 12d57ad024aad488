/* lifecycle.c: what happens when libpump loads, when the process forks and
 * when it exits.
 *
 * Loading reads the configuration and nothing else (no driver, no threads;
 * the daemon channel's thread starts when CUDA is first used). Fork keeps
 * the range table consistent in the child and drops the parent's channel.
 * Exit stops pump's workers, waiting a while at most for a job under way,
 * sends the last counters and marks the record: no driver call, and no lock
 * held while it waits. Exit handlers run last registered first, and pump's
 * must run before the CUDA runtime's teardown (issue 42, risk 3), which
 * registers its own after pump's library loaded: so it is registered again
 * at the first kernel launch (by then the runtime has made its own), and runs
 * once.
 */
#include <pthread.h>
#include <stdlib.h>

#include "channel.h"
#include "device_memory.h"
#include "hooks_common.h"
#include "names.h"
#include "passed_discards.h"
#include "pool_memory.h"
#include "prefetch_worker.h"
#include "ranges.h"
#include "residency.h"

static void at_exit(void)
{
    static atomic_bool done;
    if (atomic_exchange(&done, true))
        return;
    pump_worker_at_exit();
    pump_channel_at_exit();
    pump_stats_at_exit(pump_driver_was_used());
}

static atomic_bool registered_late;

PUMP_HIDDEN void pump_lifecycle_launched(void)
{
    if (!atomic_load_explicit(&registered_late, memory_order_relaxed) && !atomic_exchange(&registered_late, true))
        atexit(at_exit);
}

/* The passed discards' queue (a leaf: no other lock is taken under it), then the range
 * table's lock: removing a range detaches its blocks. */
static void before_fork(void)
{
    pump_passed_discards_before_fork();
    pump_ranges_before_fork();
    pump_names_before_fork();
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
    pump_residency_after_fork(false);
    pump_names_after_fork();
    pump_ranges_after_fork();
    pump_passed_discards_after_fork(false);
}

static void child_after_fork(void)
{
    pump_pool_memory_after_fork();
    pump_device_memory_after_fork();
    pump_worker_after_fork(true);
    pump_residency_after_fork(true);
    pump_names_after_fork();
    pump_ranges_after_fork();
    pump_passed_discards_after_fork(true);
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
