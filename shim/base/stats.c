/* stats.c: the process's counter record, from its creation to fork and exit.
 *
 * The record is a file in PUMP_STATS_DIR mapped shared, so counting is a
 * plain atomic add and the counts outlive the process however it ends.
 * Without PUMP_STATS_DIR the counters live in this process's memory and,
 * with PUMP_LOG on, are printed at exit. Nothing here calls the driver or
 * takes a lock: exit and fork can happen anywhere, even inside the driver.
 * Nor does it ask the driver's loader (driver.c) anything: whether CUDA was
 * used comes from the caller, so the bootstrap's calls read one way.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

static struct pump_stats local_record;
PUMP_HIDDEN struct pump_stats *_Atomic pump_stats_record = &local_record;
PUMP_HIDDEN atomic_bool pump_passthrough;

/* Writes "<dir>/pump-<pid>.stats" without stdio: it also runs right after fork. */
static bool record_path(char *out, size_t size, const char *dir, pid_t pid)
{
    static const char prefix[] = "/pump-", suffix[] = ".stats";
    char digits[16];
    size_t nd = 0;
    unsigned long v = (unsigned long)pid;
    do {
        digits[nd++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0 && nd < sizeof digits);
    size_t dl = strlen(dir);
    if (dl + sizeof prefix + nd + sizeof suffix > size)
        return false;
    char *p = out;
    memcpy(p, dir, dl);
    p += dl;
    memcpy(p, prefix, sizeof prefix - 1);
    p += sizeof prefix - 1;
    while (nd > 0)
        *p++ = digits[--nd];
    memcpy(p, suffix, sizeof suffix);
    return true;
}

/* Points the counters at a fresh record for this process, which starts from what was
 * counted before it (dlsym's answers come before the driver is loaded). */
static void open_record(void)
{
    struct pump_stats *record = &local_record;
    char path[4096];
    if (pump_config.stats_dir != NULL && record_path(path, sizeof path, pump_config.stats_dir, getpid())) {
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            if (ftruncate(fd, sizeof(struct pump_stats)) == 0) {
                void *map = mmap(NULL, sizeof(struct pump_stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (map != MAP_FAILED) {
                    record = map;
                    memcpy(record, &local_record, sizeof *record);
                    record->magic = 0;
                }
            }
            close(fd);
        }
    }
    record->version = PUMP_STATS_VERSION;
    record->pid = getpid();
    record->parent_pid = getppid();
    __atomic_store_n(&record->magic, PUMP_STATS_MAGIC, __ATOMIC_RELEASE);
    atomic_store_explicit(&pump_stats_record, record, memory_order_release);
}

PUMP_HIDDEN void pump_stats_open(void)
{
    open_record();
}

PUMP_HIDDEN void pump_stats_passthrough(const char *reason)
{
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    strncpy(record->passthrough_reason, reason, sizeof record->passthrough_reason - 1);
    __atomic_store_n(&record->passthrough, 1, __ATOMIC_RELAXED);
    atomic_store_explicit(&pump_passthrough, true, memory_order_relaxed);
}

/* CUDA cannot be used in a child forked after the parent initialised it, so
 * such a child gets its own record and pump stands aside in it. */
PUMP_HIDDEN void pump_stats_after_fork_in_child(bool cuda_was_used)
{
    struct pump_stats *inherited = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    memset(&local_record, 0, sizeof local_record);  /* the child counts its own */
    if (inherited != &local_record) {
        atomic_store_explicit(&pump_stats_record, &local_record, memory_order_relaxed);
        munmap(inherited, sizeof *inherited);
    }
    if (cuda_was_used) {
        open_record();
        pump_stats_passthrough("forked after CUDA init");
    }
}

/* A job pump is there for (it allocated managed memory, or pump made its device memory
 * managed) that looked up a kernel launch entry point, but whose launches never reached
 * pump's hooks: they went past pump, unprefetched. Said at exit, as nothing earlier can
 * tell that no launch will come. */
static void say_no_launch_seen(const struct pump_stats *record)
{
    uint64_t managed = record->managed_allocs + record->managed_all_allocs + record->torch_allocs;
    if (record->launches != 0 || record->launch_lookups == 0 || managed == 0 || record->passthrough)
        return;
    pump_notice("this process allocated managed memory (%llu allocations) and looked up kernel launch entry "
                "points (%llu lookups), but no kernel launch reached pump's hooks: its launches, if it made any, "
                "went past pump and were not prefetched. PUMP_LOG=2 lists the lookups pump answered",
                (unsigned long long)managed, (unsigned long long)record->launch_lookups);
}

PUMP_HIDDEN void pump_stats_at_exit(bool cuda_was_used)
{
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    __atomic_store_n(&record->exited, 1, __ATOMIC_RELEASE);
    if (cuda_was_used)
        say_no_launch_seen(record);
    if (record == &local_record && pump_log_level() > 0 && cuda_was_used)
        pump_log(1, "%llu launches (%llu on managed memory), %llu prefetch calls, %llu bytes prefetched",
                 (unsigned long long)record->launches, (unsigned long long)record->launches_managed,
                 (unsigned long long)record->prefetch_calls, (unsigned long long)record->prefetch_bytes);
}
