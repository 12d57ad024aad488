/* memory_pages.h: what memory.c (allocations, their registry) and migrate.c (their pages'
 * moves) share: a managed allocation's per-page state and the registry of allocations. */
#ifndef FAKECUDA_MEMORY_PAGES_H
#define FAKECUDA_MEMORY_PAGES_H

#include "fakecuda_internal.h"

/* And fault_prefetch.c's FC_BIT_FAULTED (8), FC_BIT_DRIVER_PF (16). FC_BIT_DUP: a read-mostly page's
 * duplicate on a device, its host copy valid too (migrate.c); FC_BIT_READ_MOSTLY: the advice;
 * FC_BIT_DISCARD_STUCK: a discard raced a migration of it (discard_races.c). */
enum { FC_BIT_PREFETCHED = 1, FC_BIT_TOUCHED = 2, FC_BIT_EVICTED = 4, FC_BIT_DUP = 32, FC_BIT_READ_MOSTLY = 64,
       FC_BIT_DISCARD_STUCK = 128 };
/* A page's crossings of the link since its last use, which count as dead where it is overwritten
 * whole or discarded next (bytes_dead_h2d, bytes_dead_d2h). */
enum { FC_CROSSED_IN = 1, FC_CROSSED_OUT = 2 };
#define PAGES_PER_BLOCK (FAKECUDA_VA_BLOCK / FAKECUDA_PAGE)

typedef struct fc_alloc {
    uintptr_t base;
    size_t size;
    uint64_t ordinal;   /* 1 for the first allocation registered, 2 for the next... (launch_uses.c) */
    void *map;
    size_t map_len;
    int managed;
    int from_pool;   /* managed memory of a managed pool (FC_ALLOC_MANAGED_POOL) */
    int mapped;      /* a cuMemMap mapping (vmm.c): its bytes and pages are the handle's */
    int device;      /* plain: owning device; managed: device of the allocating context */
    CUcontext ctx;
    size_t npages;
    pthread_mutex_t mu; /* guards loc[] and bits[] */
    uint8_t *loc;       /* FC_LOC_UNPOP, FC_LOC_HOST, FC_LOC_DEV0 + d */
    uint8_t *bits;      /* FC_BIT_* */
    uint8_t *pref;      /* preferred location (cuMemAdvise), FC_LOC_*; FC_LOC_UNPOP: none */
    uint8_t *lost;      /* 1: the page's bytes were lost (a discard) and nothing wrote it since */
    uint8_t *crossed;   /* FC_CROSSED_*: the link crossings since a kernel last used the page (migrate.c) */
    fc_chunk **chunks;  /* [block * ndevices + d]: the block's root chunk on device d, or NULL */
    fc_prefetch_info *pfi; /* per VA block */
} fc_alloc;

/* Allocations sorted by base, under a reader/writer lock (lock order: fc_reg_lock, then
 * an allocation's mu). */
extern pthread_rwlock_t fc_reg_lock;
extern fc_alloc **fc_reg;
extern size_t fc_nreg;
/* Index of the first allocation whose end is above p (fc_nreg if none); the lock held. */
size_t fc_reg_first_end_above(uintptr_t p);

#endif
