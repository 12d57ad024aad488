/* image_probe.c: why it exists: loads kernel images from files through fakecuda as a program
 * would, and prints what the driver answered as one JSON line per file, for
 * tests/test_fakecuda_images.py (plain and under ASan+UBSan: malformed images must be refused,
 * never read past).
 *   image_probe [--library|--fatbinary|--wrapper|--path] [--global NAME] [--launch NAME] FILE...
 * --library: cuLibraryLoadData and CUkernel handles (else cuModuleLoadData, CUfunction);
 * --path: cuModuleLoad of the file's path;
 * --fatbinary: cuModuleLoadFatBinary; --wrapper: the runtime's fatbin wrapper around the bytes;
 * --launch NAME: launches kernel NAME with a managed allocation's address in every 8-aligned
 * word of its parameters, and prints the allocations' bases; with --capture, into a captured
 * graph launched twice. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

static void *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = aligned_alloc(16, ((size_t)n + 16 + 15) & ~(size_t)15);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) memset((char *)buf + n, 0, 16);
    fclose(f);
    return buf;
}

static void params(void *h, int library)
{
    printf("[");
    for (size_t i = 0;; i++) {
        size_t off = 0, size = 0;
        CUresult r = library ? cuKernelGetParamInfo((CUkernel)h, i, &off, &size)
                             : cuFuncGetParamInfo((CUfunction)h, i, &off, &size);
        if (r != CUDA_SUCCESS) break;
        printf("%s[%zu, %zu]", i ? ", " : "", off, size);
    }
    size_t off;
    /* the other kind's call on this handle: refused (cuda.h allows neither) */
    CUresult other = library ? cuFuncGetParamInfo((CUfunction)h, 0, &off, NULL)
                             : cuKernelGetParamInfo((CUkernel)h, 0, &off, NULL);
    printf("], \"other_kind\": %d", (int)other);
}

static int capture;

static void launch(void *h, int library)
{
    size_t n = 0, off, size, end = 0;
    while ((library ? cuKernelGetParamInfo((CUkernel)h, n, &off, &size)
                    : cuFuncGetParamInfo((CUfunction)h, n, &off, &size)) == CUDA_SUCCESS) {
        if (off + size > end) end = off + size;
        n++;
    }
    unsigned char *args = calloc(1, end + 8);
    void **ptrs = calloc(n + 1, sizeof *ptrs);
    CUdeviceptr mem = 0;
    cuMemAllocManaged(&mem, 1 << 20, CU_MEM_ATTACH_GLOBAL);
    printf(", \"managed\": %llu, \"launch\": ", (unsigned long long)mem);
    for (size_t i = 0; i < n; i++) {
        (library ? cuKernelGetParamInfo((CUkernel)h, i, &off, &size) : cuFuncGetParamInfo((CUfunction)h, i, &off, &size));
        ptrs[i] = args + off;
        for (size_t w = (off + 7) & ~(size_t)7; w + 8 <= off + size; w += 8) {
            uint64_t v = mem + w; /* inside the allocation, a different word each */
            memcpy(args + w, &v, 8);
        }
    }
    CUstream stream = NULL;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    CUresult r = capture ? cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) : CUDA_SUCCESS;
    if (!r && capture) r = cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (!r) r = cuLaunchKernel((CUfunction)h, 1, 1, 1, 32, 1, 1, 0, stream, ptrs, NULL);
    if (!r && capture) r = cuStreamEndCapture(stream, &g);
    if (!r && capture) r = cuGraphInstantiateWithFlags(&ge, g, 0);
    for (int i = 0; !r && capture && i < 2; i++) r = cuGraphLaunch(ge, stream);
    CUresult s = cuCtxSynchronize();
    if (ge) cuGraphExecDestroy(ge);
    if (g) cuGraphDestroy(g);
    if (stream) cuStreamDestroy(stream);
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    printf("[%d, %d, %llu, %llu, %llu]", (int)r, (int)s, (unsigned long long)st.kernels_run,
           (unsigned long long)st.launches_by_function, (unsigned long long)st.launches_by_kernel);
    cuMemFree(mem);
    free(args);
    free(ptrs);
}

int main(int argc, char **argv)
{
    int library = 0, fatbinary = 0, wrapper = 0, path = 0;
    const char *global = NULL, *to_launch = NULL;
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return 2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--library")) library = 1;
        else if (!strcmp(argv[a], "--fatbinary")) fatbinary = 1;
        else if (!strcmp(argv[a], "--wrapper")) wrapper = 1;
        else if (!strcmp(argv[a], "--path")) path = 1;
        else if (!strcmp(argv[a], "--capture")) capture = 1;
        else if (!strcmp(argv[a], "--global") && a + 1 < argc) global = argv[++a];
        else if (!strcmp(argv[a], "--launch") && a + 1 < argc) to_launch = argv[++a];
        else {
            void *image = path ? NULL : read_file(argv[a]);
            if (!image && !path) return 2;
            struct { uint32_t magic, version; const void *data, *rest; } w = { 0x466243b1u, 1, image, NULL };
            const void *what = wrapper ? (const void *)&w : image;
            CUmodule mod = NULL;
            CUlibrary lib = NULL;
            CUresult r = library     ? cuLibraryLoadData(&lib, what, NULL, NULL, 0, NULL, NULL, 0)
                         : fatbinary ? cuModuleLoadFatBinary(&mod, what)
                         : path      ? cuModuleLoad(&mod, argv[a])
                                     : cuModuleLoadData(&mod, what);
            printf("{\"file\": \"%s\", \"result\": %d, \"kernels\": [", argv[a], (int)r);
            unsigned count = 0;
            if (r == CUDA_SUCCESS) (library ? cuLibraryGetKernelCount(&count, lib) : cuModuleGetFunctionCount(&count, mod));
            void **hs = calloc(count + 1, sizeof *hs);
            CUresult er = library ? cuLibraryEnumerateKernels((CUkernel *)hs, count, lib)
                                  : cuModuleEnumerateFunctions((CUfunction *)hs, count, mod);
            for (unsigned k = 0; r == CUDA_SUCCESS && er == CUDA_SUCCESS && k < count; k++) {
                const char *name = NULL;
                (library ? cuKernelGetName(&name, (CUkernel)hs[k]) : cuFuncGetName(&name, (CUfunction)hs[k]));
                void *again = NULL;
                CUresult g = library ? cuLibraryGetKernel((CUkernel *)&again, lib, name)
                                     : cuModuleGetFunction((CUfunction *)&again, mod, name);
                printf("%s{\"name\": \"%s\", \"same\": %d, \"params\": ", k ? ", " : "", name,
                       g == CUDA_SUCCESS && again == hs[k]);
                params(hs[k], library);
                if (to_launch && !strcmp(name, to_launch)) launch(hs[k], library);
                printf("}");
            }
            printf("], \"enumerate\": %d", (int)(r == CUDA_SUCCESS ? er : r));
            if (r == CUDA_SUCCESS && global) {
                CUdeviceptr p = 0;
                size_t bytes = 0;
                CUresult g = library ? cuLibraryGetGlobal(&p, &bytes, lib, global)
                                     : cuModuleGetGlobal(&p, &bytes, mod, global);
                CUdeviceptr base = 0;
                size_t size = 0;
                if (g == CUDA_SUCCESS) cuMemGetAddressRange(&base, &size, p);
                printf(", \"global\": [%d, %zu, %d, %zu]", (int)g, bytes, g == CUDA_SUCCESS && base == p, size);
            }
            CUfunction none;
            CUresult nf = r == CUDA_SUCCESS && !library ? cuModuleGetFunction(&none, mod, "no_such_kernel") : 0;
            printf(", \"not_found\": %d}\n", (int)nf);
            fflush(stdout);
            free(hs);
            if (r == CUDA_SUCCESS && (library ? cuLibraryUnload(lib) : cuModuleUnload(mod))) return 3;
            free(image);
        }
    }
    CUmoduleLoadingMode mode;
    printf("{\"loading_mode\": %d}\n", cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS ? (int)mode : -1);
    return 0;
}
