/* ipc.c: IPC handles under managed_all (tests/test_ipc.py). Each mode prints
 * one JSON line of two rounds of ipc_share (allocate, IS_MANAGED, take an IPC
 * handle, free):
 *   ipc library driver|runtime   done by the stand-in libnccl.so.2
 *   ipc program driver|runtime   done by this program itself
 *   ipc own_managed              a handle of the program's own cuMemAllocManaged memory
 * "runtime": the allocation goes through the stand-in libcudart.so.13. */
#include <string.h>

#include "cuda_api.h"
#include "ipc_share.h"

struct ipc_shared nccl_stand_in_share(bool through_runtime);

static struct ipc_shared own_managed(void)
{
    CUdeviceptr buffer;
    CHECK(cuMemAllocManaged(&buffer, 2 << 20, CU_MEM_ATTACH_GLOBAL));
    CUipcMemHandle handle;
    struct ipc_shared shared = {1, (int)cuIpcGetMemHandle(&handle, buffer)};
    CHECK(cuMemFree(buffer));
    return shared;
}

int main(int argc, char **argv)
{
    bool library = argc == 3 && strcmp(argv[1], "library") == 0;
    bool program = argc == 3 && strcmp(argv[1], "program") == 0;
    bool runtime = argc == 3 && strcmp(argv[2], "runtime") == 0;
    bool managed = argc == 2 && strcmp(argv[1], "own_managed") == 0;
    if (!(library || program || managed) || (argc == 3 && !runtime && strcmp(argv[2], "driver") != 0)) {
        fprintf(stderr, "usage: ipc library|program driver|runtime | ipc own_managed\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    struct ipc_shared round[2];
    for (int i = 0; i < 2; i++)
        round[i] = managed ? own_managed() : library ? nccl_stand_in_share(runtime) : ipc_share(runtime);
    printf("{\"managed\": [%d, %d], \"ipc\": [%d, %d]}\n", round[0].managed, round[1].managed, round[0].ipc,
           round[1].ipc);
    return 0;
}
