/* recursion_lib.c: a library that uses CUDA from its constructor, so the
 * driver (and pump's hooks) are entered while the dynamic loader is inside
 * dlopen: pump must neither deadlock nor recurse there. */
#include "cuda_api.h"


__attribute__((constructor)) static void use_cuda_while_loading(void)
{
    if (cuda_api_load(&api, 0) != 0)
        return;
    cuda_api_start(&api);
    CUdeviceptr p;
    CHECK(api.mem_alloc_managed(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_free(p));
}
