/* fakecuda.h: the test-side API of fakecuda, a CPU model of the CUDA
 * driver API subset that libpump uses. These names are exported from libcuda.so.1 so a
 * test program can link them (-lcuda) or dlsym them from a dlopen'ed libcuda.so.1.
 * Kept free of anything but these declarations on purpose. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fakecuda_dims { unsigned grid[3], block[3]; unsigned shared_mem; } fakecuda_dims;
typedef void (*fakecuda_kernel_fn)(void **params, const fakecuda_dims *dims);

/* Registers a kernel by name; nparams parameters with the given sizes and alignments
   (offsets follow natural C layout). Returns 0 on success. */
int fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn, unsigned nparams,
                             const size_t *sizes, const size_t *aligns);
/* A kernel whose launch returns at once without enqueuing anything: the cost floor for
   measuring what an interposer adds per launch. Still validates the handle. */
int fakecuda_register_noop_kernel(const char *name, unsigned nparams, const size_t *sizes,
                                  const size_t *aligns);
/* Called by kernels for the memory they access: counts faults and migrates pages of
   managed memory to the kernel's device. An access that may write; fakecuda_touch_read is
   one that only reads (the difference shows on read-mostly memory: a read duplicates a
   page, a write collapses the duplicates). */
void fakecuda_touch(const void *ptr, size_t bytes);
void fakecuda_touch_read(const void *ptr, size_t bytes);
/* Called by a kernel that computes for ns nanoseconds beside its accesses: its stream is busy
   that long more (modelled time; a replayed trace's kernel takes its modelled time). Only
   in a kernel, on its stream: anywhere else it does nothing. */
void fakecuda_compute(uint64_t ns);
/* Called by kernels given a TMA descriptor (a CUtensorMap made by cuTensorMapEncode*):
   touches every byte from its global address to the tensor's last element, as the kernel's
   TMA copies would. Aborts on 128 bytes fakecuda did not encode. */
void fakecuda_tensor_map_touch(const void *tensor_map);
/* Called by the host program before it reads or writes managed memory itself:
   host-resident afterwards (CPU faults counted). */
void fakecuda_host_touch(const void *ptr, size_t bytes);

struct fakecuda_stats {
    uint64_t gpu_faults, cpu_faults, pages_touched_by_kernels, bytes_prefetched_h2d,
        bytes_prefetched_unused, bytes_faulted_h2d, bytes_d2h, kernels_run, launches,
        prefetch_calls, batch_prefetch_calls;
    /* Managed bytes resident on devices: now (all devices), and the most any one
       device held since the last reset (how far a budget was exceeded). */
    uint64_t device_resident_bytes, device_resident_peak;
    /* Bytes of whole pages discarded (cuMemDiscardBatchAsync): left unpopulated, their
       contents poisoned, so that reading dead memory shows in a result. */
    uint64_t bytes_discarded;
    /* Stream-ordered allocations that reused memory freed earlier on the same stream
       (from the same pool, of the same size), before that free had run on the stream. */
    uint64_t allocations_reused;
    /* Modelled host time of driver entry points, whoever paid (fakecuda_get_entry_cost
       splits it by entry point and payer). */
    uint64_t driver_host_ns;
    /* The UVM driver's own eviction of managed memory from a device that needed room (a
       fault, a prefetch, or a plain allocation through PMA's callbacks): 2 MiB root chunks
       evicted, bytes copied device->host by them, and bytes of evicted pages that later
       came back to a device (faulted or prefetched in again). */
    uint64_t driver_evictions, bytes_evicted_d2h, bytes_evicted_h2d;
    /* Time allocations and frees waited for the va_space lock held by ioctls. */
    uint64_t va_lock_wait_ns;
    /* Memory pools: bytes of new backing memory reserved for stream-ordered allocations
       (each such allocation is populated anew: a managed pool's pages fault or are
       prefetched again), and bytes released to the OS (at synchronisations above a pool's
       release threshold, by cuMemPoolTrimTo, or when a pool is destroyed). */
    uint64_t pool_bytes_reserved, pool_bytes_released;
    /* The GPU fault path as UVM's: batches of faults serviced (gpu_faults counts their
       faulting 64 KiB pages), the time kernels stalled for them (fault service, transfers
       and the evictions that made room), and bytes the driver's fault-time prefetcher moved
       host->device besides the faulted pages (in bytes_faulted_h2d too). */
    uint64_t gpu_fault_batches, gpu_fault_stall_ns, bytes_fault_prefetched_h2d;
    /* Every byte over the link each way: bytes_faulted_h2d + bytes_prefetched_h2d, and
       bytes_d2h + bytes_evicted_d2h. */
    uint64_t bytes_h2d, bytes_d2h_all;
    /* Accepted launches by the kind of handle they named: a CUfunction (cuModuleGetFunction,
       cuKernelGetFunction) or a CUkernel (cuLibraryGetKernel) cast to CUfunction. */
    uint64_t launches_by_function, launches_by_kernel;
    /* FAKECUDA_LAUNCH_USES (launch_uses.c): launches given their recorded operands, launches
       the file has no line for, and launches whose line names another kernel or an operand
       no allocation of this run holds (given what did match, if anything). */
    uint64_t launches_given_uses, launch_uses_missing, launch_uses_mismatched;
    /* Discards that ran while a migration of their pages on another stream, enqueued before
       them, had not completed (undefined behaviour: discard_races.c), or that were asked for
       on a busy stream, and bytes written there later that were lost, as a stuck discard
       status loses them. */
    uint64_t discard_races, bytes_lost_to_discard_races;
    /* cuGetProcAddress calls asking for a CUDA version above the driver's: the 580 driver
       (CUDA 13.0) refused two such lookups of pump's with CUDA_ERROR_INVALID_VALUE, which
       compute-sanitizer reports (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3); answered
       here as before, and counted since load (fakecuda_reset_stats leaves it: lookups are
       made before a program measures). */
    uint64_t lookups_above_driver;
    /* Bytes of pages a kernel or a copy read (FAKECUDA_LAUNCH_USES' r and rw operands that the
       launch's own argument points into, a copy's source) while their contents were lost to a
       discard and nothing had written them since: cuda.h, cuMemDiscardBatchAsync: "Reading
       from a discarded range, without a subsequent write or prefetch to that part of the
       range, will return an indeterminate value". A prefetch does not count as a write here:
       it brings back no bytes. A real program's kernels compute nothing on fakecuda, so this
       is where a discard of live memory shows. It over-counts, the strict side: a replayed
       write named by allocation (launch_uses.c) lands where the recording's allocator put the
       tensor, and the page this run's kernel wrote stays counted as lost. */
    uint64_t bytes_read_discarded;
    /* Of gpu_faults, those a replayed launch (FAKECUDA_LAUNCH_USES) took on operands named by
       allocation: no word of the recorded launch's arguments pointed into them, or several did
       (launch_uses.c). A prefetcher that reads a launch's arguments, as pump's does, is given
       no pointer to such memory, and the replay may place it elsewhere than this run's kernel
       would: how much of a run's faults rest on the recording's reading, not on the kernel's
       own arguments. */
    uint64_t gpu_faults_unpointed;
    /* Bytes that crossed the link for nothing (issue 41: "no dead byte crosses the link"): of
       bytes_h2d and bytes_d2h_all, the 64 KiB pages moved (each way, counted once a crossing)
       that nothing read before a kernel overwrote the whole page (a FAKECUDA_LAUNCH_USES `w`
       operand covering it) or a discard dropped it: the page's value there was dead. Moves of a
       page that is read next, or touched in part, or by the host, are not counted. */
    uint64_t bytes_dead_h2d, bytes_dead_d2h;
};
void fakecuda_get_stats(struct fakecuda_stats *out); /* call after synchronizing */
/* Contexts made on a device since load: primary context activations (a retain with no
   references left) and cuCtxCreate calls; -1 for a device number out of range. */
