/* handles.c: the kind of each kernel handle the driver handed out (see handles.h).
 *
 * One word a handle: its address with the kind in the two low bits (driver handles are
 * pointers to its objects, at least 4-byte aligned; one that is not stays unknown), and
 * beside it the module or library that handed it out. The words live in an open-addressed
 * table written with compare-and-swap, probed a bounded distance: no lock, no allocation.
 * Handles are made once per kernel and context (PyTorch's few thousand kernels, each a
 * CUkernel and a CUfunction per device), so the table rarely fills; when it does, the
 * newest handles stay unknown (said once). An unloaded owner's handles keep their slots
 * with the kind unknown: the driver may hand the same address out again, as any kind, and
 * the note of it then finds its slot. A handle's name is asked of the driver by its kind
 * (pump_handle_name).
 */
#include "handles.h"

#define HANDLE_SLOTS 65536 /* power of two: 512 KiB, touched only where handles land */
#define HANDLE_PROBES 64   /* slots looked at before a handle counts as not there */
#define KIND_BITS ((uintptr_t)3)

static uintptr_t slots[HANDLE_SLOTS];
static uintptr_t owners[HANDLE_SLOTS]; /* the module or library, 0 when not known */

static size_t slot_of(uintptr_t handle)
{
    return (size_t)((handle >> 3) * 0x9E3779B97F4A7C15ull >> 40) & (HANDLE_SLOTS - 1);
}

static void set_owner(size_t slot, const void *owner)
{
    if (owner != NULL)  /* a note without one (a graph node's) leaves what is known */
        __atomic_store_n(&owners[slot], (uintptr_t)owner, __ATOMIC_RELEASE);
}

PUMP_HIDDEN void pump_handle_note(const void *handle, enum pump_handle_kind kind, const void *owner)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == 0 || (key & KIND_BITS) != 0 || kind == PUMP_HANDLE_UNKNOWN)
        return;
    uintptr_t word = key | (uintptr_t)kind;
    size_t slot = slot_of(key);
    for (int probe = 0; probe < HANDLE_PROBES; probe++, slot = (slot + 1) & (HANDLE_SLOTS - 1)) {
        uintptr_t seen = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
        if (seen == 0 && __atomic_compare_exchange_n(&slots[slot], &seen, word, false, __ATOMIC_RELEASE,
                                                     __ATOMIC_ACQUIRE)) {
            set_owner(slot, owner);
            return;
        }
        if ((seen & ~KIND_BITS) == key) {  /* known (or just written by another thread): the latest kind */
            set_owner(slot, owner);
            __atomic_store_n(&slots[slot], word, __ATOMIC_RELEASE);
            return;
        }
    }
    pump_log_once("more than %d kernel handles near one another: the newest are of unknown origin to pump "
                  "(their layouts are asked as CUfunctions first)", HANDLE_PROBES);
}

/* The slot holding handle's word, or -1. */
static long find(const void *handle)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == 0 || (key & KIND_BITS) != 0)
        return -1;
    size_t slot = slot_of(key);
    for (int probe = 0; probe < HANDLE_PROBES; probe++, slot = (slot + 1) & (HANDLE_SLOTS - 1)) {
        uintptr_t seen = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
        if (seen == 0)
            break;
        if ((seen & ~KIND_BITS) == key)
            return (long)slot;
    }
    return -1;
}

PUMP_HIDDEN enum pump_handle_kind pump_handle_kind_of(const void *handle)
{
    long slot = find(handle);
    return slot < 0 ? PUMP_HANDLE_UNKNOWN
                    : (enum pump_handle_kind)(__atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE) & KIND_BITS);
}

PUMP_HIDDEN const void *pump_handle_owner_of(const void *handle)
{
    long slot = find(handle);
    return slot < 0 ? NULL : (const void *)__atomic_load_n(&owners[slot], __ATOMIC_ACQUIRE);
}

/* One pass over the table (512 KiB of words, 512 KiB of owners, read in order), once per
 * unload, off the launch path. A handle of no known owner may be the unloaded one's too. */
PUMP_HIDDEN void pump_handles_forget(const void *owner)
{
    for (size_t slot = 0; slot < HANDLE_SLOTS; slot++) {
        uintptr_t seen = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
        uintptr_t of = __atomic_load_n(&owners[slot], __ATOMIC_ACQUIRE);
        if (seen == 0 || (seen & KIND_BITS) == PUMP_HANDLE_UNKNOWN || (of != 0 && of != (uintptr_t)owner))
            continue;
        __atomic_store_n(&owners[slot], 0, __ATOMIC_RELAXED);
        __atomic_compare_exchange_n(&slots[slot], &seen, seen & ~KIND_BITS, false, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);  /* lost to a new note: that note stands */
    }
}

PUMP_HIDDEN const char *pump_handle_name(CUfunction f)
{
    const char *name = NULL;
    enum pump_handle_kind kind = pump_handle_kind_of(f);
    if (kind != PUMP_HANDLE_KERNEL && pump_driver.func_get_name != NULL &&
        pump_driver.func_get_name(&name, f) == CUDA_SUCCESS && name != NULL)
        return name;
    name = NULL;
    if (kind != PUMP_HANDLE_FUNCTION && pump_driver.kernel_get_name != NULL &&
        pump_driver.kernel_get_name(&name, (CUkernel)(void *)f) == CUDA_SUCCESS && name != NULL)
        return name;
    return "";
}
