/* capacity.c: the capacity cap (see capacity.h).
 *
 * Going beyond GPU memory is the user's explicit choice, never a default:
 * unless PUMP_CAPACITY says otherwise, the cap is the device's free memory
 * when it is first needed: at the first managed allocation, or under
 * managed_all at the first memory query. PUMP_CAPACITY takes bytes, a
 * percentage of the device's total memory, or `host` (the device's total
 * plus the host memory available at that moment).
 */
#include <pthread.h>
#include <stdio.h>

#include "capacity.h"
#include "capture_mode.h"

static uint64_t footprint;     /* atomic: managed bytes allocated now */
static uint64_t cap;           /* 0 until resolved; UINT64_MAX if none could be set */
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static bool beyond;            /* atomic: see pump_capacity_beyond_device */

static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return 0;
    char line[128];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

/* The current device's memory, asked in relaxed capture mode. */
static bool device_memory(size_t *free_bytes, size_t *total_bytes)
{
    if (pump_driver.mem_get_info == NULL)
        return false;
    struct pump_capture_mode mode = pump_capture_relax();
    bool ok = pump_driver.mem_get_info(free_bytes, total_bytes) == CUDA_SUCCESS;
    pump_capture_restore(&mode);
    return ok;
}

static uint64_t resolve(void)
{
    size_t free_bytes = 0, total_bytes = 0;
    if (!device_memory(&free_bytes, &total_bytes)) {
        if (pump_config.cap_kind == PUMP_CAP_BYTES)
            return pump_config.cap_value;
        pump_log_once("cannot read the device's memory: no capacity cap");
        return UINT64_MAX;
    }
    uint64_t resolved = (uint64_t)free_bytes;
    switch (pump_config.cap_kind) {
    case PUMP_CAP_BYTES:
        resolved = pump_config.cap_value;
        break;
    case PUMP_CAP_PERCENT:
        resolved = (uint64_t)total_bytes / 100 * pump_config.cap_value +
                   (uint64_t)total_bytes % 100 * pump_config.cap_value / 100;
        break;
    case PUMP_CAP_HOST:
        resolved = (uint64_t)total_bytes + host_available();
        break;
    case PUMP_CAP_DEFAULT:
        break;
    }
    __atomic_store_n(&beyond, resolved > (uint64_t)free_bytes, __ATOMIC_RELAXED);
    return resolved;
}

static uint64_t current_cap(void)
{
    uint64_t c = __atomic_load_n(&cap, __ATOMIC_ACQUIRE);
    if (PUMP_LIKELY(c != 0))
        return c;
    pthread_mutex_lock(&resolve_lock);
    c = __atomic_load_n(&cap, __ATOMIC_RELAXED);
    if (c == 0) {
        c = resolve();
        if (c == 0)
            c = 1;  /* a device with no free memory: nothing fits */
        __atomic_store_n(&cap, c, __ATOMIC_RELEASE);
        PUMP_SET(capacity_bytes, c);
    }
    pthread_mutex_unlock(&resolve_lock);
    return c;
}

static void publish(uint64_t now)
{
    PUMP_SET(managed_bytes, now);
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    uint64_t peak = __atomic_load_n(&record->managed_bytes_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&record->managed_bytes_peak, &peak, now, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static double gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ull << 30);
}

PUMP_HIDDEN bool pump_capacity_reserve(uint64_t bytes)
{
    uint64_t limit = current_cap();
    uint64_t now = __atomic_add_fetch(&footprint, bytes, __ATOMIC_RELAXED);
    if (now <= limit && now >= bytes) {
        publish(now);
        return true;
    }
    __atomic_sub_fetch(&footprint, bytes, __ATOMIC_RELAXED);
    PUMP_COUNT(capacity_refusals, 1);
    pump_notice_once("managed allocation of %.3f GiB refused: the job's managed memory would pass its capacity of "
                    "%.3f GiB. Raise it with pump-run --capacity SIZE|PCT%%|host (PUMP_CAPACITY); 'host' allows "
                     "going beyond GPU memory into host memory",
                     gib(bytes), gib(limit));
    return false;
}

PUMP_HIDDEN void pump_capacity_release(uint64_t bytes)
{
    publish(__atomic_sub_fetch(&footprint, bytes, __ATOMIC_RELAXED));
}

PUMP_HIDDEN void pump_capacity_info(size_t *free_bytes, size_t *total_bytes)
{
    uint64_t limit = current_cap();
    if (limit == UINT64_MAX || limit > SIZE_MAX)
        return;
    uint64_t used = __atomic_load_n(&footprint, __ATOMIC_RELAXED);
    *total_bytes = (size_t)limit;
    *free_bytes = (size_t)(used < limit ? limit - used : 0);
}

PUMP_HIDDEN bool pump_capacity_beyond_device(void)
{
    return __atomic_load_n(&beyond, __ATOMIC_RELAXED);
}
