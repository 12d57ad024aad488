/* fakecuda_model.h: every timing and size constant of the fakecuda model, named and
 * documented in one place. fakecuda is a test tool: these figures make runs comparable
 * with each other (regression figures); they are not claims about any real GPU. */
#ifndef FAKECUDA_MODEL_H
#define FAKECUDA_MODEL_H

/* Residency granularity of managed memory: UVM's big page (UVM_BIG_PAGE_SIZE, 64 KiB on
 * Pascal and later), to which its fault-time prefetcher widens every faulted 4 KiB page
 * (uvm_perf_prefetch.c, grow_fault_granularity) unless the page is thrashing (not modelled).
 * One fault here is one 64 KiB page faulting in one batch (below). */
#define FAKECUDA_PAGE (64u * 1024u)

/* The byte a discarded page is filled with: as floats, NaN, so a kernel that reads dead
 * memory (a discard before its last use) changes a result visibly. */
#define FAKECUDA_DISCARD_POISON 0xFF

/* Managed allocations start on a 2 MiB boundary (the driver's large-page size). */
#define FAKECUDA_MANAGED_ALIGN (2u * 1024u * 1024u)

/* Host->device bandwidth of a migration, in bytes per microsecond: 25000 B/us = 25 GB/s,
 * a PCIe Gen4 x16 figure. A prefetch of N bytes keeps its stream busy N / this us. */
#define FAKECUDA_H2D_BYTES_PER_US 25000u

/* Device->host bandwidth of a CPU fault's copy (the host reading GPU-resident memory), same
 * PCIe figure: not measured as such (gpu-check's prefetch_bandwidth times the whole fault path,
 * 1.65 GB/s on the H100, FAKECUDA_CPU_FAULT_US's part included). */
#define FAKECUDA_D2H_BYTES_PER_US 25000u

/* Device->host rate of the driver's own evictions (a kernel's faults or an allocation needing
 * room on a full device): measured on an H100 80GB HBM3, driver 580: 11.28 GB/s for 1 GiB
 * evicted by plain allocations, 0.96x a prefetch to the host in the same run
 * (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3, preflight.json, probes.driver_evict; the
 * H200s read 10.0 GB/s, 0.62x). The whole rate, charged as each page's copy: the eviction's
 * other work inside it. */
#define FAKECUDA_EVICT_D2H_BYTES_PER_US 11280u

/* Device->host bandwidth of a prefetch to the CPU (cuMemPrefetchAsync to the host, the way
 * pump evicts): measured on an H100 80GB HBM3, PCIe Gen5 x16, driver 580: 11.24 GB/s for 1 GiB
 * (five samples 11.2 to 18.0; bench/results/gpu-20261124-nvidia-h100-80gb-hbm3, preflight.json,
 * probes.prefetch_bandwidth), where host->device prefetches met 49.8 GB/s on the same link: a
 * cost of the driver's path, not of the link, so taken as it is on this model's Gen4 link. */
#define FAKECUDA_PREFETCH_D2H_BYTES_PER_US 11240u

/* Fixed cost of servicing one GPU page fault, on top of moving the page: the kernel
 * stalls for this long per faulting 64 KiB page (one fault of a batch, below). With the
 * transfer (2.6 us per page) faulting runs at about 5 GB/s, well below prefetch: the gap
 * pump exists to close. Pages the driver's fault-time prefetcher adds to a batch pay their
 * transfer only. A batch adds nothing of its own (the kinder side for the baseline). A
 * measured streaming kernel faults about once per 64 KiB page with the prefetcher on (31,774
 * faults for 2 GiB, 386.6 ms: about 12 us a fault; bench/published, pascal-um.*), which a
 * whole-tensor burst here reproduces (every page faults in its batch). */
#define FAKECUDA_GPU_FAULT_US 10u

/* ---- The UVM driver's GPU fault path (kernel-open/nvidia-uvm, open-gpu-kernel-modules
 * 595.45.04). Each has a FAKECUDA_<SOURCE NAME> knob (stats.c) with the driver's valid range. */

/* Faults fetched and serviced per batch: uvm_perf_fault_batch_count (module parameter),
 * UVM_PERF_FAULT_BATCH_COUNT_DEFAULT in uvm_gpu_replayable_faults.c. The driver fetches up to
 * this many entries (fetch_fault_buffer_entries), sorts them by address
 * (preprocess_fault_batch), services them VA block by VA block (service_fault_batch ->
 * service_fault_batch_block) and replays, then fetches the next batch. Here one
 * fakecuda_touch call is one burst of a kernel's threads, all in flight at once: its faulting
 * 64 KiB pages, in address order, are the batches' entries. UVM's entries are 4 KiB faults
 * (up to 16 per big page), so its batches cover less: counting one per 64 KiB page makes
 * fewer, larger batches, the kinder side for the no-pump baseline. Knob range 1 to 65536. */
#define FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT 256u

