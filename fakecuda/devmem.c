/* devmem.c: why it exists: each device's memory as the driver manages it. Plain allocations,
 * pools and cuMemCreate handles take bytes (RM's PMA), and managed memory takes one root
 * chunk (FAKECUDA_VA_BLOCK, or the block's own size at an allocation's end) per VA block per
 * device from the moment a page of the block lands there until the chunk is evicted or the
 * allocation freed: migrating pages away does not give it back (uvm_va_block.c frees a
 * block's GPU chunks only when evicted or destroyed; block_clear_resident_processor moves it
 * to the unused list). The chunks sit on three lists per device, and a victim is the first
 * chunk of the first non-empty list (uvm_pmm_gpu.c, pick_root_chunk_to_evict after the free
 * lists; get_first_allocated_chunk; lists in uvm_pmm_alloc_list_t order): UNUSED (no resident
 * page), DISCARDED (its pages discarded), USED. A chunk goes to the tail of USED when its
 * block becomes resident on the device (block_mark_memory_used; chunk_update_lists_locked
 * when a VA block allocates one), never when a kernel reads it (TODO "Bug 1765193: Move the
 * chunks to the tail of the used list whenever they get mapped"): allocation order, not
 * access order. The eviction itself (moving pages) is migrate.c's. */
#include "fakecuda_internal.h"

#include <stdlib.h>

enum { FC_LIST_UNUSED, FC_LIST_DISCARDED, FC_LIST_USED, FC_NLISTS, FC_LIST_EVICTING = -1 };

static pthread_mutex_t fc_pmm_mu[FAKECUDA_MAX_DEVICES]; /* a leaf lock: lists, used bytes */
static fc_chunk fc_lists[FAKECUDA_MAX_DEVICES][FC_NLISTS]; /* sentinels */
static uint64_t fc_used[FAKECUDA_MAX_DEVICES];             /* plain bytes + chunk bytes */
static pthread_once_t fc_pmm_once = PTHREAD_ONCE_INIT;

static void pmm_init(void)
{
    for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++) {
        pthread_mutex_init(&fc_pmm_mu[d], NULL);
        for (int l = 0; l < FC_NLISTS; l++) fc_lists[d][l].prev = fc_lists[d][l].next = &fc_lists[d][l];
    }
}

static void lock(int d)
{
    pthread_once(&fc_pmm_once, pmm_init);
    pthread_mutex_lock(&fc_pmm_mu[d]);
}
static void unlock(int d) { pthread_mutex_unlock(&fc_pmm_mu[d]); }

static void unlink_chunk(fc_chunk *c)
{
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->prev = c->next = c;
}

/* To the tail of list l, unless the chunk is being evicted (it is on no list then). */
static void move_tail(fc_chunk *c, int l)
{
    if (c->list == FC_LIST_EVICTING) return;
    unlink_chunk(c);
    fc_chunk *head = &fc_lists[c->device][l];
    c->prev = head->prev;
    c->next = head;
    head->prev->next = c;
    head->prev = c;
    c->list = l;
}

int fc_devmem_take(int device, uint64_t bytes)
{
    lock(device);
    int ok = fc_used[device] + bytes >= fc_used[device] && fc_used[device] + bytes <= fc_cfg.device_memory;
    if (ok) fc_used[device] += bytes;
    unlock(device);
    return ok ? 0 : -1;
}

void fc_devmem_give(int device, uint64_t bytes)
{
    lock(device);
    fc_used[device] -= bytes;
    unlock(device);
}

uint64_t fc_devmem_used(int device)
{
    lock(device);
    uint64_t u = fc_used[device];
    unlock(device);
    return u;
}

fc_chunk *fc_chunk_new(void *owner, size_t block, int device, uint64_t bytes)
{
    fc_chunk *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (fc_chunk){ .owner = owner, .block = block, .device = device, .bytes = bytes, .list = FC_LIST_USED };
    c->prev = c->next = c;
    if (fc_devmem_take(device, bytes) != 0) {
        free(c);
        return NULL;
    }
    lock(device);
    move_tail(c, FC_LIST_USED);
    unlock(device);
    return c;
}

/* Only a full 2 MiB block's chunk moves between the lists: block_mark_memory_used and
 * block_clear_resident_processor (uvm_va_block.c) act only when uvm_va_block_size(block) ==
 * UVM_CHUNK_SIZE_MAX, and so does marking it discarded (uvm_va_block_discard's callers). A
 * short block (an allocation's last, under 2 MiB) stays where its allocation put it: on USED,
 * in allocation order (chunk_update_lists_locked), whether its pages are there or not. */
static int moves_between_lists(const fc_chunk *c) { return c->bytes == FAKECUDA_VA_BLOCK; }

void fc_chunk_page_in(fc_chunk *c)
{
    if (c->resident++ > 0 || !moves_between_lists(c)) return;
    lock(c->device);
    move_tail(c, FC_LIST_USED); /* the block became resident on the device */
    unlock(c->device);
}

void fc_chunk_page_out(fc_chunk *c, int discarded)
{
    if (--c->resident > 0 || !moves_between_lists(c)) return;
    lock(c->device);
    move_tail(c, discarded ? FC_LIST_DISCARDED : FC_LIST_UNUSED);
    unlock(c->device);
}

fc_chunk *fc_chunk_pick_victim(int device)
{
    lock(device);
    fc_chunk *c = NULL;
    for (int l = 0; l < FC_NLISTS && !c; l++)
        if (fc_lists[device][l].next != &fc_lists[device][l]) c = fc_lists[device][l].next;
    if (c) {
        unlink_chunk(c);
        c->list = FC_LIST_EVICTING;
    }
    unlock(device);
    return c;
}

void fc_chunk_release(fc_chunk *c)
{
    lock(c->device);
    unlink_chunk(c);
    fc_used[c->device] -= c->bytes;
    unlock(c->device);
    free(c);
}
