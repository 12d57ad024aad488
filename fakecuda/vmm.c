/* vmm.c: why it exists: virtual memory management, as PyTorch's expandable segments use it
 * (CUDACachingAllocator.cpp, ExpandableSegment: one address reservation the size of the device,
 * a cuMemCreate handle of one segment mapped into it as it grows, cuMemSetAccess, and the
 * reverse). cuda.h's contract: cuMemCreate takes device memory of a handle (counted against the
 * device, devmem.c); cuMemAddressReserve reserves addresses only; cuMemMap puts a handle's
 * memory at reserved addresses (the whole handle here: offset 0, its size), which are not
 * accessible until cuMemSetAccess grants read-write access on the device; cuMemUnmap takes it
 * away; cuMemRelease frees the handle's memory once no mapping holds it; cuMemAddressFree
 * returns a reservation with nothing mapped in it; cuMemRetainAllocationHandle takes one more
 * reference to the handle mapped at an address (each reference is dropped by a cuMemRelease),
 * and cuMemGetAllocationPropertiesFromHandle answers the properties it was made with. A mapping
 * is device memory in the registry (memory.c), so copies and kernels see it as cudaMalloc's.
 * Granularity: 2 MiB, the minimum and recommended answer for device memory on current GPUs.
 * Each call that changes memory is an RM call: FAKECUDA_RM_CALL_NS, counted as "vmm" in the entry
 * costs. Not modelled, and refused with CUDA_ERROR_NOT_SUPPORTED where the driver would share:
 * exporting and importing handles (PyTorch looks them up at start, and calls them only to share
 * memory with another process); mapping part of a handle; access for other devices; arrays. */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#define FC_VMM_GRANULARITY ((size_t)2 << 20)
#define FC_MAGIC_PHYS 0x50485921u

typedef struct fc_physical {
    uint32_t magic;
    int device;
    size_t size;
    CUmemAllocationProp prop;
    int mappings; /* under fc_vmm_mu, as refs */
    int refs;     /* cuMemCreate's and each cuMemRetainAllocationHandle's, less cuMemRelease's */
    struct fc_physical *next_freed; /* cuMemUnmap's list of handles to free once unlocked */
    fc_link keep;
} fc_physical;

/* A reservation and what is mapped in it (a short list: PyTorch makes one per device and stream). */
typedef struct fc_mapping { uintptr_t base; size_t size; fc_physical *phys; int access; struct fc_mapping *next; } fc_mapping;
typedef struct fc_reservation { uintptr_t base; size_t size; fc_mapping *maps; struct fc_reservation *next; } fc_reservation;

static pthread_mutex_t fc_vmm_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_reservation *fc_reservations;

static void vmm_cost(void) { fc_cost(FC_E_VMM, FAKECUDA_RM_CALL_NS); }

static void physical_free(fc_physical *p)
{
    fc_devmem_give(p->device, p->size);
    p->magic = FC_MAGIC_DEAD;
    fc_unkeep(&p->keep);
    free(p);
}

FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    FC_ENTRY(cuMemCreate, 10020);
    vmm_cost();
    if (!handle || !prop || flags != 0 || size == 0 || size % FC_VMM_GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    CUresult err = fc_reserve_device_memory(dev, size);
    if (err != CUDA_SUCCESS) return err;
    fc_physical *p = calloc(1, sizeof *p);
    if (!p) {
        fc_devmem_give(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (fc_physical){ .magic = FC_MAGIC_PHYS, .device = dev, .size = size, .prop = *prop, .refs = 1 };
    fc_keep(&p->keep);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemCreate);

FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FC_ENTRY(cuMemRelease, 10020);
    vmm_cost();
    fc_physical *p = (fc_physical *)(uintptr_t)handle;
    pthread_mutex_lock(&fc_vmm_mu);
    CUresult r = !p || p->magic != FC_MAGIC_PHYS || p->refs == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    int now = r == CUDA_SUCCESS && --p->refs == 0 && p->mappings == 0;
    pthread_mutex_unlock(&fc_vmm_mu);
    if (now) physical_free(p);
    return r;
}
FC_ALIAS(cuMemRelease);

FC_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
    FC_ENTRY(cuMemGetAllocationGranularity, 10020);
    if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *granularity = FC_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemGetAllocationGranularity);

