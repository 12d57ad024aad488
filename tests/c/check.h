/* check.h: what every C test program needs, whichever way it reaches the
 * driver: CHECK (a driver call that fails ends the program with status 3,
 * naming the call) and a checksum of result bytes. */
#ifndef PUMP_TEST_CHECK_H
#define PUMP_TEST_CHECK_H
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult check_result_ = (call);                                        \
        if (check_result_ != CUDA_SUCCESS) {                                    \
            fprintf(stderr, "error: %s returned %d\n", #call, (int)check_result_); \
            exit(3);                                                            \
        }                                                                       \
    } while (0)

/* FNV-1a over bytes: results compared bit for bit between runs. */
__attribute__((unused)) static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif
