/* fork.c: fork on either side of CUDA initialisation.
 *
 *   fork before   the child is forked before CUDA is used, then uses CUDA
 *                 itself: pump works there as anywhere (no faults).
 *   fork after    the parent uses CUDA, then forks: the child (which must not
 *                 use CUDA) runs ordinary code and exits normally, pump
 *                 standing aside in it; the parent keeps working.
 * Prints one JSON line per process that used CUDA.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_api.h"

#define FLOATS ((size_t)1 << 22) /* 16 MiB */



/* Uses CUDA: host-writes a buffer, increments it on the GPU, checks it. */
static int workload(const char *who)
{
    static int started;
    if (!started) {
        cuda_api_start(&api);
        started = 1;
    }
    CUmodule module;
    CUfunction inc;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&inc, module, "inc"));
    CUdeviceptr buffer;
    CHECK(api.mem_alloc_managed(&buffer, FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *x = (float *)buffer;
    api.host_touch(x, FLOATS * sizeof *x);
    memset(x, 0, FLOATS * sizeof *x);
    struct fakecuda_stats before, after;
    api.get_stats(&before);
    uint64_t n = FLOATS;
    void *params[] = {&buffer, &n};
    CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    CHECK(api.ctx_synchronize());
    api.get_stats(&after);
    api.host_touch(x, FLOATS * sizeof *x);
    int ok = x[0] == 1.0f && x[FLOATS - 1] == 1.0f;
    CHECK(api.mem_free(buffer));
    printf("{\"who\": \"%s\", \"pid\": %d, \"ok\": %s, \"gpu_faults\": %llu}\n", who, (int)getpid(),
           ok ? "true" : "false", (unsigned long long)(after.gpu_faults - before.gpu_faults));
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "before") && strcmp(argv[1], "after"))) {
        fprintf(stderr, "usage: fork before|after\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    if (api.register_kernel("inc", inc_kernel, 2, sizes, aligns))
        return 3;
    int before = strcmp(argv[1], "before") == 0;
    int status = 0;
    if (!before)
        status |= workload("parent");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        if (before)
            exit(workload("child"));
        /* CUDA is off limits here; ordinary work and a normal exit. */
        long total = 0;
        for (int i = 0; i < 1000; i++)
            total += i;
        exit(total == 499500 ? 0 : 1);
    }
    int child_status;
    waitpid(child, &child_status, 0);
    if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0)
        status |= 1;
    if (!before)
        status |= workload("parent-after-fork");
    return status;
}
