/* fork_turn.c: a fork while another thread is inside a driver call of pump's launch rule
 * (issue 42, risk 4): the fork must not wait for that call, whose thread holds no lock or turn.
 * FAKECUDA_HOLD_PREFETCH=PATH holds the launch's prefetch in the driver until PATH exists; a
 * watchdog makes it after 3 s, so that a fork that waits still ends (held_call.h).
 *   fork_turn PATH
 * Prints {"fork_waited": true|false, "ok": ...}: whether the fork returned only once the held
 * call could go on, and whether the parent's kernel still computed its buffer.
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>

#include "cuda_api.h"
#include "held_call.h"

#define FLOATS ((size_t)1 << 22) /* 16 MiB */

static struct held_call hold;
static CUcontext context;
static CUfunction inc;
static CUdeviceptr buffer;

static void *launcher(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    uint64_t n = FLOATS;
    void *params[] = {&buffer, &n};
    CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    CHECK(api.ctx_synchronize());
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fork_turn PATH\n");
        return 2;
    }
    held_call_init(&hold, argv[1], 3000);
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    CUdevice dev = 0;
    CHECK(api.primary_ctx_retain(&context, dev));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);
    CHECK(api.mem_alloc_managed(&buffer, FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *x = (float *)buffer;
    api.host_touch(x, FLOATS * sizeof *x);
    memset(x, 0, FLOATS * sizeof *x);

    pthread_t launching, dog;
    pthread_create(&launching, NULL, launcher, NULL);
    bool held = held_call_entered(&hold); /* the launch's prefetch is in the driver */
    pthread_create(&dog, NULL, held_call_watchdog, &hold);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        _exit(0); /* CUDA is off limits in the child */
    bool waited = atomic_load(&hold.released);
    held_call_let_go(&hold);
    int status;
    waitpid(child, &status, 0);
    pthread_join(launching, NULL);
    pthread_join(dog, NULL);
    api.host_touch(x, FLOATS * sizeof *x);
    bool ok = held && x[0] == 1.0f && x[FLOATS - 1] == 1.0f && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("{\"fork_waited\": %s, \"held\": %s, \"ok\": %s}\n", waited ? "true" : "false", held ? "true" : "false",
           ok ? "true" : "false");
    CHECK(api.mem_free(buffer));
    return ok ? 0 : 1;
}
