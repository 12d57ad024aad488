/* selftest_launch_uses.c: why it exists: fakecuda's self-test of FAKECUDA_LAUNCH_USES
 * (launch_uses.c), in a child process of its own (selftest.c runs it): a launch at a recorded
 * position touches its recorded operands, named by allocation order or by where an argument of
 * the launch points (the pointer this run passes, not the recording's); a line naming another
 * kernel, an allocation this run lacks, an argument word past the arguments or memory too
 * small for the operand is counted as a mismatch and touches nothing it cannot place; a
 * position without a line is counted missing; each thread has its own positions, numbered by
 * its first launch. And the dead moves (bytes_dead_h2d, bytes_dead_d2h): a page's crossings of
 * the link count as dead where a `w` operand overwrites the whole page, or a discard drops it,
 * before anything reads it; a read, or a write of part of the page, makes them live. */
#define _GNU_SOURCE /* mkstemp, fdopen, setenv */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fakecuda.h"
#include "selftest.h"

#define MiB (1024ull * 1024ull)
#define U(x) ((unsigned long long)(x))

static CUfunction fbodiless, fpointer;
static CUstream st;

/* A kernel whose body touches nothing, as an image's kernel on fakecuda. */
static void k_bodiless(void **params, const fakecuda_dims *d)
{
    (void)params;
    (void)d;
}

static int setup(void)
{
    static const size_t pointer_sizes[] = { 4, 8 }, pointer_aligns[] = { 4, 8 }; /* (int n, float *p) */
    fakecuda_register_kernel("bodiless", k_bodiless, 0, NULL, NULL);
    fakecuda_register_kernel("pointer", k_bodiless, 2, pointer_sizes, pointer_aligns);
    CUcontext c;
    CUmodule m;
    return cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuModuleLoadData(&m, "x") ||
                   cuModuleGetFunction(&fbodiless, m, "bodiless") || cuModuleGetFunction(&fpointer, m, "pointer") ||
                   cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)
               ? -1
               : 0;
}

