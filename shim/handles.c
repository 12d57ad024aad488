/* handles.c: the kind of each kernel handle the driver handed out (see handles.h).
 *
 * One word a handle: its address with the kind in the two low bits (driver handles are
 * pointers to its objects, at least 4-byte aligned; one that is not stays unknown). The
 * words live in an open-addressed table written with compare-and-swap, probed a bounded
 * distance: no lock, no allocation, nothing freed. Handles are made once per kernel and
 * context (PyTorch's few thousand kernels, each a CUkernel and a CUfunction per device),
 * so the table rarely fills; when it does, the newest handles stay unknown (said once).
 */
#include "handles.h"

#define HANDLE_SLOTS 65536 /* power of two: 512 KiB, touched only where handles land */
#define HANDLE_PROBES 64   /* slots looked at before a handle counts as not there */
#define KIND_BITS ((uintptr_t)3)

static uintptr_t slots[HANDLE_SLOTS];

static size_t slot_of(uintptr_t handle)
{
    return (size_t)((handle >> 3) * 0x9E3779B97F4A7C15ull >> 40) & (HANDLE_SLOTS - 1);
}

PUMP_HIDDEN void pump_handle_note(const void *handle, enum pump_handle_kind kind)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == 0 || (key & KIND_BITS) != 0 || kind == PUMP_HANDLE_UNKNOWN)
        return;
    uintptr_t word = key | (uintptr_t)kind;
    size_t slot = slot_of(key);
    for (int probe = 0; probe < HANDLE_PROBES; probe++, slot = (slot + 1) & (HANDLE_SLOTS - 1)) {
        uintptr_t seen = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
        if (seen == 0 && __atomic_compare_exchange_n(&slots[slot], &seen, word, false, __ATOMIC_RELEASE,
                                                     __ATOMIC_ACQUIRE))
            return;
        if ((seen & ~KIND_BITS) == key) {  /* known (or just written by another thread): the latest kind */
            __atomic_store_n(&slots[slot], word, __ATOMIC_RELEASE);
            return;
        }
    }
    pump_log_once("more than %d kernel handles near one another: the newest are of unknown origin to pump "
                  "(their layouts are asked as CUfunctions first)", HANDLE_PROBES);
}

PUMP_HIDDEN enum pump_handle_kind pump_handle_kind_of(const void *handle)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == 0 || (key & KIND_BITS) != 0)
        return PUMP_HANDLE_UNKNOWN;
    size_t slot = slot_of(key);
    for (int probe = 0; probe < HANDLE_PROBES; probe++, slot = (slot + 1) & (HANDLE_SLOTS - 1)) {
        uintptr_t seen = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
        if (seen == 0)
            break;
        if ((seen & ~KIND_BITS) == key)
            return (enum pump_handle_kind)(seen & KIND_BITS);
    }
    return PUMP_HANDLE_UNKNOWN;
}
