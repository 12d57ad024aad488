/* stats.c: why it exists: the FAKECUDA_* knobs, the entry guard every export runs
 * (FAKECUDA_FAIL, version gating, init check), the counters, the time model (a per-thread
 * debt slept off in chunks) and the JSON written at exit (FAKECUDA_STATS). */
#include "fakecuda_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

fc_config fc_cfg;
fc_counters fc_ctr;

#define FC_MAX_FAIL 32
static struct { char name[64]; CUresult code; } fc_fail[FC_MAX_FAIL];
static int fc_nfail;
static pthread_once_t fc_once = PTHREAD_ONCE_INIT;

int fc_error_from_name(const char *s, CUresult *out); /* device.c */

static uint64_t parse_size(const char *s, uint64_t dflt)
{
    if (!s || !*s) return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s) return dflt;
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case 't': case 'T': v <<= 40; break;
    default: break;
    }
    return v ? v : dflt;
}

static void parse_fail(const char *s)
{
    while (s && *s && fc_nfail < FC_MAX_FAIL) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        if (eq && (size_t)(eq - s) < sizeof fc_fail[0].name) {
            char code[64] = {0};
            size_t clen = len - (size_t)(eq - s) - 1;
            if (clen < sizeof code) {
                memcpy(code, eq + 1, clen);
                char *end = NULL;
                long v = strtol(code, &end, 0);
                CUresult r;
                if (end != code && *end == '\0') r = (CUresult)v;
                else if (!fc_error_from_name(code, &r)) r = CUDA_ERROR_UNKNOWN;
                memcpy(fc_fail[fc_nfail].name, s, (size_t)(eq - s));
                fc_fail[fc_nfail].name[eq - s] = '\0';
                fc_fail[fc_nfail].code = r;
                fc_nfail++;
            }
        }
        s = comma ? comma + 1 : NULL;
    }
}

/* CUDA_VISIBLE_DEVICES, as the driver reads it (CUDA C++ Programming Guide, "CUDA
 * Environment Variables"): a comma-separated list of device indices, enumerated in that
 * order; the list ends at the first entry that is not a valid index (so "0,2,-1,1" shows
 * devices 0 and 2), and set but empty shows none. Not modelled, so ending the list
 * (the strict side): a repeated index, and UUIDs (GPU-...), which the driver takes.
 * Unset: every device, in order. */
static void visible_devices(int machine_devices)
{
    const char *s = getenv("CUDA_VISIBLE_DEVICES");
    fc_cfg.ndevices = 0;
    if (!s) {
        for (int i = 0; i < machine_devices; i++) fc_cfg.physical[fc_cfg.ndevices++] = i;
        return;
    }
    bool seen[FAKECUDA_MAX_DEVICES] = {false};
    while (*s && fc_cfg.ndevices < machine_devices) {
        char *end = NULL;
        errno = 0;
        long index = strtol(s, &end, 10);
        if (end == s || errno || (*end && *end != ',') || index < 0 || index >= machine_devices || seen[index])
            return;
        seen[index] = true;
        fc_cfg.physical[fc_cfg.ndevices++] = (int)index;
        s = *end ? end + 1 : end;
    }
}

/* A whole-number knob in [lo, hi], or def when unset; anything else: an error at load. */
static unsigned knob_uint(const char *name, unsigned def, unsigned lo, unsigned hi)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end || v[0] == '-' || n < lo || n > hi) {
        fprintf(stderr, "fakecuda: %s=%s: allowed: %u to %u (default %u)\n", name, v, lo, hi, def);
        exit(2);
    }
    return (unsigned)n;
}

/* A check of pump's, not a model of the driver (which neither knows nor cares): pump's rule
 * is that no lock of its own is held across a driver call (a driver call can block for
 * milliseconds, or call back into pump). libpump exports how many of its locks the calling
 * thread holds (shim/base/locks.h); every entry point asks it, and an entry made while it is not 0
 * is said on stderr, once per entry point; so are its waits for other threads' driver calls
 * made holding a lock (pump_lock_waits_held). Without libpump in the process: nothing to ask. */
