/* cost.c: why it exists: the driver's host-side cost. Each entry point charges modelled host
 * time (fakecuda_model.h's *_HOST_NS, FAKECUDA_IOCTL_NS, FAKECUDA_BLOCK_PASS_NS,
 * FAKECUDA_MIGRATE_BLOCK_NS, FAKECUDA_RM_CALL_NS) into the
 * paying thread's debt, the debt a kernel's start waits for; counts calls and nanoseconds per
 * entry point (fakecuda_get_entry_cost); holds the UVM va_space lock model (ioctls read,
 * allocations and frees write: uvm_api_migrate / uvm_api_discard take
 * uvm_va_space_down_read, uvm_mmap and uvm_vm_close_managed uvm_va_space_down_write); and
 * the FAKECUDA_IOCTL_THREAD knob: which thread pays for ioctls. Every charge is also the paying
 * thread's own (fc_charge_ns, fakecuda_thread_host_ns): a benchmark tells the launching thread's host time
 * from a helper thread's, whoever that helper is (the driver's worker, or the shim's). */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fc_entry_names[FC_E_COUNT] = {
    [FC_E_LAUNCH] = "launch",
    [FC_E_GRAPH_LAUNCH] = "graph_launch",
    [FC_E_PREFETCH] = "prefetch",
    [FC_E_DISCARD] = "discard",
    [FC_E_EVENT_RECORD] = "event_record",
    [FC_E_STREAM_WAIT_EVENT] = "stream_wait_event",
    [FC_E_EVENT_QUERY] = "event_query",
    [FC_E_STREAM_QUERY] = "stream_query",
    [FC_E_SYNCHRONIZE] = "synchronize",
    [FC_E_MEM_GET_INFO] = "mem_get_info",
    [FC_E_POINTER_QUERY] = "pointer_query",
    [FC_E_CAPTURE_QUERY] = "capture_query",
    [FC_E_CONTEXT_QUERY] = "context_query",
    [FC_E_MEMCPY] = "memcpy",
    [FC_E_MEMSET] = "memset",
    [FC_E_POOL_RESERVE] = "pool_reserve",
    [FC_E_POOL_RELEASE] = "pool_release",
    [FC_E_POOL_QUERY] = "pool_query",
    [FC_E_TENSOR_MAP] = "tensor_map",
    [FC_E_VMM] = "vmm",
};

static struct {
    _Atomic uint64_t calls, caller_ns, worker_ns;
} fc_entry_ctr[FC_E_COUNT];

static _Atomic uint64_t fc_va_wait_ns;
static pthread_rwlock_t fc_va_lock = PTHREAD_RWLOCK_INITIALIZER;

int fc_ioctl_on_worker(void) { return fc_cfg.ioctl_on_worker; }

void fc_cost_call(int entry) { atomic_fetch_add_explicit(&fc_entry_ctr[entry].calls, 1, memory_order_relaxed); }

/* ns counted against the entry, charged to no thread (the caller charged it already). */
static void fc_cost_charge_only(int entry, int64_t ns, int on_worker)
{
    if (ns > 0)
        atomic_fetch_add_explicit(on_worker ? &fc_entry_ctr[entry].worker_ns : &fc_entry_ctr[entry].caller_ns,
                                  (uint64_t)ns, memory_order_relaxed);
}

void fc_cost_charge(int entry, int64_t ns, int on_worker)
{
    if (ns <= 0) return;
    fc_cost_charge_only(entry, ns, on_worker);
    fc_charge_ns(ns);
}

void fc_cost(int entry, int64_t ns)
{
    fc_cost_call(entry);
    fc_cost_charge(entry, ns, 0);
}

