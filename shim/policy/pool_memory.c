/* pool_memory.c: the pools memory queries ask what they keep (see pool_memory.h).
 *
 * Each device's pools are a few slots, read without the lock by allocations (a pool already
 * there costs a scan, nothing more) and written under it. No driver call is made under the
 * lock: a memory query pins the slots it asks (under the lock) and asks the driver after;
 * cuMemPoolDestroy's hook empties the pool's slots (under the lock), waits for their pins to
 * go, and only then destroys it, so a query never asks a pool that is gone. A query's pool
 * lookup made before a destroy began is not kept (`destroys` moved on).
 */
#include <pthread.h>
#include <sched.h>

#include "capture_mode.h"
#include "locks.h"
#include "managed_all.h"
#include "pool_memory.h"

static _Atomic(CUmemoryPool) pools[PUMP_DEVICES_MAX][PUMP_POOL_MEMORY_POOLS];
static _Atomic uint32_t pins[PUMP_DEVICES_MAX][PUMP_POOL_MEMORY_POOLS]; /* queries asking the slot's pool */
static uint64_t destroys;  /* destroys begun (under the lock) */
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
        if (atomic_load_explicit(&pools[device][i], memory_order_relaxed) == NULL &&
            atomic_load_explicit(&pins[device][i], memory_order_acquire) == 0) {
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
    pump_mutex_lock(&lock);
    add_locked(device, pool);
    pump_mutex_unlock(&lock);
}

PUMP_HIDDEN CUresult pump_pool_memory_destroy(CUmemoryPool pool, CUresult (*destroy)(CUmemoryPool))
{
    bool emptied[PUMP_DEVICES_MAX][PUMP_POOL_MEMORY_POOLS] = {{false}};
    pump_mutex_lock(&lock);
    destroys++;
    for (int device = 0; device < PUMP_DEVICES_MAX; device++)
        for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
            if (atomic_load_explicit(&pools[device][i], memory_order_relaxed) == pool) {
                atomic_store_explicit(&pools[device][i], NULL, memory_order_relaxed);
                emptied[device][i] = true;
            }
    pump_mutex_unlock(&lock);
    /* The queries asking it now make two attribute calls each, and no new one finds it. */
    for (int device = 0; device < PUMP_DEVICES_MAX; device++)
        for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
            while (emptied[device][i] && atomic_load_explicit(&pins[device][i], memory_order_acquire) != 0)
                sched_yield();
    CUresult r = destroy(pool);
    if (r != CUDA_SUCCESS) {  /* still there: asked again */
        pump_mutex_lock(&lock);
        for (int device = 0; device < PUMP_DEVICES_MAX; device++)
            for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++)
                if (emptied[device][i])
                    add_locked(device, pool);
        pump_mutex_unlock(&lock);
    }
    return r;
}

/* What pool keeps beyond its live allocations, 0 where the driver does not say (its slot pinned). */
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
    pump_mutex_lock(&lock);
    uint64_t destroys_before = destroys;
    pump_mutex_unlock(&lock);
    CUmemoryPool current, asked[PUMP_POOL_MEMORY_POOLS];
    bool have_current =
        pump_driver.device_get_mem_pool != NULL && pump_driver.device_get_mem_pool(&current, device) == CUDA_SUCCESS;
    int slot[PUMP_POOL_MEMORY_POOLS], n = 0;
    pump_mutex_lock(&lock);
    if (have_current && destroys == destroys_before)
        add_locked(device, current);  /* kept there after it stops being current */
    for (int i = 0; i < PUMP_POOL_MEMORY_POOLS; i++) {
        CUmemoryPool pool = atomic_load_explicit(&pools[device][i], memory_order_relaxed);
        if (pool != NULL) {
            atomic_fetch_add_explicit(&pins[device][i], 1, memory_order_relaxed);
            asked[n] = pool;
            slot[n++] = i;
        }
    }
    pump_mutex_unlock(&lock);
    uint64_t kept = 0;
    for (int k = 0; k < n; k++) {
        uint64_t bytes = kept_by(asked[k]);
        atomic_fetch_sub_explicit(&pins[device][slot[k]], 1, memory_order_release);
        kept = kept + bytes < kept ? UINT64_MAX : kept + bytes;
    }
    pump_capture_restore(&mode);
    return kept;
}

PUMP_HIDDEN void pump_pool_memory_before_fork(void)
{
    pump_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_pool_memory_after_fork(void)
{
    pump_mutex_unlock(&lock);
}