/* The fault-time prefetcher (uvm_perf_prefetch.c): uvm_perf_prefetch_enable (default 1),
 * uvm_perf_prefetch_threshold (UVM_PREFETCH_THRESHOLD_DEFAULT 51, valid 0 to 100: a
 * subregion is migrated whole when more than this percentage of its pages are resident at
 * the destination or faulted in the batch; compute_prefetch_region) and
 * uvm_perf_prefetch_min_faults (UVM_PREFETCH_MIN_FAULTS_DEFAULT 1, valid 1 to 20: faults
 * migrated to the same processor in the block before it prefetches;
 * uvm_perf_prefetch_get_hint_va_block). fault_prefetch.c has the rule. */
#define FAKECUDA_UVM_PERF_PREFETCH_ENABLE 1u
#define FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD 51u
#define FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS 1u

/* Fixed cost of a CPU fault on a device-resident page (on the touching host thread). */
#define FAKECUDA_CPU_FAULT_US 10u

/* Delay between a launch call and the kernel's start on an idle stream: the window in
 * which an interposer's prefetch can get ahead of the kernel. */
#define FAKECUDA_LAUNCH_LATENCY_US 5u

/* ---- Host time of the driver's entry points (item: "the driver's host-side cost") ----
 * Charged to the thread that pays (the caller, or for ioctls with FAKECUDA_IOCTL_THREAD=worker
 * the stream's worker, standing for the driver's own thread), into the same per-thread debt
 * that a kernel's start waits for. Measured figures come from the three A100 profiler traces
 * in ../shared/data/kineto (HolisticTraceAnalysis tests/data, commit f4d0062), per trace by
 * fakecuda/measure_kineto.py; where a trace gives several medians, the smallest is taken
 * (it makes what pump adds per launch look largest). Where no source gives a number, it says
 * so and takes the end that makes pump look worse (dearer calls that pump makes). */

/* cuLaunchKernel and its forms: median cudaLaunchKernel host time, A100-SXM4-80GB trace
 * (5,240 calls: 4.0 us; the other two traces: 6.0 us over 8,568 and 9 us over 79). */
#define FAKECUDA_LAUNCH_HOST_NS 4000u

/* cuGraphLaunch: median cudaGraphLaunch, A100-SXM4-80GB trace (70 calls, 27.5 us). */
#define FAKECUDA_GRAPH_LAUNCH_HOST_NS 27500u

/* cuEventRecord: median cudaEventRecord, alexnet trace (30 calls, 1.5 us; the only trace
 * that records events). */
#define FAKECUDA_EVENT_RECORD_HOST_NS 1500u

/* cuStreamWaitEvent: median cudaStreamWaitEvent, 1 us in two traces (186 and 425 calls;
 * 0 us, below the traces' 1 us resolution, over 34 in the third): the larger is taken. */
#define FAKECUDA_STREAM_WAIT_EVENT_HOST_NS 1000u

/* cuEventQuery and cuStreamQuery: median cudaEventQuery is 0 us at the traces' 1 us
 * resolution (3,703 and 25,773 calls); charged the resolution, 1 us. cudaStreamQuery is in
 * no trace: charged as an event query. */
#define FAKECUDA_QUERY_HOST_NS 1000u

/* cuStreamIsCapturing / cuStreamGetCaptureInfo: median cudaStreamIsCapturing 1 us in two
 * traces (32 and 60 calls; 0 us over 225 in the third), cudaStreamGetCaptureInfo 0 us (2,232
 * calls): 1 us. Calls that read the context (cuCtxGetCurrent, cuCtxSetCurrent, cuCtxGetDevice,
 * cuCtxPushCurrent, cuCtxPopCurrent, cuStreamGetCtx) are in no trace (the runtime keeps them
 * to itself): no source; charged as a query, 1 us, the traces' resolution. */
#define FAKECUDA_CAPTURE_QUERY_HOST_NS 1000u
#define FAKECUDA_CONTEXT_QUERY_HOST_NS 1000u

/* cuPointerGetAttribute(s): median cudaPointerGetAttributes, trace_diff (150 calls, 1 us). */
#define FAKECUDA_POINTER_QUERY_HOST_NS 1000u

/* cuStreamSynchronize / cuEventSynchronize / cuCtxSynchronize, on top of the wait: the
 * smallest median cudaStreamSynchronize, trace_diff (60 calls, 3 us, mostly idle streams). */
#define FAKECUDA_SYNC_HOST_NS 3000u

/* cuMemcpy* and cuMemsetD* (each form, synchronous or not), on top of any wait: the smallest
 * median cudaMemcpyAsync (6 us, negative_queue_length rank0, 1,250 calls; 8 and 34.5 us in the
 * other traces) and cudaMemsetAsync (6 us, trace_diff, 654 calls; 7 and 12 us elsewhere):
 * the smallest, as for launches. */
#define FAKECUDA_MEMCPY_HOST_NS 6000u
#define FAKECUDA_MEMSET_HOST_NS 6000u