/* Prefetches take turns with their copies: a prefetch to the GPU and one to the host, made by
 * two threads at once, took as long as the two one after the other on every GPU run that
 * probed it (bench/gpu/probes/concurrent_moves.py, 512 MiB each way: overlap 0.05 on an H100,
 * -0.13 and -0.11 on two H200s; bench/results/gpu-20261126-*, gpu-20261127-nvidia-h200,
 * preflight.json). So the copies of every prefetch, either way, are booked on one timeline:
 * each starts when the copies booked before it end. One timeline for all devices: the probe
 * measured one device, and two devices' links run apart on a real machine (the dearer side for
 * pump here). The driver's fault path and its evictions are not booked: not measured beside a
 * prefetch, so left as they were (the kinder side for the baseline). */
static _Atomic uint64_t fc_copies_end_ns; /* model time at which the copies booked so far end */

int64_t fc_charge_copies(int64_t ns)
{
    if (ns <= 0) return 0;
    /* Copies booked to end by the wall clock hold up nothing: a thread's model clock runs behind
     * the wall by the oversleep it was credited, another thread's booking need not. */
    uint64_t now = fc_model_clock_ns(), wall = fc_now_ns(), start;
    uint64_t end = atomic_load_explicit(&fc_copies_end_ns, memory_order_relaxed);
    do start = end > now && end > wall ? end : now;
    while (!atomic_compare_exchange_weak_explicit(&fc_copies_end_ns, &end, start + (uint64_t)ns, memory_order_relaxed,
                                                  memory_order_relaxed));
    fc_start_no_earlier(start);
    fc_charge_ns(ns);
    return (int64_t)(start - now) + ns; /* its turn's wait, and its copies */
}

/* The ioctl's time passes with the va_space lock held for reading, as in uvm_api_migrate
 * (held until the migration's copies are waited for, when the destination is the CPU):
 * turn_ns of it, its pages' moves and copies, takes its turn (fc_charge_copies). */
void fc_ioctl(int entry, int64_t ns, int64_t turn_ns, int on_worker)
{
    pthread_rwlock_rdlock(&fc_va_lock);
    fc_cost_charge(entry, ns, on_worker);
    fc_cost_charge_only(entry, fc_charge_copies(turn_ns), on_worker);
    fc_pay_debt(0);
    pthread_rwlock_unlock(&fc_va_lock);
}

/* Allocations and frees that map or unmap through the UVM driver wait for every ioctl in
 * flight; the wait is counted (va_lock_wait_ns). */
void fc_va_write_lock(void)
{
    if (pthread_rwlock_trywrlock(&fc_va_lock) == 0) return;
    uint64_t t0 = fc_now_ns();
    pthread_rwlock_wrlock(&fc_va_lock);
    atomic_fetch_add_explicit(&fc_va_wait_ns, fc_now_ns() - t0, memory_order_relaxed);
}

void fc_va_write_unlock(void) { pthread_rwlock_unlock(&fc_va_lock); }
void fc_va_read_lock(void) { pthread_rwlock_rdlock(&fc_va_lock); }
void fc_va_read_unlock(void) { pthread_rwlock_unlock(&fc_va_lock); }

/* A UVM_MIGRATE of [p, p+n): a fixed cost and one block visit per 2 MiB VA block per pass,
 * resident or not; two passes when the range spans more than one block (uvm_migrate:
 * do_two_passes = do_mappings && !is_single_block, and do_mappings is always true outside
 * the driver's built-in tests, UVM_MIGRATE_FLAG_SKIP_CPU_MAP being a test-only flag). */
int64_t fc_migrate_ioctl_ns(uintptr_t p, size_t n)
{
    uint64_t blocks = n ? (p + n - 1) / FAKECUDA_VA_BLOCK - p / FAKECUDA_VA_BLOCK + 1 : 0;
    uint64_t passes = blocks > 1 ? 2 : 1;
    return (int64_t)(FAKECUDA_IOCTL_NS + blocks * passes * FAKECUDA_BLOCK_PASS_NS);
}

/* The calling thread's CPU time for the pages a UVM_MIGRATE moves, pro rata per page
 * (FAKECUDA_MIGRATE_BLOCK_NS per 2 MiB). */
