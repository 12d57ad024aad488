/* capacity.c: the capacity cap (see capacity.h), per device: a process that uses several GPUs
 * (DataParallel, device_map="auto") fills each within its own cap.
 *
 * Going beyond GPU memory is the user's explicit choice, never a default:
 * unless PUMP_CAPACITY says otherwise, a device's cap is its free memory
 * when it is first needed: at its first managed allocation, or under
 * managed_all at its first memory query. PUMP_CAPACITY takes bytes, a
 * percentage of the device's total memory, or `host` (the device's total
 * plus the host memory the job has room for at that moment: host_room.h).
 *
 * The device memory the process holds that pump lets through (device_memory.h), and what its
 * pools keep (pool_memory.h), are part of what the job has of its device: they were free for
 * the job before the job took them, and memory queries count them as used.
 */
#include <pthread.h>
#include <stdio.h>

#include "capacity.h"
#include "capture_mode.h"
#include "device_memory.h"
#include "devices.h"
#include "host_room.h"
#include "locks.h"
#include "pool_memory.h"

static struct {
    uint64_t footprint;  /* atomic: managed bytes allocated now on the device */
    uint64_t cap;        /* atomic: 0 until resolved; UINT64_MAX if none could be set */
    bool beyond;         /* atomic: see pump_capacity_beyond_device */
    uint64_t others_before; /* atomic, set with `cap`: see pump_capacity_others_before (UINT64_MAX:
                             * not read) */
} devices[PUMP_DEVICES_MAX];
static uint64_t footprint_total;  /* atomic: the process's, for the stats record */
static uint64_t caps_total;       /* the resolved caps summed (saturating), under resolve_lock */
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static bool beyond_any;        /* atomic: some device's `beyond` */

static double gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ull << 30);
}

/* --capacity host: the device's memory and the host's room for the job (host_room.h), said once. */
static uint64_t host_cap(int device, uint64_t total_bytes)
{
    struct pump_host_room host;
    pump_host_room(&host);
    char headroom[64] = "no limit";
    if (host.headroom != PUMP_HOST_UNLIMITED)
        snprintf(headroom, sizeof headroom, "%.1f GiB", gib(host.headroom));
    pump_notice_once("capacity host: device %d's %.1f GiB and %.1f GiB of host memory, the smaller of what the host "
                     "has available (%.1f GiB) and the job's memory cgroup leaves (%s), less %.1f GiB kept for the "
                     "job's own host memory",
                     device, gib(total_bytes), gib(host.room), gib(host.available), headroom, gib(host.reserve));
    return total_bytes + host.room < total_bytes ? UINT64_MAX : total_bytes + host.room;
}

/* What the process holds on device beside its managed footprint. */
static uint64_t held_beside_footprint(int device)
{
    uint64_t live = pump_device_memory_held(device), kept = pump_pool_memory_kept(device);
    return live + kept < live ? UINT64_MAX : live + kept;
}

/* The device's cap (0 where it has no free memory) and, in *free_out and *used_out, its free
 * memory and the memory in use there beside what the process holds (UINT64_MAX each where it
 * could not be read). */
static uint64_t resolve(int device, CUcontext ctx, uint64_t *free_out, uint64_t *used_out)
{
    size_t free_bytes = 0, total_bytes = 0;
    *free_out = *used_out = UINT64_MAX;
    if (!pump_memory_info(ctx, &free_bytes, &total_bytes)) {
        if (pump_config.cap_kind == PUMP_CAP_BYTES)
            return pump_config.cap_value;
        pump_log_once("cannot read the device's memory: no capacity cap");
        return UINT64_MAX;
    }
    /* By default the job's memory there is what was free and what it already holds. */
    uint64_t resolved = (uint64_t)free_bytes + held_beside_footprint(device);
    switch (pump_config.cap_kind) {
    case PUMP_CAP_BYTES:
        resolved = pump_config.cap_value;
        break;
    case PUMP_CAP_PERCENT:
        resolved = (uint64_t)total_bytes / 100 * pump_config.cap_value +
                   (uint64_t)total_bytes % 100 * pump_config.cap_value / 100;
        break;
    case PUMP_CAP_HOST:
        resolved = host_cap(device, (uint64_t)total_bytes);
        break;
    case PUMP_CAP_DEFAULT:
        break;
    }
    *free_out = free_bytes;
    uint64_t used = total_bytes > free_bytes ? (uint64_t)(total_bytes - free_bytes) : 0;
    uint64_t held = held_beside_footprint(device);
    *used_out = used > held ? used - held : 0;
    return resolved;
}