int fakecuda_contexts_created(int device);
void fakecuda_reset_stats(void);

/* Per entry point ("launch", "prefetch", ...: fakecuda_entry_name(i) for i = 0, 1, ... until
   NULL): calls, and modelled host ns paid by the calling thread and by a driver worker
   (FAKECUDA_IOCTL_THREAD=worker: a prefetch's or discard's ioctl). 0, or -1 for an unknown
   name. fakecuda_reset_stats zeroes them. */
struct fakecuda_entry_cost { uint64_t calls, caller_ns, worker_ns; };
int fakecuda_get_entry_cost(const char *entry, struct fakecuda_entry_cost *out);
const char *fakecuda_entry_name(unsigned i);
/* The modelled host ns charged to the calling thread since it began: entry points it called,
   and the evictions its plain allocations made (a stream's worker paying an ioctl with
   FAKECUDA_IOCTL_THREAD=worker is charged there, not on the caller); fakecuda_reset_stats
   leaves it. */
uint64_t fakecuda_thread_host_ns(void);
/* As if the calling thread had just overslept ns (at most 1 ms is kept): the credit a sleep
   that ran long gives its thread's modelled work, which selftest_clock.c needs on demand. */
void fakecuda_credit_oversleep(uint64_t ns);

/* What clients asked for and fakecuda lacks (not_found.c), by kind: 0 cuGetProcAddress symbols
   answered SYMBOL_NOT_FOUND, 1 cuGetExportTable ids refused, 2 calls to an export table's
   unmodelled slot. The sum of their counts since load; FAKECUDA_STATS names them. */
uint64_t fakecuda_not_found_count(int kind);

/* For a recording of what each launch touches (launch_uses.c, FAKECUDA_LAUNCH_USES): the
   calling thread's launch position, *thread its number (threads are numbered in the order of
   their first launch; -1 before this thread's first) and *launches the launches it made so far.
   A recorder reads it before and after a library call: the launches between are the call's. */
void fakecuda_launch_position(int *thread, uint64_t *launches);
/* The allocation holding ptr: *ordinal its place in the order allocations were made (1, 2, ...:
   cuMemAlloc*, managed, pool and cuMemMap mappings alike), *offset ptr's offset in it, *size
   its size. 0 if no allocation holds ptr. */
int fakecuda_allocation_of(const void *ptr, uint64_t *ordinal, uint64_t *offset, uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif
