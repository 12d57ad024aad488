/* runtime.c: a program on NVIDIA's real CUDA runtime (from the
 * nvidia-cuda-runtime wheel), built twice: with the static runtime (nvcc's
 * default) and with the shared one. Both bootstrap exactly as in any CUDA
 * program: dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, then ~450 lookups
 * through the cuGetProcAddress it returns, all of which pump must see.
 * It stops at initialisation (cudaFree(0), which fakecuda's export tables
 * let the runtime complete) and prints what the runtime said; PyTorch's CUDA
 * build goes further (tests/test_real_client.py). Not an imitation: NVIDIA's
 * runtime itself, the static one too. Declared by hand: no toolkit headers. */
#include <stdio.h>

int cudaRuntimeGetVersion(int *version);
int cudaDriverGetVersion(int *version);
int cudaFree(void *ptr);

int main(void)
{
    int runtime = 0, driver = 0;
    int runtime_error = cudaRuntimeGetVersion(&runtime);
    int driver_error = cudaDriverGetVersion(&driver);
    int init_error = cudaFree(0);
    printf("{\"runtime\": %d, \"runtime_error\": %d, \"driver\": %d, \"driver_error\": %d, \"init_error\": %d}\n",
           runtime, runtime_error, driver, driver_error, init_error);
    return 0;
}
