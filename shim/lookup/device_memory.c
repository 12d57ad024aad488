/* device_memory.c: the device memory pump lets through (see device_memory.h).
 *
 * A hash table of allocations by base address (open addressing, linear probing, deletion by
 * moving later entries back), under one lock: allocations and frees are rare next to
 * launches, and no launch reads it. The bytes held on each device are kept beside it, read
 * without the lock by memory queries.
 */
#include <pthread.h>

#include "device_memory.h"
#include "locks.h"

#define SLOTS (2 * PUMP_DEVICE_MEMORY_MAX) /* a power of two: at most half full */

static struct {
    CUdeviceptr base; /* 0: empty */
    uint64_t size;
    int device;
} table[SLOTS];
static uint32_t used;
static uint64_t held[PUMP_DEVICES_MAX]; /* atomic */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t home(CUdeviceptr base)
{
    return (uint32_t)((base * 0x9E3779B97F4A7C15ull) >> 40) & (SLOTS - 1);
}

/* The slot holding base, or the empty one where it would go (under the lock). */
static uint32_t slot_of(CUdeviceptr base)
{
    uint32_t i = home(base);
    while (table[i].base != 0 && table[i].base != base)
        i = (i + 1) & (SLOTS - 1);
    return i;
}

/* Empties slot i, moving back the entries after it that could not sit at their home (under the lock). */
static void erase(uint32_t i)
{
    __atomic_sub_fetch(&held[table[i].device], table[i].size, __ATOMIC_RELAXED);
    used--;
    for (uint32_t j = (i + 1) & (SLOTS - 1); table[j].base != 0; j = (j + 1) & (SLOTS - 1)) {
        uint32_t h = home(table[j].base);
        bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            table[i] = table[j];
            i = j;
        }
    }
    table[i].base = 0;
}

PUMP_HIDDEN void pump_device_memory_add(CUdeviceptr base, uint64_t size, int device)
{
    if (base == 0 || device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    pump_mutex_lock(&lock);
    uint32_t i = slot_of(base);
    if (table[i].base == base) {
        erase(i);
        i = slot_of(base);
    }
    bool full = used >= PUMP_DEVICE_MEMORY_MAX;
    if (!full) {
        table[i].base = base;
        table[i].size = size;
        table[i].device = device;
        used++;
        __atomic_add_fetch(&held[device], size, __ATOMIC_RELAXED);
    }
    pump_mutex_unlock(&lock);
    if (full)
        pump_log_once("more than %d device allocations: memory queries leave the newest out",
                      PUMP_DEVICE_MEMORY_MAX);
}

PUMP_HIDDEN bool pump_device_memory_remove(CUdeviceptr base)
{
    if (base == 0)
        return false;
    pump_mutex_lock(&lock);
    uint32_t i = slot_of(base);
    bool found = table[i].base == base;
    if (found)
        erase(i);
    pump_mutex_unlock(&lock);
    return found;
}

PUMP_HIDDEN void pump_device_memory_drop_device(int device)
{
    pump_mutex_lock(&lock);
    bool erased = true;
    while (erased) {  /* an erase moves entries back, across the table's end too: pass again */
        erased = false;
        for (uint32_t i = 0; i < SLOTS; i++)
            while (table[i].base != 0 && table[i].device == device) {
                erase(i);
                erased = true;
            }
    }
    pump_mutex_unlock(&lock);
}

PUMP_HIDDEN uint64_t pump_device_memory_held(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? __atomic_load_n(&held[device], __ATOMIC_RELAXED) : 0;
}

PUMP_HIDDEN void pump_device_memory_before_fork(void)
{
    pump_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_device_memory_after_fork(void)
{
    pump_mutex_unlock(&lock);
}
