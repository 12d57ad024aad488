/* recursion.c: dlopens a library whose constructor uses CUDA (recursion_lib.c)
 * and then uses the driver itself.   recursion PATH-TO-LIBRARY */
#include "cuda_api.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "error: %s\n", dlerror());
        return 3;
    }

    if (cuda_api_load(&api, 0) != 0)
        return 4;
    CUdeviceptr p;
    CHECK(api.mem_alloc_managed(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_free(p));
    printf("ok\n");
    return 0;
}