/* One ioctl into the UVM driver (UVM_MIGRATE for a prefetch, UVM_DISCARD for a discard): the
 * fixed part, entering the kernel, uvm_api_migrate's va_space and mmap locks, its service
 * context. Measured on an H100 (driver 580.159.04; bench/results/gpu-20261124-nvidia-h100-80gb-hbm3,
 * preflight.json, probes.prefetch_cost: a resident cuMemPrefetchAsync of 1, 4, 16 and 64 blocks,
 * fitted to this model's IOCTL + blocks x passes x BLOCK_PASS: 4.83 us and 0.58 us, all of it
 * the calling thread's CPU time). It replaces the 20 us chosen before any GPU. */
#define FAKECUDA_IOCTL_NS 4835u

/* Per 2 MiB VA block per pass of a UVM_MIGRATE, resident or not: uvm_migrate.c's
 * uvm_va_range_migrate_multi_block creates and locks each block (uvm_va_range_block_create,
 * UVM_VA_BLOCK_LOCK_RETRY) and uvm_va_block_migrate_locked checks its residency and
 * mappings even when nothing moves. Measured with FAKECUDA_IOCTL_NS (was 5 us, chosen). Also
 * the wait per block of UVM_DISCARD (uvm_va_block_discard waits for its tracker): not measured,
 * taken as a pass. */
#define FAKECUDA_BLOCK_PASS_NS 583u

/* Per 2 MiB of pages a UVM_MIGRATE moves, on the calling thread's CPU beside its passes (the
 * copy itself runs on the copy engine): the same H100 run's prefetch of host-resident blocks
 * to the GPU cost 19.6 us more per block than the resident one (25.4, 20.0, 18.8 and 19.6 us at
 * 1, 4, 16 and 64 blocks; 2 MiB in 19.6 us is faster than the link, so the call does not wait
 * for its copies). Charged pro rata per 64 KiB page moved, in both directions: a move to the
 * host was not measured (the probe's "to host" case measures it next; its copy wait is
 * charged as well, below). */
#define FAKECUDA_MIGRATE_BLOCK_NS 19575u

/* An RM call that maps, unmaps or reports memory (cuMemGetInfo, host registration, the VMM
 * calls; libcuda is closed): no measurement; 20 us is chosen, far above a bare syscall (~1 us)
 * and a measured UVM ioctl (FAKECUDA_IOCTL_NS). */
#define FAKECUDA_RM_CALL_NS 20000u

#define FAKECUDA_POOL_RESERVE_NS FAKECUDA_RM_CALL_NS
#define FAKECUDA_POOL_RELEASE_NS FAKECUDA_RM_CALL_NS

/* A memory pool's lookups and figures (cuDeviceGetMemPool, cuDeviceGetDefaultMemPool,
 * cuMemGetDefaultMemPool, cuMemPoolGetAttribute): in no trace; charged as a query, 1 us, the
 * traces' resolution, as the context queries are. */
#define FAKECUDA_POOL_QUERY_HOST_NS 1000u
/* cuTensorMapEncodeTiled / Im2col / Im2colWide / ReplaceAddress: a host-only encode of 128
 * bytes (cuda.h lists no stream, and nothing to wait for). No published measurement (CUTLASS
 * issue #3003 reports the calls showing in profiles between GEMM launches, no figure): charged
 * as a query, the kineto traces' 1 us resolution. */
#define FAKECUDA_TENSOR_MAP_HOST_NS 1000u

/* The UVM driver's VA block and root chunk: 2 MiB (UVM_VA_BLOCK_BITS 21 in
 * uvm_va_block_types.h; UVM_CHUNK_SIZE_MAX in uvm_pmm_gpu.h). Prefetch passes, discard waits
 * and device-memory eviction all go by it. */
#define FAKECUDA_VA_BLOCK (2u * 1024u * 1024u)

/* Modelled time is accumulated as a per-thread "debt" and slept off once it reaches
 * this many microseconds (oversleep is credited back, to work already waiting: stats.c), so
 * the model costs few syscalls. */
#define FAKECUDA_SLEEP_CHUNK_US 50u

/* Waits shorter than this are spun rather than slept (the launch latency is one). */
#define FAKECUDA_SPIN_US 100u

/* Devices: FAKECUDA_DEVICES (default, max), FAKECUDA_DEVICE_MEMORY (default bytes). */
#define FAKECUDA_DEFAULT_DEVICES 1
#define FAKECUDA_MAX_DEVICES 64 /* as many as pump names (shim/policy/residency.c, pump/channel.py) */
#define FAKECUDA_DEFAULT_DEVICE_MEMORY (80ull << 30)

/* Driver version reported (and gating entry points): FAKECUDA_DRIVER_VERSION. */
#define FAKECUDA_DEFAULT_DRIVER_VERSION 13000

/* Alignment of plain device allocations (cuMemAlloc guarantees at least 256 bytes). */
#define FAKECUDA_PLAIN_ALIGN 256u

#endif
