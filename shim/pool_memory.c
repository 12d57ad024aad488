/* pool_memory.c: the pools memory queries ask what they keep (see pool_memory.h).
 *
 * Each device's pools are a few slots, read without the lock by allocations (a pool already
 * there costs a scan, nothing more) and written under it. A memory query holds the lock across
 * its driver calls, as cuMemPoolDestroy's hook does across the destroy: a query never asks a
 * pool that is gone. No launch, synchronisation or other device's allocation waits on it.
 */
#include <pthread.h>

#include "capture_mode.h"
#include "managed_all.h"
#include "pool_memory.h"

static _Atomic(CUmemoryPool) pools[PUMP_DEVICES_MAX][PUMP_POOL_MEMORY_POOLS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static bool known(int device, CUmemoryPool pool)
{
    for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
        if (atomic_load_explicit(&pools[device][i], memory_order_relaxed) == pool)
            return true;
    return false;
}

/* Under the lock. */
static void add_locked(int device, CUmemoryPool pool)
{
    if (known(device, pool))
        return;
    for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
        if (atomic_load_explicit(&pools[device][i], memory_order_relaxed) == NULL) {
            atomic_store_explicit(&pools[device][i], pool, memory_order_relaxed);
            return;
        }
    pump_log_once("more than %d memory pools on device %d: memory queries leave out what the newest keep",
                  PUMP_POOL_MEMORY_POOLS, device);
}

PUMP_HIDDEN void pump_pool_memory_add(int device, CUmemoryPool pool)
{
    if (pool == NULL || device < 0 || device >= PUMP_DEVICES_MAX || known(device, pool))
        return;
    pthread_mutex_lock(&lock);
    add_locked(device, pool);
    pthread_mutex_unlock(&lock);
}

PUMP_HIDDEN CUresult pump_pool_memory_destroy(CUmemoryPool pool, CUresult (*destroy)(CUmemoryPool))
{
    pthread_mutex_lock(&lock);
    CUresult r = destroy(pool);
    for (int device = 0; r == CUDA_SUCCESS && device < PUMP_DEVICES_MAX; device++)
        for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
            if (atomic_load_explicit(&pools[device][i], memory_order_relaxed) == pool)
                atomic_store_explicit(&pools[device][i], NULL, memory_order_relaxed);
    pthread_mutex_unlock(&lock);
    return r;
}

/* Under the lock: what pool keeps beyond its live allocations, 0 where the driver does not say. */
static uint64_t kept_by(CUmemoryPool pool)
{
    cuuint64_t reserved = 0, used = 0;
    if (pump_driver.mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
        pump_driver.mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
        return 0;
    return reserved > used ? reserved - used : 0;
}

PUMP_HIDDEN uint64_t pump_pool_memory_kept(int device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX || pump_driver.mem_pool_get_attribute == NULL ||
        !pump_managed_all())
        return 0;
    struct pump_capture_mode mode = pump_capture_relax();
    pthread_mutex_lock(&lock);
    CUmemoryPool current;
    if (pump_driver.device_get_mem_pool != NULL && pump_driver.device_get_mem_pool(&current, device) == CUDA_SUCCESS)
        add_locked(device, current);  /* kept there after it stops being current */
    uint64_t kept = 0;
    for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++) {
        CUmemoryPool pool = atomic_load_explicit(&pools[device][i], memory_order_relaxed);
        uint64_t bytes = pool != NULL ? kept_by(pool) : 0;
        kept = kept + bytes < kept ? UINT64_MAX : kept + bytes;
    }
    pthread_mutex_unlock(&lock);
    pump_capture_restore(&mode);
    return kept;
}

PUMP_HIDDEN void pump_pool_memory_before_fork(void)
{
    pthread_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_pool_memory_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}