static uint64_t current_cap(int device, CUcontext ctx)
{
    uint64_t c = __atomic_load_n(&devices[device].cap, __ATOMIC_ACQUIRE);
    if (PUMP_LIKELY(c != 0))
        return c;
    /* Read with no lock held (driver calls); the first thread to publish sets the cap, and
     * one that read it too takes that one. */
    uint64_t free_bytes, used_bytes;
    uint64_t resolved = resolve(device, ctx, &free_bytes, &used_bytes);
    pump_mutex_lock(&resolve_lock);
    c = __atomic_load_n(&devices[device].cap, __ATOMIC_RELAXED);
    if (c == 0) {
        __atomic_store_n(&devices[device].others_before, used_bytes, __ATOMIC_RELAXED);
        c = resolved != 0 ? resolved : 1;  /* a device with no free memory: nothing fits */
        /* Managed memory alone may pass what is free: it can exceed what the device holds. */
        __atomic_store_n(&devices[device].beyond, resolved > free_bytes, __ATOMIC_RELAXED);
        if (resolved > free_bytes)
            __atomic_store_n(&beyond_any, true, __ATOMIC_RELAXED);
        __atomic_store_n(&devices[device].cap, c, __ATOMIC_RELEASE);
        caps_total = caps_total + c < caps_total ? UINT64_MAX : caps_total + c;
        PUMP_SET(capacity_bytes, caps_total);
    }
    pump_mutex_unlock(&resolve_lock);
    return c;
}

/* The stats record keeps the process's footprint and its peak. */
static void publish(int64_t delta)
{
    uint64_t now = __atomic_add_fetch(&footprint_total, (uint64_t)delta, __ATOMIC_RELAXED);
    PUMP_SET(managed_bytes, now);
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    uint64_t peak = __atomic_load_n(&record->managed_bytes_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&record->managed_bytes_peak, &peak, now, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

PUMP_HIDDEN bool pump_capacity_reserve(int device, CUcontext ctx, uint64_t bytes)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return true;
    uint64_t limit = current_cap(device, ctx);
    uint64_t now = __atomic_add_fetch(&devices[device].footprint, bytes, __ATOMIC_RELAXED);
    if (now <= limit && now >= bytes) {
        publish((int64_t)bytes);
        return true;
    }
    __atomic_sub_fetch(&devices[device].footprint, bytes, __ATOMIC_RELAXED);
    PUMP_COUNT(capacity_refusals, 1);
    pump_notice_once("managed allocation of %.3f GiB on device %d refused: the job's managed memory there would "
                     "pass its capacity of %.3f GiB. Raise it with pump-run --capacity SIZE|PCT%%|host "
                     "(PUMP_CAPACITY); 'host' allows going beyond GPU memory into host memory",
                     gib(bytes), device, gib(limit));
    return false;
}

PUMP_HIDDEN void pump_capacity_release(int device, uint64_t bytes)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    __atomic_sub_fetch(&devices[device].footprint, bytes, __ATOMIC_RELAXED);
    publish(-(int64_t)bytes);
}

PUMP_HIDDEN void pump_capacity_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    uint64_t limit = current_cap(device, NULL);
    if (limit == UINT64_MAX)
        return;
    uint64_t used = __atomic_load_n(&devices[device].footprint, __ATOMIC_RELAXED);
    uint64_t held = held_beside_footprint(device);
    used = used + held < used ? UINT64_MAX : used + held;
    /* The device memory pump lets through can take the process past the cap: the total is then
     * what it holds, so that free + held never passes it (PyTorch's cudaMallocAsync backend
     * asserts that). */
    uint64_t total = used > limit ? used : limit;
    if (total > SIZE_MAX)
        return;
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)(total - used);
}

PUMP_HIDDEN uint64_t pump_capacity_footprint(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? __atomic_load_n(&devices[device].footprint, __ATOMIC_RELAXED)
                                                    : 0;
}

PUMP_HIDDEN bool pump_capacity_others_before(int device, uint64_t *bytes)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX || __atomic_load_n(&devices[device].cap, __ATOMIC_ACQUIRE) == 0)
        return false;
    *bytes = __atomic_load_n(&devices[device].others_before, __ATOMIC_RELAXED);
    return *bytes != UINT64_MAX;
}

PUMP_HIDDEN uint64_t pump_capacity_held(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? held_beside_footprint(device) : 0;
}

PUMP_HIDDEN bool pump_capacity_beyond_device(int device)
{
    if (device < 0)
        return __atomic_load_n(&beyond_any, __ATOMIC_RELAXED);
    return device < PUMP_DEVICES_MAX && __atomic_load_n(&devices[device].beyond, __ATOMIC_RELAXED);
}
