/* link.c: why it exists: the cuLink* family cuBLAS links by name. fakecuda models no JIT and no
 * linker: a link state can be made and destroyed; adding PTX, NVVM IR or LTO IR needs the JIT
 * and is refused as a driver without its JIT compiler library refuses it
 * (CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "the PTX JIT compiler library was not found", cuda.h);
 * adding a cubin, fatbin or library and completing are refused with CUDA_ERROR_NOT_SUPPORTED
 * (not modelled). Never an image that was not built. */
#include "fakecuda_internal.h"

#include <stdlib.h>

struct CUlinkState_st { uint32_t magic; };
#define FC_MAGIC_LINK 0x4c4e4b21u

static CUresult link_create(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)
{
    if (!stateOut || (numOptions && (!options || !optionValues))) return CUDA_ERROR_INVALID_VALUE;
    struct CUlinkState_st *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = FC_MAGIC_LINK;
    *stateOut = s;
    return CUDA_SUCCESS;
}
/* CUDA 5.5's ABI and 6.5's _v2, the same arguments; the drivers answer both. */
FC_DEF(cuLinkCreate, 5050, (unsigned int n, CUjit_option *o, void **v, CUlinkState *out), link_create(n, o, v, out));
FC_DEF(cuLinkCreate_v2, 6050, (unsigned int n, CUjit_option *o, void **v, CUlinkState *out), link_create(n, o, v, out));

static CUresult add(CUlinkState state, CUjitInputType type)
{
    if (!state || state->magic != FC_MAGIC_LINK) return CUDA_ERROR_INVALID_HANDLE;
    if (type == CU_JIT_INPUT_PTX || type == CU_JIT_INPUT_NVVM) return CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
    return type < CU_JIT_NUM_INPUT_TYPES ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}
static CUresult add_data(CUlinkState state, CUjitInputType type, void *data, size_t size)
{
    return !data || !size ? CUDA_ERROR_INVALID_VALUE : add(state, type);
}
#define FC_ADD_DATA_PARAMS                                                                                   \
    (CUlinkState st, CUjitInputType type, void *data, size_t size, const char *name, unsigned int n, CUjit_option *o, \
     void **v)
#define FC_ADD_FILE_PARAMS (CUlinkState st, CUjitInputType type, const char *path, unsigned int n, CUjit_option *o, void **v)
FC_DEF(cuLinkAddData, 5050, FC_ADD_DATA_PARAMS, ((void)name, (void)n, (void)o, (void)v, add_data(st, type, data, size)));
FC_DEF(cuLinkAddData_v2, 6050, FC_ADD_DATA_PARAMS, ((void)name, (void)n, (void)o, (void)v, add_data(st, type, data, size)));
FC_DEF(cuLinkAddFile, 5050, FC_ADD_FILE_PARAMS, ((void)n, (void)o, (void)v, path ? add(st, type) : CUDA_ERROR_INVALID_VALUE));
FC_DEF(cuLinkAddFile_v2, 6050, FC_ADD_FILE_PARAMS, ((void)n, (void)o, (void)v, path ? add(st, type) : CUDA_ERROR_INVALID_VALUE));
FC_EXPORT CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    FC_ENTRY(cuLinkComplete, 5050);
    if (!state || state->magic != FC_MAGIC_LINK) return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
}
FC_ALIAS(cuLinkComplete);
FC_EXPORT CUresult cuLinkDestroy(CUlinkState state)
{
    FC_ENTRY(cuLinkDestroy, 5050);
    if (!state || state->magic != FC_MAGIC_LINK) return CUDA_ERROR_INVALID_HANDLE;
    state->magic = FC_MAGIC_DEAD;
    free(state);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuLinkDestroy);
