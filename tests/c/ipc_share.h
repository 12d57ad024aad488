/* ipc_share.h: what a library that shares device memory with other processes
 * does, as NCCL's P2P transport probes "legacy IPC": allocate device memory
 * (through the driver, the CUDA runtime's cudaMalloc, or stream-ordered), take
 * an IPC handle of it, free it. Compiled into each object that calls it, so the
 * driver sees that object as the caller: the stand-in libnccl.so.2
 * (ipc_library.c) and the ordinary program (ipc.c). */
#ifndef PUMP_TEST_IPC_SHARE_H
#define PUMP_TEST_IPC_SHARE_H
#include <stddef.h>
#include <string.h>

#include "check.h"

/* The stand-in CUDA runtime's allocation (ipc_runtime.c, libcudart.so.13). */
int cudaMalloc(void **ptr, size_t size);

struct ipc_shared {
    int managed;  /* CU_POINTER_ATTRIBUTE_IS_MANAGED of the allocation */
    int ipc;      /* what cuIpcGetMemHandle returned; -1: not asked (stream-ordered memory) */
};

/* path: "driver" (cuMemAlloc), "runtime" (cudaMalloc), "async" (cuMemAllocAsync) or "managed"
 * (cuMemAllocManaged). */
__attribute__((unused)) static struct ipc_shared ipc_share(const char *path)
{
    enum { SIZE = 2 << 20 };
    CUdeviceptr buffer = 0;
    if (strcmp(path, "async") == 0) {
        CHECK(cuMemAllocAsync(&buffer, SIZE, NULL));
        unsigned int managed = 0;
        CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, buffer));
        CHECK(cuMemFreeAsync(buffer, NULL));
        CHECK(cuStreamSynchronize(NULL));
        return (struct ipc_shared){(int)managed, -1};
    }
    if (strcmp(path, "runtime") == 0) {
        void *p = NULL;
        if (cudaMalloc(&p, SIZE) != 0) {
            fprintf(stderr, "error: cudaMalloc failed\n");
            exit(3);
        }
        buffer = (CUdeviceptr)(uintptr_t)p;
    } else if (strcmp(path, "managed") == 0) {
        CHECK(cuMemAllocManaged(&buffer, SIZE, CU_MEM_ATTACH_GLOBAL));  /* managed by the program's choice */
    } else {
        CHECK(cuMemAlloc(&buffer, SIZE));
    }
    struct ipc_shared shared = {0, 0};
    unsigned int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, buffer));
    shared.managed = (int)managed;
    CUipcMemHandle handle;
    shared.ipc = (int)cuIpcGetMemHandle(&handle, buffer);
    CHECK(cuMemFree(buffer));
    return shared;
}

#endif
