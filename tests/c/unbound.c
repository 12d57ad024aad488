/* unbound.c: why it exists: a program over tests/c/unbound_driver.c (a driver whose
 * entry points call back into exported names), to show pump neither deadlocks nor
 * recurses there (tests/test_interposition.py). Threads allocate, query and free
 * managed memory through the pointers cuGetProcAddress gives, as the CUDA runtime does.
 * First it asks dlsym(RTLD_DEFAULT, "cuLaunchKernel") before any driver is loaded, the
 * "is CUDA here?" probe, and prints what it got, and how many of the driver's own
 * memory queries did not reach the driver. One JSON line.
 *   unbound THREADS ALLOCATIONS */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static PFN_cuMemAllocManaged_v6000 alloc_managed;
static PFN_cuMemGetInfo_v3020 get_info;
static PFN_cuMemFree_v3020 mem_free;
static int allocations;

static void *work(void *failures)
{
    for (int i = 0; i < allocations; i++) {
        CUdeviceptr p = 0;
        size_t free_bytes = 0, total_bytes = 0;
        if (alloc_managed(&p, (size_t)1 << 20, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS ||
            get_info(&free_bytes, &total_bytes) != CUDA_SUCCESS || mem_free(p) != CUDA_SUCCESS)
            __atomic_add_fetch((int *)failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: unbound THREADS ALLOCATIONS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    allocations = atoi(argv[2]);
    if (threads < 1 || threads > 64 || allocations < 1) {
        fprintf(stderr, "unbound: THREADS is 1 to 64, ALLOCATIONS at least 1\n");
        return 2;
    }
    void *probe = dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    int probe_error = dlerror() != NULL;

    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    PFN_cuGetProcAddress_v12000 gpa = lib != NULL ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2")
                                                  : NULL;
    if (gpa == NULL) {
        fprintf(stderr, "unbound: no driver\n");
        return 4;
    }
    CUdriverProcAddressQueryResult status;
    PFN_cuInit_v2000 init = NULL;
    gpa("cuInit", (void **)&init, 2000, 0, &status);
    gpa("cuMemAllocManaged", (void **)&alloc_managed, 6000, 0, &status);
    gpa("cuMemGetInfo", (void **)&get_info, 3020, 0, &status);
    gpa("cuMemFree", (void **)&mem_free, 3020, 0, &status);
    if (init == NULL || alloc_managed == NULL || get_info == NULL || mem_free == NULL || init(0) != CUDA_SUCCESS) {
        fprintf(stderr, "unbound: the driver's lookups failed\n");
        return 3;
    }
    int failures = 0;
    pthread_t tid[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&tid[i], NULL, work, &failures);
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    int (*foreign_answers)(void) = (int (*)(void))dlsym(lib, "unbound_driver_foreign_answers");
    printf("{\"probe\": %s, \"probe_dlerror\": %s, \"failures\": %d, \"foreign_answers\": %d}\n",
           probe != NULL ? "true" : "false", probe_error ? "true" : "false", failures,
           foreign_answers != NULL ? foreign_answers() : -1);
    return 0;
}
