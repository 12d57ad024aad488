/* fakecuda_model.h: every timing and size constant of the fakecuda model, named and
 * documented in one place. fakecuda is a test tool: these figures make runs comparable
 * with each other (regression figures); they are not claims about any real GPU. */
#ifndef FAKECUDA_MODEL_H
#define FAKECUDA_MODEL_H

/* Residency granularity of managed memory: the driver migrates managed memory on GPU
 * faults in 64 KiB blocks, so one fault = one 64 KiB page here. */
#define FAKECUDA_PAGE (64u * 1024u)

/* The byte a discarded page is filled with: as floats, NaN, so a kernel that reads dead
 * memory (a discard before its last use) changes a result visibly. */
#define FAKECUDA_DISCARD_POISON 0xFF

/* Managed allocations start on a 2 MiB boundary (the driver's large-page size). */
#define FAKECUDA_MANAGED_ALIGN (2u * 1024u * 1024u)

/* Host->device bandwidth of a migration, in bytes per microsecond: 25000 B/us = 25 GB/s,
 * a PCIe Gen4 x16 figure. A prefetch of N bytes keeps its stream busy N / this us. */
#define FAKECUDA_H2D_BYTES_PER_US 25000u

/* Device->host bandwidth (prefetch to the CPU and CPU faults), same PCIe figure. */
#define FAKECUDA_D2H_BYTES_PER_US 25000u

/* Fixed cost of servicing one GPU page fault, on top of moving the page: the kernel
 * stalls for this long per faulting 64 KiB page. With the transfer (2.6 us per page)
 * faulting runs at about 5 GB/s, well below prefetch: the gap pump exists to close. */
#define FAKECUDA_GPU_FAULT_US 10u

/* Fixed cost of a CPU fault on a device-resident page (on the touching host thread). */
#define FAKECUDA_CPU_FAULT_US 10u

/* Delay between a launch call and the kernel's start on an idle stream: the window in
 * which an interposer's prefetch can get ahead of the kernel. */
#define FAKECUDA_LAUNCH_LATENCY_US 5u

/* Modelled time is accumulated as a per-thread "debt" and slept off once it reaches
 * this many microseconds (oversleep is credited back), so the model costs few syscalls. */
#define FAKECUDA_SLEEP_CHUNK_US 50u

/* Waits shorter than this are spun rather than slept (the launch latency is one). */
#define FAKECUDA_SPIN_US 100u

/* Devices: FAKECUDA_DEVICES (default, max), FAKECUDA_DEVICE_MEMORY (default bytes). */
#define FAKECUDA_DEFAULT_DEVICES 1
#define FAKECUDA_MAX_DEVICES 64 /* as many as pump names (shim/residency.c, pump/channel.py) */
#define FAKECUDA_DEFAULT_DEVICE_MEMORY (80ull << 30)

/* Driver version reported (and gating entry points): FAKECUDA_DRIVER_VERSION. */
#define FAKECUDA_DEFAULT_DRIVER_VERSION 13000

/* Alignment of plain device allocations (cuMemAlloc guarantees at least 256 bytes). */
#define FAKECUDA_PLAIN_ALIGN 256u

/* Modelled compute capability and SM count reported by cuDeviceGetAttribute. */
#define FAKECUDA_CC_MAJOR 9
#define FAKECUDA_CC_MINOR 0
#define FAKECUDA_SM_COUNT 132

#endif
