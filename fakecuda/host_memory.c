/* host_memory.c: why it exists: page-locked host memory, which PyTorch's pin_memory and its
 * caching host allocator take (cuMemHostAlloc, cuMemAllocHost, cuMemFreeHost) or make
 * (cuMemHostRegister, cuMemHostUnregister), and the queries on it (cuMemHostGetDevicePointer,
 * cuMemHostGetFlags, pointer attributes through fc_host_lookup). Semantics from cuda.h: the flags
 * each call takes; with unified addressing the device pointer of pinned memory is its host
 * address; freeing or unregistering anything but a base the call made is refused
 * (CUDA_ERROR_INVALID_VALUE / CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED), registering an overlap
 * too (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED). The memory is plain host memory here (nothing
 * is locked). Cost: each allocation, free, registration and unregistration pins or unpins pages
 * in the kernel: no published measurement; charged as one RM call (FAKECUDA_RM_CALL_NS, the dear
 * end), in the context-query entry's count. */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

typedef struct fc_pinned { struct fc_pinned *next; uintptr_t base; size_t size; unsigned flags; int registered;
                           CUcontext ctx; } fc_pinned;
static fc_pinned *fc_pinned_list;
static pthread_mutex_t fc_pinned_mu = PTHREAD_MUTEX_INITIALIZER;

int fc_host_lookup(uintptr_t p, fc_alloc_desc *out)
{
    pthread_mutex_lock(&fc_pinned_mu);
    fc_pinned *e = fc_pinned_list;
    while (e && !(p >= e->base && p - e->base < e->size)) e = e->next;
    if (e && out) *out = (fc_alloc_desc){e->base, e->size, 0, fc_ctx_device(e->ctx), e->ctx, 0};
    pthread_mutex_unlock(&fc_pinned_mu);
    return e != NULL;
}

static CUresult add(uintptr_t base, size_t size, unsigned flags, int registered, CUcontext ctx)
{
    fc_pinned *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (fc_pinned){NULL, base, size, flags, registered, ctx};
    pthread_mutex_lock(&fc_pinned_mu);
    fc_pinned *o = fc_pinned_list;
    while (o && !(base < o->base + o->size && o->base < base + size)) o = o->next;
    if (!o) {
        e->next = fc_pinned_list;
        fc_pinned_list = e;
    }
    pthread_mutex_unlock(&fc_pinned_mu);
    if (o) free(e);
    return o ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : CUDA_SUCCESS;
}

/* The entry starting at p made the given way, taken off the list; NULL if none. */
static fc_pinned *take(uintptr_t p, int registered)
{
    pthread_mutex_lock(&fc_pinned_mu);
    fc_pinned **q = &fc_pinned_list;
    while (*q && !((*q)->base == p && (*q)->registered == registered)) q = &(*q)->next;
    fc_pinned *e = *q;
    if (e) *q = e->next;
    pthread_mutex_unlock(&fc_pinned_mu);
    return e;
}

static CUresult current(CUcontext *c)
{
    *c = fc_current_ctx();
    return fc_ctx_valid(*c) ? CUDA_SUCCESS : fc_ctx_error(*c);
}

static CUresult host_alloc(void **pp, size_t bytes, unsigned flags)
{
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!pp || !bytes ||
        flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_RM_CALL_NS);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    r = add((uintptr_t)p, bytes, flags, 0, c);
    if (r != CUDA_SUCCESS) munmap(p, bytes);
    else *pp = p;
    return r;
}
FC_DEF(cuMemHostAlloc, 2020, (void **pp, size_t bytesize, unsigned int Flags), host_alloc(pp, bytesize, Flags));
FC_DEF(cuMemAllocHost_v2, 3020, (void **pp, size_t bytesize), host_alloc(pp, bytesize, 0));

FC_EXPORT CUresult cuMemFreeHost(void *p)
{
    FC_ENTRY(cuMemFreeHost, 2000);
    fc_pinned *e = take((uintptr_t)p, 0);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_RM_CALL_NS);
    munmap((void *)e->base, e->size);
    free(e);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemFreeHost);

FC_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    FC_ENTRY(cuMemHostRegister_v2, 6050);
    CUcontext c;
    CUresult r = current(&c);
    if (r != CUDA_SUCCESS) return r;
    if (!p || !bytesize ||
        Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |
                            CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_RM_CALL_NS);
    return add((uintptr_t)p, bytesize, Flags, 1, c);
}
FC_ALIAS(cuMemHostRegister_v2);

FC_EXPORT CUresult cuMemHostUnregister(void *p)
{
    FC_ENTRY(cuMemHostUnregister, 4000);
    fc_pinned *e = take((uintptr_t)p, 1);
    if (!e) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_RM_CALL_NS);
    free(e);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemHostUnregister);

FC_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    FC_ENTRY(cuMemHostGetDevicePointer_v2, 3020);
    if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_host_lookup((uintptr_t)p, NULL)) return CUDA_ERROR_INVALID_VALUE;
    fc_cost(FC_E_POINTER_QUERY, FAKECUDA_POINTER_QUERY_HOST_NS);
    *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemHostGetDevicePointer_v2);

FC_EXPORT CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    FC_ENTRY(cuMemHostGetFlags, 2030);
    if (!pFlags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_pinned_mu);
    fc_pinned *e = fc_pinned_list;
    while (e && !((uintptr_t)p >= e->base && (uintptr_t)p - e->base < e->size && !e->registered)) e = e->next;
    if (e) *pFlags = e->flags;
    pthread_mutex_unlock(&fc_pinned_mu);
    fc_cost(FC_E_POINTER_QUERY, FAKECUDA_POINTER_QUERY_HOST_NS);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* cuda.h: memory from cuMemHostAlloc */
}
FC_ALIAS(cuMemHostGetFlags);