/* Addresses only: inaccessible pages, no memory behind them until a mapping. The address
 * hint is a hint (cuda.h: "Fixed starting address range requested"), taken where it is free. */
FC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags)
{
    FC_ENTRY(cuMemAddressReserve, 10020);
    vmm_cost();
    if (!ptr || size == 0 || size % FC_VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0 || alignment % FC_VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment ? alignment : FC_VMM_GRANULARITY;
    if (size + align < size) return CUDA_ERROR_OUT_OF_MEMORY;
    void *hint = addr % align == 0 ? (void *)(uintptr_t)addr : NULL;
    void *m = mmap(hint, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    fc_reservation *r = m == MAP_FAILED ? NULL : calloc(1, sizeof *r);
    if (!r) {
        if (m != MAP_FAILED) munmap(m, size + align);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t base = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)m) munmap(m, base - (uintptr_t)m);
    if ((uintptr_t)m + size + align > base + size) munmap((void *)(base + size), (uintptr_t)m + size + align - (base + size));
    r->base = base;
    r->size = size;
    pthread_mutex_lock(&fc_vmm_mu);
    r->next = fc_reservations;
    fc_reservations = r;
    pthread_mutex_unlock(&fc_vmm_mu);
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemAddressReserve);

FC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FC_ENTRY(cuMemAddressFree, 10020);
    vmm_cost();
    pthread_mutex_lock(&fc_vmm_mu);
    fc_reservation **at = &fc_reservations;
    while (*at && !((*at)->base == (uintptr_t)ptr && (*at)->size == size)) at = &(*at)->next;
    fc_reservation *r = *at && !(*at)->maps ? *at : NULL;
    if (r) *at = r->next;
    pthread_mutex_unlock(&fc_vmm_mu);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)r->base, r->size);
    free(r);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemAddressFree);

/* The reservation holding [p, p + n), under fc_vmm_mu; NULL if none holds all of it. */
static fc_reservation *reservation_of(uintptr_t p, size_t n)
{
    for (fc_reservation *r = fc_reservations; r; r = r->next)
        if (p >= r->base && p + n >= p && p + n <= r->base + r->size) return r;
    return NULL;
}

FC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags)
{
    FC_ENTRY(cuMemMap, 10020);
    vmm_cost();
    fc_physical *p = (fc_physical *)(uintptr_t)handle;
    uintptr_t base = (uintptr_t)ptr;
    if (!p || flags != 0 || base % FC_VMM_GRANULARITY != 0) return CUDA_ERROR_INVALID_VALUE;
    fc_mapping *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fc_vmm_mu);
    fc_reservation *r = p->magic == FC_MAGIC_PHYS && p->refs > 0 && offset == 0 && size == p->size
                            ? reservation_of(base, size) : NULL;
    for (fc_mapping *o = r ? r->maps : NULL; o && r; o = o->next)
        if (base < o->base + o->size && o->base < base + size) r = NULL; /* already mapped there */
    CUresult err = r ? fc_register_mapping(base, size, p->device, fc_current_ctx()) : CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS) {
        *m = (fc_mapping){ .base = base, .size = size, .phys = p, .next = r->maps };
        r->maps = m;
        p->mappings++;
    }
    pthread_mutex_unlock(&fc_vmm_mu);
    if (err != CUDA_SUCCESS) free(m);
    return err;
}
FC_ALIAS(cuMemMap);

