/* free_race.c: threads allocating and freeing managed memory of one size at
 * once, so the driver hands one thread the address another just freed. pump
 * must forget each allocation before the driver frees it: forgotten after,
 * the freeing thread can forget the record of the allocation another thread
 * was just handed at that address (tests/test_shim.py counts frees against
 * allocations).
 *
 *   free_race [THREADS [ROUNDS]]
 */
#include <pthread.h>

#include "cuda_api.h"

static CUcontext context;
static int rounds = 2000;

static void *churn(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    for (int i = 0; i < rounds; i++) {
        CUdeviceptr p;
        CHECK(api.mem_alloc_managed(&p, 2 << 20, CU_MEM_ATTACH_GLOBAL));
        CHECK(api.mem_free(p));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        rounds = atoi(argv[2]);
    if (threads < 1 || threads > 64 || rounds < 1) {
        fprintf(stderr, "usage: free_race [THREADS 1..64 [ROUNDS >= 1]]\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice dev = cuda_api_start(&api);
    CHECK(api.primary_ctx_retain(&context, dev));
    pthread_t churners[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&churners[i], NULL, churn, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(churners[i], NULL);
    printf("{\"threads\": %d, \"rounds\": %d}\n", threads, rounds);
    return 0;
}