static unsigned int (*fc_pump_locks)(void);
static unsigned int (*fc_pump_waits)(void);

static void check_pump_locks(const char *name)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static const char *said[256];
    static int nsaid;
    unsigned int held = fc_pump_locks();
    if (held == 0) return;
    pthread_mutex_lock(&mu);
    bool new_name = true;
    for (int i = 0; i < nsaid && new_name; i++) new_name = strcmp(said[i], name) != 0;
    if (new_name && nsaid < 256) said[nsaid++] = name;
    pthread_mutex_unlock(&mu);
    if (new_name)
        fprintf(stderr, "fakecuda: %s called while the calling thread holds %u pump lock%s (pump's rule: no lock "
                "held across a driver call)\n", name, held, held == 1 ? "" : "s");
}

/* pump_lock_waits_held: waits for other threads' driver calls that libpump made holding one of
 * its locks, in all threads (shim/base/locks.h). Said once, at the first entry that sees one. */
static void check_pump_waits(void)
{
    static atomic_bool said;
    unsigned int waits = fc_pump_waits();
    if (waits == 0 || atomic_exchange(&said, true)) return;
    fprintf(stderr, "fakecuda: %u wait%s for another thread's driver calls made holding a pump lock (pump's rule: "
            "no lock held across a driver call)\n", waits, waits == 1 ? "" : "s");
}

static void load_config(void)
{
    const char *v = getenv("FAKECUDA_DRIVER_VERSION");
    fc_cfg.driver_version = v && *v ? atoi(v) : FAKECUDA_DEFAULT_DRIVER_VERSION;
    if (fc_cfg.driver_version <= 0) fc_cfg.driver_version = FAKECUDA_DEFAULT_DRIVER_VERSION;
    v = getenv("FAKECUDA_DEVICES");
    fc_cfg.ndevices = v && *v ? atoi(v) : FAKECUDA_DEFAULT_DEVICES;
    if (fc_cfg.ndevices < 0 || fc_cfg.ndevices > FAKECUDA_MAX_DEVICES) {
        fprintf(stderr, "fakecuda: FAKECUDA_DEVICES=%s: allowed: 0 to %d\n", v, FAKECUDA_MAX_DEVICES);
        exit(2);
    }
    visible_devices(fc_cfg.ndevices);
    uint64_t card = fc_persona_memory(); /* FAKECUDA_PERSONA's card, else fakecuda's default */
    fc_cfg.device_memory = parse_size(getenv("FAKECUDA_DEVICE_MEMORY"), card ? card : FAKECUDA_DEFAULT_DEVICE_MEMORY);
    v = getenv("FAKECUDA_IOCTL_THREAD");
    if (v && *v && strcmp(v, "caller") != 0 && strcmp(v, "worker") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_IOCTL_THREAD=%s: allowed: caller (the default) or worker\n", v);
        exit(2);
    }
    fc_cfg.ioctl_on_worker = v && strcmp(v, "worker") == 0;
    /* The driver's valid ranges (uvm_gpu_replayable_faults.c, uvm_perf_prefetch_init) */
    fc_cfg.fault_batch_count = knob_uint("FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT", FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT, 1, 65536);
    fc_cfg.prefetch_enable = knob_uint("FAKECUDA_UVM_PERF_PREFETCH_ENABLE", FAKECUDA_UVM_PERF_PREFETCH_ENABLE, 0, 1);
    fc_cfg.prefetch_threshold =
        knob_uint("FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD", FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD, 0, 100);
    fc_cfg.prefetch_min_faults =
        knob_uint("FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS", FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS, 1, 20);
    v = getenv("FAKECUDA_POOL_PREFETCH");
    if (v && *v && strcmp(v, "refuse") != 0 && strcmp(v, "accept") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_POOL_PREFETCH=%s: allowed: accept (the default) or refuse\n", v);
        exit(2);
    }
    fc_cfg.pool_prefetch = !(v && strcmp(v, "refuse") == 0);
    fc_cfg.pool_prefetch_refuse_after = knob_uint("FAKECUDA_POOL_PREFETCH_REFUSE_AFTER", UINT_MAX, 0, UINT_MAX - 1);
    v = getenv("FAKECUDA_POOL_REUSE");
    if (v && *v && strcmp(v, "created") != 0 && strcmp(v, "freed") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_POOL_REUSE=%s: allowed: created (the default) or freed\n", v);
        exit(2);
    }
    fc_cfg.pool_reuse_freed = v && strcmp(v, "freed") == 0;
    v = getenv("FAKECUDA_DISCARD_FILL");
    if (v && *v && strcmp(v, "poison") != 0 && strcmp(v, "none") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_DISCARD_FILL=%s: allowed: poison (the default) or none\n", v);
        exit(2);
    }
    fc_cfg.discard_fill = !(v && strcmp(v, "none") == 0);
    parse_fail(getenv("FAKECUDA_FAIL"));
    fc_pump_locks = (unsigned int (*)(void))dlsym(RTLD_DEFAULT, "pump_locks_held");
    fc_pump_waits = (unsigned int (*)(void))dlsym(RTLD_DEFAULT, "pump_lock_waits_held");
}