static void launch(void)
{
    OK(cuLaunchKernel(fbodiless, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
}

/* The pointer kernel given p: its argument word at byte 8 holds p. */
static void launch_pointer(CUdeviceptr p)
{
    int n = 0;
    void *params[] = { &n, &p };
    OK(cuLaunchKernel(fpointer, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
}

static CUdeviceptr host_filled(size_t n)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
    fakecuda_host_touch((void *)(uintptr_t)p, n);
    return p;
}

/* Launches once; its positions before and after, for the main thread to check (CHECK is not
   thread-safe). */
struct positions { int before_thread, after_thread; uint64_t before, after; };
static void *second_thread(void *arg)
{
    struct positions *p = arg;
    fakecuda_launch_position(&p->before_thread, &p->before);
    launch();
    fakecuda_launch_position(&p->after_thread, &p->after);
    return NULL;
}

int selftest_child_launch_uses(void)
{
    if (setup() != 0) return -1;
    CUdeviceptr a = host_filled(4 * MiB), b = host_filled(2 * MiB);
    uint64_t ord_a = 0, ord_b = 0, offset = 1, size = 0;
    CHECK(fakecuda_allocation_of((void *)(uintptr_t)a, &ord_a, &offset, &size) && offset == 0 && size == 4 * MiB,
          "allocation_of a's base");
    CHECK(fakecuda_allocation_of((void *)(uintptr_t)(b + 100), &ord_b, &offset, &size) && offset == 100 &&
          size == 2 * MiB && ord_b == ord_a + 1, "allocation_of inside b: made after a (%llu, %llu)", U(ord_a),
          U(ord_b));
    CHECK(!fakecuda_allocation_of((void *)&ord_a, NULL, NULL, NULL), "allocation_of the host's memory");

    char path[] = "/tmp/fakecuda-launch-uses-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) return -1;
    fprintf(f, "fakecuda-launch-uses 1\n");
    fprintf(f, "0 0 bodiless 1 %llu:0:%llu:rw\n", U(ord_a), U(4 * MiB));   /* all of a, written */
    fprintf(f, "0 1 bodiless 1 %llu:65536:131072:r\n", U(ord_b));          /* two pages of b, read */
    fprintf(f, "0 2 another 1 %llu:0:65536:r\n", U(ord_b));                /* another kernel's line */
    /* launch 3: no line */
    fprintf(f, "0 4 bodiless 2 999:0:65536:r %llu:0:65536:r\n", U(ord_b)); /* an allocation not made */
    /* launches 5..8 follow the pointer kernel's argument (word 8): the pointer this run passes */
    fprintf(f, "0 5 pointer 1 @8:-65536:131072:r\n");   /* c's first two pages, from a pointer 64 KiB in */
    fprintf(f, "0 6 pointer 1 @8:0:4194304:r\n");       /* 4 MiB from b's base: b holds 2 MiB */
    fprintf(f, "0 7 pointer 1 @16:0:65536:r\n");        /* a word past the 16 bytes of arguments */
    fprintf(f, "0 8 pointer 1 @8:0:0:r\n");             /* nothing */
    fprintf(f, "1 0 bodiless 0\n");
    fclose(f);
    CUdeviceptr c = host_filled(2 * MiB);
    setenv("FAKECUDA_LAUNCH_USES", path, 1);

    fakecuda_reset_stats();
    for (int i = 0; i < 5; i++) launch();
    OK(cuCtxSynchronize());
    struct fakecuda_stats named = selftest_stats();
    launch_pointer(c + 65536);
    OK(cuCtxSynchronize());
    struct fakecuda_stats followed = selftest_stats();
    CHECK(followed.bytes_h2d - named.bytes_h2d >= 131072 && followed.gpu_faults > named.gpu_faults &&
          followed.launch_uses_mismatched == named.launch_uses_mismatched,
          "an operand from the launch's argument: c's pages touched (%llu bytes in)",
          U(followed.bytes_h2d - named.bytes_h2d));
    CHECK(named.gpu_faults_unpointed == named.gpu_faults && named.gpu_faults >= 64 + 2 &&
              followed.gpu_faults_unpointed == named.gpu_faults_unpointed,
          "faults on operands named by allocation counted apart (%llu of %llu), not those from the argument "
          "(%llu after)", U(named.gpu_faults_unpointed), U(named.gpu_faults), U(followed.gpu_faults_unpointed));
    launch_pointer(b);
    launch_pointer(c);
    launch_pointer(c);
    pthread_t t;
    struct positions second = { -2, -2, 1, 0 };
    if (pthread_create(&t, NULL, second_thread, &second) != 0) return -1;
    pthread_join(t, NULL);
    CHECK(second.before_thread == -1 && second.before == 0, "a thread that has not launched has no position "
          "(%d, %llu)", second.before_thread, U(second.before));
    CHECK(second.after_thread == 1 && second.after == 1, "the second thread to launch is thread 1 (%d, %llu)",
          second.after_thread, U(second.after));
    OK(cuCtxSynchronize());
    unlink(path);
    int thread = -2;
    uint64_t launches = 0;
    fakecuda_launch_position(&thread, &launches);
    CHECK(thread == 0 && launches == 9, "the first thread to launch is thread 0, after 9 launches (%d, %llu)", thread,
          U(launches));
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.launches_given_uses == 8 && s.launch_uses_mismatched == 5 && s.launch_uses_missing == 1,
          "given 8 (0, 1, 4..8 and thread 1's), mismatched 5 (2, 4, 6, 7, 8), missing 1 (3): %llu, %llu, %llu",
          U(s.launches_given_uses), U(s.launch_uses_mismatched), U(s.launch_uses_missing));
    /* a's 4 MiB, b's two pages and c's two (the fault-time prefetcher may widen them within
       their blocks), and launch 4's one page of b, already there; nothing for 6, 7, 8 */
    CHECK(s.bytes_h2d >= 4 * MiB + 2 * 131072 && s.bytes_h2d <= 8 * MiB && s.gpu_faults >= 64 + 2 + 2,
          "the recorded operands were touched: %llu bytes in, %llu faults", U(s.bytes_h2d), U(s.gpu_faults));
    CHECK(s.kernels_run == 10, "every launch ran (%llu)", U(s.kernels_run));
    return failed ? 1 : 0;
}

/* Launches the bodiless kernel and waits for it. */
static void launch_and_wait(void)
{
    launch();
    OK(cuStreamSynchronize(st));
}

static void to_host(CUdeviceptr p, size_t n)
{
    CUmemLocation host = { .type = CU_MEM_LOCATION_TYPE_HOST, .id = 0 };
    OK(cuMemPrefetchAsync(p, n, host, 0, st));
    OK(cuStreamSynchronize(st));
}

static void discard(CUdeviceptr p, size_t n)
{
    OK(cuMemDiscardBatchAsync(&p, &n, 1, 0, st));
    OK(cuStreamSynchronize(st));
}

int selftest_child_dead_moves(void)
{
    if (setup() != 0) return -1;
    const uint64_t page = 65536, all = 2 * MiB;
    CUdeviceptr x = host_filled(all);
    uint64_t ordinal = 0;
    if (!fakecuda_allocation_of((void *)(uintptr_t)x, &ordinal, NULL, NULL)) return -1;
    char path[] = "/tmp/fakecuda-dead-moves-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) return -1;
    fprintf(f, "fakecuda-launch-uses 1\n");
    fprintf(f, "0 0 bodiless 1 %llu:0:%llu:w\n", U(ordinal), U(all));            /* all of x, overwritten */
    fprintf(f, "0 1 bodiless 1 %llu:0:%llu:r\n", U(ordinal), U(page));           /* its first page, read */
    fprintf(f, "0 2 bodiless 1 %llu:100:%llu:w\n", U(ordinal), U(all - 100));     /* all but 100 bytes */
    fprintf(f, "0 3 bodiless 1 %llu:0:%llu:rw\n", U(ordinal), U(all));           /* all of x, read and written */
    fprintf(f, "0 4 bodiless 1 %llu:0:%llu:rw\n", U(ordinal), U(all));           /* again */
    fclose(f);
    setenv("FAKECUDA_LAUNCH_USES", path, 1);
    fakecuda_reset_stats();
    launch_and_wait();
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.bytes_h2d == all && s.bytes_dead_h2d == all && s.bytes_dead_d2h == 0,
          "bytes brought in to be overwritten whole are dead (%llu of %llu in, %llu out)", U(s.bytes_dead_h2d),
          U(s.bytes_h2d), U(s.bytes_dead_d2h));
    to_host(x, all);
    fakecuda_reset_stats();
    launch_and_wait();  /* page 0 read: its way out and back in were needed */
    launch_and_wait();  /* pages 1..31 overwritten: out and in (by fault or the driver's prefetcher) for nothing */
    s = selftest_stats();
    CHECK(s.bytes_dead_d2h == all - page && s.bytes_dead_h2d == all - page && s.bytes_h2d == all,
          "a page read, then written in part, had its moves live, the pages overwritten whole dead "
          "(%llu out, %llu in dead; %llu in)", U(s.bytes_dead_d2h), U(s.bytes_dead_h2d), U(s.bytes_h2d));
    fakecuda_reset_stats();
    to_host(x, all);
    launch_and_wait();  /* read and written: its pages' ways out and back in were needed */
    discard(x, all);
    s = selftest_stats();
    CHECK(s.bytes_h2d == all && s.bytes_dead_h2d == 0 && s.bytes_dead_d2h == 0,
          "pages read and written, then discarded, were moved for their use (%llu in, %llu out dead)",
          U(s.bytes_dead_h2d), U(s.bytes_dead_d2h));
    launch_and_wait();  /* read and written again: populated where they are, nothing moves */
    to_host(x, all);
    discard(x, all);
    s = selftest_stats();
    CHECK(s.bytes_dead_h2d == 0 && s.bytes_dead_d2h == all && s.bytes_d2h_all == 2 * all,
          "pages copied out and then discarded were copied for nothing (%llu of %llu out dead)",
          U(s.bytes_dead_d2h), U(s.bytes_d2h_all));
    unlink(path);
    return failed ? 1 : 0;
}
