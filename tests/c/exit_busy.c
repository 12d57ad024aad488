/* exit_busy.c: the process exits while another thread is inside the driver
 * (blocked in cuStreamSynchronize behind a long kernel). Exit handling must
 * not wait for it: the program should end at once, with or without pump. */
#include <pthread.h>
#include <time.h>

#include "cuda_api.h"

static CUcontext context;
static CUstream stream;

static void sleepy_kernel(void **params, const fakecuda_dims *dims)
{
    (void)params;
    (void)dims;
    struct timespec t = {5, 0};
    nanosleep(&t, NULL);
}

static void *synchronizer(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    api.stream_synchronize(stream);  /* blocks inside the driver */
    return NULL;
}

int main(void)
{
    cuda_api_load(&api, 0);
    CUdevice dev = cuda_api_start(&api);
    CHECK(api.primary_ctx_retain(&context, dev));
    if (api.register_kernel("sleepy", sleepy_kernel, 0, NULL, NULL))
        return 3;
    CUmodule module;
    CUfunction sleepy;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&sleepy, module, "sleepy"));
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p;
    CHECK(api.mem_alloc_managed(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.launch_kernel(sleepy, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
    pthread_t t;
    pthread_create(&t, NULL, synchronizer, NULL);
    struct timespec settle = {0, 100 * 1000 * 1000};
    nanosleep(&settle, NULL);
    printf("{\"exiting\": true}\n");
    fflush(stdout);
    exit(0);
}
