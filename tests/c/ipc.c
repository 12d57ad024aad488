/* ipc.c: IPC handles under managed_all (tests/test_ipc.py). Each mode prints
 * one JSON line of two rounds of ipc_share (allocate, IS_MANAGED, take an IPC
 * handle, free):
 *   ipc library driver|runtime|async   done by the stand-in libnccl.so.2
 *   ipc program driver|runtime|async   done by this program itself
 *   ipc program managed                 memory the program allocated managed itself
 * "runtime": the allocation goes through the stand-in libcudart.so.13.
 * Why an imitation, not the real client (tests/test_real_client*.py): NCCL takes IPC
 * handles for its P2P transport between processes, which the real client's single process
 * never reaches; the stand-ins fix which library is the caller. */
#include <stdbool.h>
#include <string.h>

#include "cuda_api.h"
#include "ipc_share.h"

struct ipc_shared nccl_stand_in_share(const char *path);

int main(int argc, char **argv)
{
    bool library = argc == 3 && strcmp(argv[1], "library") == 0;
    bool program = argc == 3 && strcmp(argv[1], "program") == 0;
    if (!(library || program) ||
        (strcmp(argv[2], "driver") != 0 && strcmp(argv[2], "runtime") != 0 && strcmp(argv[2], "async") != 0 &&
         strcmp(argv[2], "managed") != 0)) {
        fprintf(stderr, "usage: ipc library|program driver|runtime|async|managed\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    struct ipc_shared round[2];
    for (int i = 0; i < 2; i++)
        round[i] = library ? nccl_stand_in_share(argv[2]) : ipc_share(argv[2]);
    printf("{\"managed\": [%d, %d], \"ipc\": [%d, %d]}\n", round[0].managed, round[1].managed, round[0].ipc,
           round[1].ipc);
    return 0;
}