void fc_config_load(void) { pthread_once(&fc_once, load_config); }

_Thread_local int fc_tls_ptsz;
_Thread_local const char *fc_tls_call;

CUresult fc_enter(const char *name, int min_version, int need_init)
{
    size_t len = strlen(name);
    fc_tls_call = name;
    fc_tls_ptsz = len > 5 && (memcmp(name + len - 5, "_ptsz", 5) == 0 || memcmp(name + len - 5, "_ptds", 5) == 0);
    pthread_once(&fc_once, load_config);
    if (fc_pump_locks) check_pump_locks(name);
    if (fc_pump_waits) check_pump_waits();
    for (int i = 0; i < fc_nfail; i++)
        if (strcmp(fc_fail[i].name, name) == 0) return fc_fail[i].code;
    if (min_version > fc_cfg.driver_version) return CUDA_ERROR_NOT_SUPPORTED;
    if (need_init && !atomic_load_explicit(&fc_initialized, memory_order_acquire))
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

static pthread_mutex_t fc_keep_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_link fc_kept = { &fc_kept, &fc_kept };

void fc_keep(fc_link *l)
{
    pthread_mutex_lock(&fc_keep_mu);
    l->next = fc_kept.next;
    l->prev = &fc_kept;
    fc_kept.next->prev = l;
    fc_kept.next = l;
    pthread_mutex_unlock(&fc_keep_mu);
}

void fc_unkeep(fc_link *l)
{
    pthread_mutex_lock(&fc_keep_mu);
    l->prev->next = l->next;
    l->next->prev = l->prev;
    pthread_mutex_unlock(&fc_keep_mu);
}

/* ---- time model ---- */
static _Thread_local int64_t fc_debt_ns;
#define OVERSLEEP_CREDIT_MAX_NS 1000000
static _Thread_local uint64_t fc_charged_ns; /* all this thread was ever charged */

uint64_t fc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fc_pay_debt(int64_t min_ns)
{
    if (fc_debt_ns <= 0 || fc_debt_ns < min_ns) return;
    uint64_t t0 = fc_now_ns();
    struct timespec ts = { (time_t)(fc_debt_ns / 1000000000), (long)(fc_debt_ns % 1000000000) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    fc_debt_ns -= (int64_t)(fc_now_ns() - t0);
    if (fc_debt_ns < -OVERSLEEP_CREDIT_MAX_NS) fc_debt_ns = -OVERSLEEP_CREDIT_MAX_NS; /* credit for oversleep */
}

FC_EXPORT void fakecuda_credit_oversleep(uint64_t ns)
{
    fc_debt_ns -= ns < OVERSLEEP_CREDIT_MAX_NS ? (int64_t)ns : OVERSLEEP_CREDIT_MAX_NS;
    if (fc_debt_ns < -OVERSLEEP_CREDIT_MAX_NS) fc_debt_ns = -OVERSLEEP_CREDIT_MAX_NS;
}

uint64_t fc_host_clock_ns(void) { return fc_now_ns() + (uint64_t)(fc_debt_ns > 0 ? fc_debt_ns : 0); }

/* Where this thread's modelled work has got to: behind the wall clock by the oversleep it was
 * credited. A stream stamps its events with it: a copy the credit absorbs still took its
 * modelled time between them (the wall clock would show a 2 MiB copy done in a microsecond). */
uint64_t fc_model_clock_ns(void) { return (uint64_t)((int64_t)fc_now_ns() + fc_debt_ns); }

/* What comes next starts no earlier than t_ns: credit for oversleep holds only across work
 * that was waiting, not across a wait for work, a not-before time or another stream. */
void fc_start_no_earlier(uint64_t t_ns)
{
    int64_t d = (int64_t)(t_ns - fc_now_ns());
    if (fc_debt_ns < d) fc_debt_ns = d;
}

void fc_charge_ns(int64_t ns)
{
    fc_debt_ns += ns;
    if (ns > 0) fc_charged_ns += (uint64_t)ns;
    if (fc_debt_ns >= (int64_t)FAKECUDA_SLEEP_CHUNK_US * 1000) fc_pay_debt(0);
}

FC_EXPORT uint64_t fakecuda_thread_host_ns(void) { return fc_charged_ns; }

void fc_wait_until(uint64_t t_ns)
{
    for (;;) {
        uint64_t now = fc_now_ns();
        if (now >= t_ns) {
            fc_start_no_earlier(t_ns);
            return;
        }
        uint64_t left = t_ns - now;
        if (left > FAKECUDA_SPIN_US * 1000ull) {
            uint64_t s = left - FAKECUDA_SPIN_US * 500ull;
            struct timespec ts = { (time_t)(s / 1000000000ull), (long)(s % 1000000000ull) };
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- stats ---- */
FC_EXPORT void fakecuda_get_stats(struct fakecuda_stats *out)
{
    if (!out) return;
#define LD(f) atomic_load_explicit(&fc_ctr.f, memory_order_relaxed)
    out->gpu_faults = LD(gpu_faults);
    out->cpu_faults = LD(cpu_faults);
    out->pages_touched_by_kernels = LD(pages_touched_by_kernels);
    out->bytes_prefetched_h2d = LD(bytes_prefetched_h2d);
    out->bytes_faulted_h2d = LD(bytes_faulted_h2d);
    out->bytes_d2h = LD(bytes_d2h);
    out->kernels_run = LD(kernels_run);
    out->launches = LD(launches);
    out->prefetch_calls = LD(prefetch_calls);
    out->batch_prefetch_calls = LD(batch_prefetch_calls);
    out->bytes_discarded = LD(bytes_discarded);
    out->allocations_reused = LD(allocations_reused);
    out->driver_host_ns = fc_cost_total_ns();
    out->driver_evictions = LD(driver_evictions);
    out->bytes_evicted_d2h = LD(bytes_evicted_d2h);
    out->bytes_evicted_h2d = LD(bytes_evicted_h2d);
    out->va_lock_wait_ns = fc_va_lock_wait_ns();
    out->pool_bytes_reserved = LD(pool_bytes_reserved);
    out->pool_bytes_released = LD(pool_bytes_released);
    out->gpu_fault_batches = LD(gpu_fault_batches);
    out->gpu_fault_stall_ns = LD(gpu_fault_stall_ns);
    out->bytes_fault_prefetched_h2d = LD(bytes_fault_prefetched_h2d);
    out->launches_by_function = LD(launches_by_function);
    out->launches_by_kernel = LD(launches_by_kernel);
    out->launches_given_uses = LD(launches_given_uses);
    out->launch_uses_missing = LD(launch_uses_missing);
    out->launch_uses_mismatched = LD(launch_uses_mismatched);
    out->discard_races = LD(discard_races);
    out->bytes_lost_to_discard_races = LD(bytes_lost_to_discard_races);
    out->lookups_above_driver = LD(lookups_above_driver);
    out->bytes_read_discarded = LD(bytes_read_discarded);
    out->gpu_faults_unpointed = LD(gpu_faults_unpointed);
    out->bytes_dead_h2d = LD(bytes_dead_h2d);
    out->bytes_dead_d2h = LD(bytes_dead_d2h);
    /* Each way over the link, whoever moved it */
    out->bytes_h2d = out->bytes_faulted_h2d + out->bytes_prefetched_h2d;
    out->bytes_d2h_all = out->bytes_d2h + out->bytes_evicted_d2h;
    out->device_resident_bytes = out->device_resident_peak = 0;
    for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++) {
        out->device_resident_bytes += atomic_load_explicit(&fc_dev_resident[d], memory_order_relaxed);
        uint64_t peak = atomic_load_explicit(&fc_dev_resident_peak[d], memory_order_relaxed);
        if (peak > out->device_resident_peak) out->device_resident_peak = peak;
    }
    uint64_t pending = 0;
    fc_managed_scan(&pending, 0); /* prefetched pages no kernel has touched yet */
    out->bytes_prefetched_unused = LD(bytes_prefetched_unused) + pending;
#undef LD
}

FC_EXPORT void fakecuda_reset_stats(void)
{
    uint64_t ignored = 0;
    fc_managed_scan(&ignored, 1); /* forget touched / prefetched-unused page bits */
    _Atomic uint64_t *f[] = { &fc_ctr.gpu_faults, &fc_ctr.cpu_faults, &fc_ctr.pages_touched_by_kernels,
                              &fc_ctr.bytes_prefetched_h2d, &fc_ctr.bytes_prefetched_unused,
                              &fc_ctr.bytes_faulted_h2d, &fc_ctr.bytes_d2h, &fc_ctr.kernels_run,
                              &fc_ctr.launches, &fc_ctr.prefetch_calls, &fc_ctr.batch_prefetch_calls,
                              &fc_ctr.bytes_discarded, &fc_ctr.allocations_reused, &fc_ctr.driver_evictions,
                              &fc_ctr.bytes_evicted_d2h, &fc_ctr.bytes_evicted_h2d, &fc_ctr.pool_bytes_reserved,
                              &fc_ctr.pool_bytes_released, &fc_ctr.gpu_fault_batches, &fc_ctr.gpu_fault_stall_ns,
                              &fc_ctr.bytes_fault_prefetched_h2d, &fc_ctr.launches_by_function,
                              &fc_ctr.launches_by_kernel, &fc_ctr.param_info_refused, &fc_ctr.launches_given_uses,
                              &fc_ctr.launch_uses_missing, &fc_ctr.launch_uses_mismatched, &fc_ctr.discard_races,
                              &fc_ctr.bytes_lost_to_discard_races, &fc_ctr.bytes_read_discarded,
                              &fc_ctr.gpu_faults_unpointed, &fc_ctr.bytes_dead_h2d, &fc_ctr.bytes_dead_d2h };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) atomic_store_explicit(f[i], 0, memory_order_relaxed);
    fc_cost_reset();
    for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++) /* the peak starts again from what is resident now */
        atomic_store_explicit(&fc_dev_resident_peak[d], atomic_load(&fc_dev_resident[d]), memory_order_relaxed);
}

__attribute__((constructor)) static void fc_ctor(void)
{
    fc_config_load();
    pthread_atfork(NULL, NULL, fc_atfork_child);
    /* Never unload: stream workers run this library's code until the process exits. */
    Dl_info info;
    if (dladdr((void *)&fc_ctor, &info) && info.dli_fname)
        (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

/* Written at exit by the process that called cuInit (never by a child forked from it).
 * Reads only atomics and page bits (with a bounded lock wait): a busy stream cannot make
 * it hang. */
__attribute__((destructor)) static void fc_write_stats_at_exit(void)
{
    const char *path = getenv("FAKECUDA_STATS");
    if (!path || !*path || atomic_load(&fc_init_pid) != (int)getpid()) return; /* only where cuInit ran */
    struct fakecuda_stats s;
    fakecuda_get_stats(&s);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "fakecuda: cannot write FAKECUDA_STATS=%s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f,
            "{\"gpu_faults\": %" PRIu64 ", \"cpu_faults\": %" PRIu64
            ", \"pages_touched_by_kernels\": %" PRIu64 ", \"bytes_prefetched_h2d\": %" PRIu64
            ", \"bytes_prefetched_unused\": %" PRIu64 ", \"bytes_faulted_h2d\": %" PRIu64
            ", \"bytes_d2h\": %" PRIu64 ", \"kernels_run\": %" PRIu64 ", \"launches\": %" PRIu64
            ", \"prefetch_calls\": %" PRIu64 ", \"batch_prefetch_calls\": %" PRIu64
            ", \"device_resident_bytes\": %" PRIu64 ", \"device_resident_peak\": %" PRIu64
            ", \"bytes_discarded\": %" PRIu64 ", \"allocations_reused\": %" PRIu64
            ", \"driver_host_ns\": %" PRIu64 ", \"driver_evictions\": %" PRIu64 ", \"bytes_evicted_d2h\": %" PRIu64
            ", \"bytes_evicted_h2d\": %" PRIu64 ", \"va_lock_wait_ns\": %" PRIu64
            ", \"pool_bytes_reserved\": %" PRIu64 ", \"pool_bytes_released\": %" PRIu64
            ", \"gpu_fault_batches\": %" PRIu64 ", \"gpu_fault_stall_ns\": %" PRIu64
            ", \"bytes_fault_prefetched_h2d\": %" PRIu64 ", \"bytes_h2d\": %" PRIu64 ", \"bytes_d2h_all\": %" PRIu64
            ", \"launches_by_function\": %" PRIu64 ", \"launches_by_kernel\": %" PRIu64
            ", \"param_info_refused\": %" PRIu64 ", \"launches_given_uses\": %" PRIu64
            ", \"launch_uses_missing\": %" PRIu64 ", \"launch_uses_mismatched\": %" PRIu64
            ", \"discard_races\": %" PRIu64 ", \"bytes_lost_to_discard_races\": %" PRIu64
            ", \"lookups_above_driver\": %" PRIu64 ", \"bytes_read_discarded\": %" PRIu64
            ", \"gpu_faults_unpointed\": %" PRIu64 ", \"bytes_dead_h2d\": %" PRIu64 ", \"bytes_dead_d2h\": %" PRIu64
            ", \"entry_costs\": ",
            s.gpu_faults, s.cpu_faults, s.pages_touched_by_kernels, s.bytes_prefetched_h2d,
            s.bytes_prefetched_unused, s.bytes_faulted_h2d, s.bytes_d2h, s.kernels_run,
            s.launches, s.prefetch_calls, s.batch_prefetch_calls, s.device_resident_bytes,
            s.device_resident_peak, s.bytes_discarded, s.allocations_reused, s.driver_host_ns, s.driver_evictions,
            s.bytes_evicted_d2h, s.bytes_evicted_h2d, s.va_lock_wait_ns, s.pool_bytes_reserved, s.pool_bytes_released,
            s.gpu_fault_batches, s.gpu_fault_stall_ns, s.bytes_fault_prefetched_h2d, s.bytes_h2d, s.bytes_d2h_all,
            s.launches_by_function, s.launches_by_kernel,
            atomic_load_explicit(&fc_ctr.param_info_refused, memory_order_relaxed), s.launches_given_uses,
            s.launch_uses_missing, s.launch_uses_mismatched, s.discard_races, s.bytes_lost_to_discard_races,
            s.lookups_above_driver, s.bytes_read_discarded, s.gpu_faults_unpointed, s.bytes_dead_h2d, s.bytes_dead_d2h);
    fc_cost_write_json(f);
    fputs(", \"not_found\": ", f);
    fc_not_found_write_json(f);
    fputs("}\n", f);
    fclose(f);
}
