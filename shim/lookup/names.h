/* names.h: a tensor of PyTorch's caching allocator as pumpd knows it, by its place in the
 * training step rather than by its address (issue 41, item 1).
 *
 * pumpd learns a job's iteration from launch keys, which hash the allocations a launch is given
 * (pump_channel.h), and plans by address. The caching allocator hands a step's tensors other
 * memory every step: on the H200's GPT-2 trace 7% of the launches kept their key from one step
 * to the next, while every step made the same allocations, size for size, and 97% of the
 * launches used the same ones named by size and place among the step's allocations of that size
 * (`pump trace stats`, docs/limits.md). So each tensor gets a name: the n-th allocation of its
 * size since the optimizer's last step (pump_names_step), bound to an address of its own in a
 * name space no real pointer reaches (PUMP_NAMES_BASE and up, 2 MiB aligned, a free 2 MiB between
 * two names, so that blocks next to each other there are one tensor's: pumpd joins them into one
 * range, dead or alive, where it plans). The same name gets
 * the same address step after step. pumpd hears tensors' allocations, frees and launches by
 * those addresses (channel.c), so a step's keys repeat, and its plans name them; the shim reads
 * a plan's range in the name space as the same bytes of the tensor that holds the name now
 * (pump_names_translate). A name still held by a live tensor when its next holder comes (a tensor
 * that outlived its step) is not shared: the newcomer goes by its own address.
 *
 * Off by default (PUMP_TORCH_NAMES=1 turns it on): on fakecuda's replay of the H200's GPT-2
 * trace, lookahead learned the step by names, but its plans moved more than the launch rule
 * (docs/limits.md). Binding and release take a lock, never held across a driver call;
 * translation takes none. */
#ifndef PUMP_NAMES_H
#define PUMP_NAMES_H

#include "pump_channel.h"
#include "ranges.h"

/* Names' addresses start here, above any x86-64 or AArch64 user-space pointer. */
#define PUMP_NAMES_BASE (1ull << 62)

/* The optimizer finished a step: names count from here again. */
PUMP_HIDDEN void pump_names_step(void);
/* Names the tensor r, of `size` bytes, just handed out, as r->name (0: it goes by its address;
 * also with PUMP_TORCH_NAMES=0, before the first step, or where the table is full). */
PUMP_HIDDEN void pump_names_bind(struct pump_range *r, uint64_t size);
/* The tensor r died: its name, if any, is free for its next holder. Returns the name (0: none). */
PUMP_HIDDEN uint64_t pump_names_release(struct pump_range *r);
/* What pumpd knows r by: its name, else its base. */
static inline uint64_t pump_range_name(const struct pump_range *r)
{
    uint64_t name = __atomic_load_n(&r->name, __ATOMIC_RELAXED);
    return name != 0 ? name : __atomic_load_n(&r->base, __ATOMIC_RELAXED);
}
/* A plan's range in the name space made the same bytes of the live tensor holding that name;
 * one that lies in no name, or whose name no live tensor holds, made empty (bytes 0). Ranges
 * outside the name space are left as they are. Lock-free. */
PUMP_HIDDEN void pump_names_translate(struct pump_plan_range *range);
PUMP_HIDDEN void pump_names_before_fork(void);
PUMP_HIDDEN void pump_names_after_fork(void);

#endif
