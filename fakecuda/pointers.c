/* pointers.c: why it exists: what the driver answers about an address: pointer attributes,
 * the allocation's range, and IPC handles (only plain memory's base can be exported). The
 * allocations themselves are memory.c's. */
#include "fakecuda_internal.h"

#include <string.h>

/* ---- pointer queries ---- */
FC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    FC_ENTRY(cuPointerGetAttribute, 4000);
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_POINTER_QUERY, FAKECUDA_POINTER_QUERY_HOST_NS);
    fc_alloc_desc c;
    int host = 0; /* page-locked host memory (host_memory.c): its type is the host's */
    if (!fc_alloc_lookup((uintptr_t)ptr, &c) && !(host = fc_host_lookup((uintptr_t)ptr, &c))) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = c.ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!c.managed && !host) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = (unsigned)c.managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = c.device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)c.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = c.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
FC_ALIAS(cuPointerGetAttribute);

FC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FC_ENTRY(cuMemGetAddressRange_v2, 3020);
    fc_alloc_desc c;
    if (!fc_alloc_lookup((uintptr_t)dptr, &c)) return CUDA_ERROR_NOT_FOUND;
    if (pbase) *pbase = (CUdeviceptr)c.base;
    if (psize) *psize = c.size;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemGetAddressRange_v2);

/* ---- interprocess handles ---- */
/* Only plain device memory, by its base, can be exported; managed memory cannot
 * (the driver returns CUDA_ERROR_INVALID_VALUE for it). The handle holds the address. */
FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    FC_ENTRY(cuIpcGetMemHandle, 4010);
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    fc_alloc_desc c;
    if (!fc_alloc_lookup((uintptr_t)dptr, &c) || c.base != (uintptr_t)dptr || c.managed) return CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &dptr, sizeof dptr);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuIpcGetMemHandle);

/* cuda.h: "Unlike cuPointerGetAttribute, this function will not return an error when the ptr
 * encountered is not a valid CUDA pointer. Instead, the attributes are assigned default NULL
 * values and CUDA_SUCCESS is returned." An attribute fakecuda does not answer is refused
 * (CUDA_ERROR_INVALID_VALUE), as the single query refuses it. Charged as one query per attribute. */
static size_t attr_size(CUpointer_attribute a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: case CU_POINTER_ATTRIBUTE_HOST_POINTER: return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: case CU_POINTER_ATTRIBUTE_IS_MANAGED: case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
    default: return 0;
    }
}
FC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    FC_ENTRY(cuPointerGetAttributes, 7000);
    if (!numAttributes || !attributes || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; i++)
        if (!attr_size(attributes[i]) || !data[i]) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; i++)
        if (fcl_cuPointerGetAttribute(data[i], attributes[i], ptr) != CUDA_SUCCESS) {
            memset(data[i], 0, attr_size(attributes[i]));
        }
    return CUDA_SUCCESS;
}
FC_ALIAS(cuPointerGetAttributes);
