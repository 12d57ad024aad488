/* fault_prefetch.c: why it exists: the UVM driver's fault-time prefetcher, the rule by which a
 * batch of GPU faults migrates more than the faulted pages (open-gpu-kernel-modules,
 * kernel-open/nvidia-uvm/uvm_perf_prefetch.c). Over the pages of one VA block (never across
 * blocks: max_prefetch_region is the block's, uvm_perf_prefetch_prenotify_fault_migrations),
 * a page counts when it is resident at the destination or faulted in the batch
 * (init_bitmap_tree_from_region), faulted pages widened to their 64 KiB big page
 * (grow_fault_granularity; fakecuda's pages are big pages, so that is each page itself). For
 * each faulted page the bitmap tree is walked from the leaf to the root, each level a
 * power-of-two subregion aligned to its size and clipped to the block
 * (uvm_perf_tree_iter_leaf_range); the largest subregion with more than threshold percent of
 * its pages counted is migrated (compute_prefetch_region: the last level that passes wins,
 * so a level that fails below a passing one does not stop it), and once a region reaches the
 * block's end the rest is skipped (compute_prefetch_mask). The faulted pages themselves are
 * not prefetch pages. The tree's leaves are 4 KiB pages; with 64 KiB pages every level of
 * 64 KiB and up counts 16 times more leaves in both the count and the size, so the result
 * is the same. */
#include "fakecuda_internal.h"

#define PAGES_PER_BLOCK (FAKECUDA_VA_BLOCK / FAKECUDA_PAGE)

static void prefetch_hint(size_t npages, const uint8_t *counted, const uint8_t *faulted, uint8_t *prefetch)
{
    size_t top = 1;
    while (top < npages) top *= 2;
    for (size_t i = 0; i < npages; i++) prefetch[i] = 0;
    for (size_t i = 0; i < npages; i++) {
        if (!faulted[i]) continue;
        size_t first = 0, outer = 0;
        for (size_t size = 1; size <= top; size *= 2) {
            size_t start = i / size * size, end = start + size < npages ? start + size : npages, count = 0;
            for (size_t q = start; q < end; q++) count += counted[q] != 0;
            if (count * 100 > (end - start) * fc_cfg.prefetch_threshold) {
                first = start;
                outer = end;
            }
        }
        for (size_t q = first; q < outer; q++) prefetch[q] = 1;
        if (outer == npages) break;
    }
    for (size_t i = 0; i < npages; i++)
        if (faulted[i]) prefetch[i] = 0;
}

/* Marks FC_BIT_DRIVER_PF on the pages of a VA block that the driver's fault-time prefetcher
 * migrates to target with the batch's faulted pages (FC_BIT_FAULTED)
 * (uvm_perf_prefetch_get_hint_va_block -> uvm_perf_prefetch_prenotify_fault_migrations):
 * off when uvm_perf_prefetch_enable is 0; its fault count restarts when the destination
 * changes and prefetching waits for uvm_perf_prefetch_min_faults; the whole block on a first
 * touch (no page resident anywhere) to the preferred location; none when a preferred location
 * other than the destination is set (should_apply_prefetch_logic, no confidential
 * computing); otherwise fault_prefetch.c's rule. The policy is that of the first faulted
 * page (uvm_va_policy_get_region). */
void fc_prefetch_plan(size_t n, const uint8_t *loc, const uint8_t *pref, uint8_t *bits, uint8_t target,
                      fc_prefetch_info *pfi)
{
    uint8_t counted[PAGES_PER_BLOCK], faulted[PAGES_PER_BLOCK], pf[PAGES_PER_BLOCK];
    size_t nfaulted = 0, resident_anywhere = 0;
    uint8_t policy = FC_LOC_UNPOP;
    for (size_t i = 0; i < n; i++) {
        faulted[i] = (bits[i] & FC_BIT_FAULTED) != 0;
        counted[i] = faulted[i] || loc[i] == target;
        resident_anywhere += loc[i] != FC_LOC_UNPOP;
        if (faulted[i] && nfaulted++ == 0) policy = pref[i];
    }
    if (!fc_cfg.prefetch_enable || nfaulted == 0) return;
    if (pfi->proc != target) *pfi = (fc_prefetch_info){ target, 0 };
    if (!resident_anywhere && policy == target) {
        for (size_t i = 0; i < n; i++) pf[i] = !faulted[i];
    } else if (policy == FC_LOC_UNPOP || policy == target) {
        prefetch_hint(n, counted, faulted, pf);
    } else {
        for (size_t i = 0; i < n; i++) pf[i] = 0;
    }
    pfi->faults += (uint32_t)nfaulted;
    if (pfi->faults < fc_cfg.prefetch_min_faults) return;
    for (size_t i = 0; i < n; i++)
        if (pf[i] && loc[i] != target) bits[i] |= FC_BIT_DRIVER_PF;
}