/* Read-write access for the mapping's own device makes its pages usable (they start zeroed). */
FC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    FC_ENTRY(cuMemSetAccess, 10020);
    vmm_cost();
    if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= fc_cfg.ndevices ||
            (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE))
            return CUDA_ERROR_INVALID_VALUE;
    uintptr_t base = (uintptr_t)ptr;
    CUresult err = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_vmm_mu);
    fc_reservation *r = reservation_of(base, size);
    size_t covered = 0;
    for (fc_mapping *m = r ? r->maps : NULL; m; m = m->next)
        if (m->base >= base && m->base + m->size <= base + size) covered += m->size;
    if (r && covered == size) { /* every byte of the range mapped */
        int prot = PROT_NONE;
        for (size_t i = 0; i < count; i++)
            prot |= desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                    : desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ : PROT_NONE;
        err = mprotect((void *)base, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fc_vmm_mu);
    return err;
}
FC_ALIAS(cuMemSetAccess);

/* Unmaps every mapping inside [ptr, ptr + size), which must be exactly mappings. */
FC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FC_ENTRY(cuMemUnmap, 10020);
    vmm_cost();
    uintptr_t base = (uintptr_t)ptr;
    fc_physical *freed = NULL;
    pthread_mutex_lock(&fc_vmm_mu);
    fc_reservation *r = reservation_of(base, size);
    size_t covered = 0;
    for (fc_mapping *m = r ? r->maps : NULL; m; m = m->next)
        if (m->base >= base && m->base + m->size <= base + size) covered += m->size;
        else if (m->base < base + size && base < m->base + m->size) covered = size + 1; /* cuts a mapping */
    CUresult err = r && covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (fc_mapping **at = r && err == CUDA_SUCCESS ? &r->maps : NULL; at && *at;) {
        fc_mapping *m = *at;
        if (m->base < base || m->base + m->size > base + size) {
            at = &m->next;
            continue;
        }
        *at = m->next;
        fc_free_memory(m->base);
        madvise((void *)m->base, m->size, MADV_DONTNEED); /* the memory goes with the mapping */
        mprotect((void *)m->base, m->size, PROT_NONE);
        if (--m->phys->mappings == 0 && m->phys->refs == 0) {
            m->phys->next_freed = freed;
            freed = m->phys;
        }
        free(m);
    }
    pthread_mutex_unlock(&fc_vmm_mu);
    while (freed) {
        fc_physical *next = freed->next_freed;
        physical_free(freed);
        freed = next;
    }
    return err;
}
FC_ALIAS(cuMemUnmap);

FC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    FC_ENTRY(cuMemRetainAllocationHandle, 11000);
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t a = (uintptr_t)addr;
    CUresult err = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_vmm_mu);
    fc_reservation *r = reservation_of(a, 1);
    for (fc_mapping *m = r ? r->maps : NULL; m && err != CUDA_SUCCESS; m = m->next)
        if (a >= m->base && a < m->base + m->size) {
            m->phys->refs++;
            *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
            err = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fc_vmm_mu);
    return err;
}
FC_ALIAS(cuMemRetainAllocationHandle);

FC_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    FC_ENTRY(cuMemGetAllocationPropertiesFromHandle, 10020);
    fc_physical *p = (fc_physical *)(uintptr_t)handle;
    pthread_mutex_lock(&fc_vmm_mu);
    CUresult err = !prop || !p || p->magic != FC_MAGIC_PHYS || p->refs == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (err == CUDA_SUCCESS) *prop = p->prop;
    pthread_mutex_unlock(&fc_vmm_mu);
    return err;
}
FC_ALIAS(cuMemGetAllocationPropertiesFromHandle);

FC_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags)
{
    FC_ENTRY(cuMemExportToShareableHandle, 10020);
    (void)handleType;
    fc_physical *p = (fc_physical *)(uintptr_t)handle;
    if (!shareableHandle || !p || p->magic != FC_MAGIC_PHYS || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED; /* sharing memory between processes is not modelled */
}
FC_ALIAS(cuMemExportToShareableHandle);

FC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                  CUmemAllocationHandleType shHandleType)
{
    FC_ENTRY(cuMemImportFromShareableHandle, 10020);
    (void)osHandle;
    (void)shHandleType;
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED; /* sharing memory between processes is not modelled */
}
FC_ALIAS(cuMemImportFromShareableHandle);