int64_t fc_move_ns(uint64_t bytes)
{
    return (int64_t)(bytes * FAKECUDA_MIGRATE_BLOCK_NS / FAKECUDA_VA_BLOCK);
}

/* What a prefetch to the host waits for its copies of `bytes`, beyond the CPU time of moving
 * their pages (fc_move_ns) charged beside it. FAKECUDA_PREFETCH_D2H_BYTES_PER_US is the whole
 * call's rate, timed with events around it: that CPU time is inside it, done while the copies
 * pushed before run. So the call takes the longer of the two, not their sum. */
int64_t fc_prefetch_d2h_wait_ns(uint64_t bytes)
{
    int64_t copies = (int64_t)(bytes * 1000u / FAKECUDA_PREFETCH_D2H_BYTES_PER_US), move = fc_move_ns(bytes);
    return copies > move ? copies - move : 0;
}

/* A UVM_DISCARD of [p, p+n): a fixed cost and a synchronous wait per VA block
 * (uvm_va_range_discard visits each block; uvm_va_block_discard waits for its tracker). */
int64_t fc_discard_ioctl_ns(uintptr_t p, size_t n)
{
    uint64_t blocks = n ? (p + n - 1) / FAKECUDA_VA_BLOCK - p / FAKECUDA_VA_BLOCK + 1 : 0;
    return (int64_t)(FAKECUDA_IOCTL_NS + blocks * FAKECUDA_BLOCK_PASS_NS);
}

uint64_t fc_cost_total_ns(void)
{
    uint64_t t = 0;
    for (int i = 0; i < FC_E_COUNT; i++)
        t += atomic_load_explicit(&fc_entry_ctr[i].caller_ns, memory_order_relaxed) +
             atomic_load_explicit(&fc_entry_ctr[i].worker_ns, memory_order_relaxed);
    return t;
}

uint64_t fc_va_lock_wait_ns(void) { return atomic_load_explicit(&fc_va_wait_ns, memory_order_relaxed); }

void fc_cost_reset(void)
{
    for (int i = 0; i < FC_E_COUNT; i++) {
        atomic_store_explicit(&fc_entry_ctr[i].calls, 0, memory_order_relaxed);
        atomic_store_explicit(&fc_entry_ctr[i].caller_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&fc_entry_ctr[i].worker_ns, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&fc_va_wait_ns, 0, memory_order_relaxed);
}

void fc_cost_write_json(FILE *f)
{
    fputs("{", f);
    for (int i = 0; i < FC_E_COUNT; i++) {
        struct fakecuda_entry_cost c;
        fakecuda_get_entry_cost(fc_entry_names[i], &c);
        fprintf(f, "%s\"%s\": {\"calls\": %llu, \"caller_ns\": %llu, \"worker_ns\": %llu}", i ? ", " : "",
                fc_entry_names[i], (unsigned long long)c.calls, (unsigned long long)c.caller_ns,
                (unsigned long long)c.worker_ns);
    }
    fputs("}", f);
}

FC_EXPORT const char *fakecuda_entry_name(unsigned i) { return i < FC_E_COUNT ? fc_entry_names[i] : NULL; }

FC_EXPORT int fakecuda_get_entry_cost(const char *entry, struct fakecuda_entry_cost *out)
{
    for (int i = 0; entry && out && i < FC_E_COUNT; i++) {
        if (strcmp(entry, fc_entry_names[i]) != 0) continue;
        out->calls = atomic_load_explicit(&fc_entry_ctr[i].calls, memory_order_relaxed);
        out->caller_ns = atomic_load_explicit(&fc_entry_ctr[i].caller_ns, memory_order_relaxed);
        out->worker_ns = atomic_load_explicit(&fc_entry_ctr[i].worker_ns, memory_order_relaxed);
        return 0;
    }
    return -1;
}
