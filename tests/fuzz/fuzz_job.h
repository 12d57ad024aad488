/* fuzz_job.h: the program the fuzz targets run under the shim (linked in, as
 * in the sanitizer test variants) on fakecuda: FUZZ_BUFFERS managed buffers
 * and one kernel over two of them, with a host-side copy of what every
 * buffer must hold. Whatever pumpd's ring and plan say, the shim may only
 * move memory, never change it: fuzz_job_check aborts (a crash the fuzzer
 * reports) when a buffer differs from its copy. */
#ifndef PUMP_FUZZ_JOB_H
#define PUMP_FUZZ_JOB_H
#include <stdint.h>

#define FUZZ_BUFFERS 4
/* Bytes per buffer: one whole 2 MiB block and half of another. */
#define FUZZ_BUFFER_BYTES (5u << 19)

/* Once per process: the driver, a context, a stream, the kernel, the buffers.
 * Exits with a message when the shim is not alone (PUMP_SOCKET must be empty:
 * the targets attach the shim themselves, no worker thread may). */
void fuzz_job_start(void);
uint64_t fuzz_job_base(unsigned buffer);
/* The launch key (pump_channel.h) of fuzz_job_launch(x, y). */
uint64_t fuzz_job_key(unsigned x, unsigned y);
/* x = x * 3 + y + 1 over 32-bit words, through the shim's cuLaunchKernel;
 * x != y (modulo FUZZ_BUFFERS). */
void fuzz_job_launch(unsigned x, unsigned y);
/* The CPU reads a buffer (the driver moves it back to the host). */
void fuzz_job_host_read(unsigned buffer);
/* Waits for the kernels; aborts unless every buffer holds what it must. */
void fuzz_job_check(void);
/* Open descriptors in this process (a target that leaks one aborts). */
int fuzz_open_descriptors(void);

#endif
