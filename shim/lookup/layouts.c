/* layouts.c: the per-function parameter layout cache (see layouts.h).
 *
 * Each handle's layout is asked of the call that takes its kind, as handles.c
 * recorded it from the call that handed it out: cuFuncGetParamInfo for a
 * CUfunction, cuKernelGetParamInfo for a CUkernel (cuda.h allows casting a
 * CUkernel to CUfunction for the launch and occupancy calls only; asked of the
 * other kind, a driver may refuse, or read one object as the other and answer
 * a wrong layout with success, which would make the scan read past a launch's
 * kernelParams). A handle of unknown origin (made by a driver-internal path pump
 * does not see, e.g. a captured graph node's CUfunction) is asked as what the
 * launch and graph-node prototypes name it, a CUfunction, and only when that is
 * refused as a CUkernel: every documented call that makes a CUkernel
 * (cuLibraryGetKernel, cuLibraryEnumerateKernels) is hooked, so an unknown
 * handle is most likely a CUfunction; nothing in cuda.h tells the kinds apart,
 * and asking nothing would leave those launches unscanned. Launches by handle
 * kind are counted (launches_kernel_handles, launches_function_handles,
 * launches_unknown_handles). The count comes from cuFuncGetParamCount or
 * cuKernelGetParamCount where the driver has them (CUDA 13.2); before that there is
 * no parameter-count call, and indices are asked for until the driver answers
 * CUDA_ERROR_INVALID_VALUE: one refused call per layout, which compute-sanitizer
 * reports as an API error (docs/gpu-check.md says why it is expected there).
 *
 * The cache is an open-addressed table written with compare-and-swap: no
 * lock on the launch path. A handle's address does not name one kernel for
 * good: after cuModuleUnload or cuLibraryUnload the driver may hand it to
 * another kernel, and scanning that kernel's launch with the old layout would
 * read kernelParams past its end. So each layout carries the unload epoch it
 * was asked in, and any unload (which may be of a handle pump knows no owner
 * of: a graph node's, a private entry point's) moves the epoch on before the
 * driver frees anything: every cached layout is asked again once, at its next
 * launch ((params + 1) parameter-info calls, host-side lookups, against the
 * module load that usually follows an unload, which reads or JITs an image).
 * A layout asked again and found the same is kept; one that changed is
 * replaced, the old one kept on a list, not freed (a racing scan may be
 * reading it): one per reused address whose kernel changed.
 */
#include <stdlib.h>
#include <string.h>

#include "capture_mode.h"
#include "handles.h"
#include "layouts.h"
#include "tensor_maps.h"

#define PUMP_LAYOUT_SLOTS 16384 /* power of two */
#define PUMP_MAX_PARAMS 4096    /* the driver allows 32764 bytes of parameters */

static uintptr_t keys[PUMP_LAYOUT_SLOTS];
static const struct pump_layout *values[PUMP_LAYOUT_SLOTS];
static uint8_t announced[PUMP_LAYOUT_SLOTS];  /* 1 once its announcer took it */
static bool (*_Atomic announcer)(CUfunction f);
static const struct pump_layout unknown_layout = {.known = false, .epoch = 0};  /* never current */
PUMP_HIDDEN uint32_t pump_layouts_epoch = 1;  /* moved on by each unload; 0 is never current */
static struct pump_layout *retired;  /* replaced layouts, linked through `retired_next` */

typedef CUresult (*param_info_fn)(void *handle, size_t index, size_t *offset, size_t *size);
typedef CUresult (*param_count_fn)(void *handle, size_t *count);

/* Asks one of the two kinds' calls (the count first, where the driver has it); false if
 * they do not accept this handle. */
static bool query(param_info_fn info, param_count_fn count, CUfunction f, size_t *offsets, size_t *sizes,
                  uint32_t *params)
{
    if (info == NULL)
        return false;
    size_t known = 0;
    bool counted = count != NULL;
    if (counted && count((void *)f, &known) != CUDA_SUCCESS)
        return false;
    if (counted && known > PUMP_MAX_PARAMS)
        return false;
    uint32_t n = 0;
    for (; n < (counted ? known : PUMP_MAX_PARAMS); n++) {
        CUresult r = info((void *)f, n, &offsets[n], &sizes[n]);
        if (r == CUDA_ERROR_INVALID_VALUE && !counted)
            break;  /* past the last parameter */
        if (r != CUDA_SUCCESS)
            return false;
    }
    *params = n;
    return true;
}

/* The layout as the call matching f's kind answers it; false if none would. */
static bool ask(CUfunction f, size_t *offsets, size_t *sizes, uint32_t *params)
{
    param_info_fn func_info = (param_info_fn)pump_driver.func_param_info;
    param_info_fn kernel_info = (param_info_fn)pump_driver.kernel_param_info;
    param_count_fn func_count = (param_count_fn)pump_driver.func_param_count;
    param_count_fn kernel_count = (param_count_fn)pump_driver.kernel_param_count;
    switch (pump_handle_kind_of(f)) {
    case PUMP_HANDLE_FUNCTION:
        return query(func_info, func_count, f, offsets, sizes, params);
    case PUMP_HANDLE_KERNEL:
        return query(kernel_info, kernel_count, f, offsets, sizes, params);
    case PUMP_HANDLE_UNKNOWN:
        break;
    }
    bool function_ok = query(func_info, func_count, f, offsets, sizes, params);
    if (function_ok && *params > 0)
        return true;
    /* Refused, or zero parameters, which may mean "not a CUfunction". */
    uint32_t kernel_params = 0;
    if (query(kernel_info, kernel_count, f, offsets, sizes, &kernel_params) && (kernel_params > 0 || !function_ok)) {
        *params = kernel_params;
        return true;
    }
    return function_ok;  /* zero parameters */
}

/* The spans of `length` bytes starting at multiples of `align` inside a parameter. */
static uint32_t count_spans(size_t offset, size_t size, size_t align, size_t length)
{
    uint32_t n = 0;
    for (size_t o = (offset + align - 1) & ~(align - 1); o + length <= offset + size; o += align)
        n++;
    return n;
}

static struct pump_word *add_spans(struct pump_word *next, uint32_t param, size_t offset, size_t size, size_t align,
                                   size_t length)
{
    for (size_t o = (offset + align - 1) & ~(align - 1); o + length <= offset + size; o += align)
        *next++ = (struct pump_word){
            .param = param, .offset_in_param = (uint32_t)(o - offset), .buffer_offset = (uint32_t)o, .count = 1};
    return next;
}

/* A parameter's 8-byte words as one run (none for a parameter shorter than a word). */
static struct pump_word *add_run(struct pump_word *next, uint32_t param, size_t offset, size_t size)
{
    uint32_t count = count_spans(offset, size, 8, 8);
    if (count == 0)
        return next;
    size_t first = (offset + 7) & ~(size_t)7;
    *next = (struct pump_word){
        .param = param, .offset_in_param = (uint32_t)(first - offset), .buffer_offset = (uint32_t)first, .count = count};
    return next + 1;
}

/* The layout as the driver answers now (known false if it would not), stamped with
 * `asked` (the epoch before asking); the shared unknown_layout only without memory. */
static const struct pump_layout *build(CUfunction f, uint32_t asked)
{
    size_t *offsets = malloc(2 * PUMP_MAX_PARAMS * sizeof(size_t));
    if (offsets == NULL)
        return &unknown_layout;
    size_t *sizes = offsets + PUMP_MAX_PARAMS;
    uint32_t params = 0;
    struct pump_capture_mode mode = pump_capture_relax();
    bool ok = ask(f, offsets, sizes, &params);
    const char *name = ok && params > 0 && offsets[0] == 0 ? pump_handle_name(f) : NULL;
    pump_capture_restore(&mode);
    if (!ok)
        params = 0;

    struct pump_tensor_list list = {0};
    bool listed = name != NULL && pump_tensor_list_of(name, sizes[0], &list);
    uint32_t runs = 0, windows = 0;
    for (uint32_t i = 0; i < params; i++) {
        runs += count_spans(offsets[i], sizes[i], 8, 8) > 0 && !(listed && i == 0);
        windows += count_spans(offsets[i], sizes[i], PUMP_TENSOR_MAP_ALIGN, PUMP_TENSOR_MAP_BYTES);
    }
    struct pump_layout *layout = malloc(sizeof *layout + (runs + windows) * sizeof(struct pump_word));
    if (layout == NULL) {
        free(offsets);
        return &unknown_layout;
    }
    layout->known = ok;
    layout->epoch = asked;
    layout->retired_next = NULL;
    layout->params = params;
    layout->runs = runs;
    layout->windows = windows;
    layout->listed = listed;
    layout->list = list;
    struct pump_word *next = layout->word;
    for (uint32_t i = listed ? 1 : 0; i < params; i++)
        next = add_run(next, i, offsets[i], sizes[i]);
    for (uint32_t i = 0; i < params; i++)
        next = add_spans(next, i, offsets[i], sizes[i], PUMP_TENSOR_MAP_ALIGN, PUMP_TENSOR_MAP_BYTES);
    free(offsets);
    return layout;
}

static size_t slot_of(uintptr_t key)
{
    return (size_t)((key >> 4) * 0x9E3779B97F4A7C15ull >> 32) & (PUMP_LAYOUT_SLOTS - 1);
}

/* A slot whose key is set gets its value a moment later: wait for it. */
static const struct pump_layout *value_at(size_t slot)
{
    const struct pump_layout *v;
    while ((v = __atomic_load_n(&values[slot], __ATOMIC_ACQUIRE)) == NULL)
        pump_cpu_relax();
    return v;
}

/* Launches repeat the same kernel: each thread remembers its last one, and the
 * epoch it was current in. The library is preloaded, so its thread-locals can
 * live in the static TLS block. */
#define PUMP_TLS __attribute__((tls_model("initial-exec"))) _Thread_local
static PUMP_TLS CUfunction last_function;
static PUMP_TLS const struct pump_layout *last_layout;
static PUMP_TLS uint32_t last_epoch;

static const struct pump_layout *cached_layout_of(CUfunction f, uint32_t *current);

PUMP_HIDDEN const struct pump_layout *pump_layout_of(CUfunction f)
{
    /* Relaxed is enough: a recycled handle reaches this thread through the driver's
     * unload and load, which order the epoch's move before. */
    uint32_t now = __atomic_load_n(&pump_layouts_epoch, __ATOMIC_RELAXED);
    if (PUMP_LIKELY(f == last_function && last_epoch == now))  /* now is never 0: last_epoch is set */
        return last_layout;
    const struct pump_layout *layout = cached_layout_of(f, &now);
    last_function = f;
    last_layout = layout;
    last_epoch = now;
    return layout;
}

PUMP_HIDDEN void pump_layouts_forget(void)
{
    uint32_t next = __atomic_add_fetch(&pump_layouts_epoch, 1, __ATOMIC_SEQ_CST);
    if (next == 0)  /* 2^32 unloads: 0 stays never current */
        __atomic_compare_exchange_n(&pump_layouts_epoch, &next, 1, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
}

static void announce(size_t slot)
{
    bool (*fn)(CUfunction) = atomic_load_explicit(&announcer, memory_order_seq_cst);
    uint8_t not_yet = 0;
    if (fn != NULL &&
        __atomic_compare_exchange_n(&announced[slot], &not_yet, 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        !fn((CUfunction)__atomic_load_n(&keys[slot], __ATOMIC_RELAXED)))
        __atomic_store_n(&announced[slot], 0, __ATOMIC_RELAXED);  /* not taken: for the next announcer */
}

/* The key is stored and the announcer loaded here, the announcer stored and
 * the keys loaded there, all sequentially consistent: at least one side sees
 * the other's, so no function goes unannounced. */
PUMP_HIDDEN void pump_layouts_announce(bool (*fn)(CUfunction f))
{
    atomic_store_explicit(&announcer, fn, memory_order_seq_cst);
    for (size_t slot = 0; slot < PUMP_LAYOUT_SLOTS; slot++)
        if (__atomic_load_n(&keys[slot], __ATOMIC_SEQ_CST) != 0)
            announce(slot);
}

static bool same_layout(const struct pump_layout *a, const struct pump_layout *b)
{
    return a->known == b->known && a->params == b->params && a->runs == b->runs && a->windows == b->windows &&
           a->listed == b->listed && memcmp(&a->list, &b->list, sizeof a->list) == 0 &&
           memcmp(a->word, b->word, (a->runs + a->windows) * sizeof a->word[0]) == 0;
}

static void discard(const struct pump_layout *layout)
{
    if (layout != &unknown_layout)
        free((void *)layout);
}

/* The layout in `slot` (f's), asked again if an unload came since it was: kept if the
 * driver answers the same, else replaced (and announced again: another kernel). */
static const struct pump_layout *current_at(size_t slot, CUfunction f, uint32_t *current)
{
    for (;;) {
        const struct pump_layout *old = value_at(slot);
        uint32_t now = __atomic_load_n(&pump_layouts_epoch, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&old->epoch, __ATOMIC_ACQUIRE) == now) {
            *current = now;
            return old;
        }
        const struct pump_layout *fresh = build(f, now);
        if (old != &unknown_layout && fresh != &unknown_layout && same_layout(old, fresh)) {
            __atomic_store_n(&((struct pump_layout *)old)->epoch, now, __ATOMIC_RELEASE);
            discard(fresh);
            *current = now;
            return old;
        }
        const struct pump_layout *expected = old;
        if (!__atomic_compare_exchange_n(&values[slot], &expected, fresh, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE)) {
            discard(fresh);  /* another thread replaced it: look again */
            continue;
        }
        if (old != &unknown_layout) {
            struct pump_layout *o = (struct pump_layout *)old;
            o->retired_next = __atomic_load_n(&retired, __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(&retired, &o->retired_next, o, true, __ATOMIC_RELEASE,
                                                __ATOMIC_RELAXED))
                ;
        }
        __atomic_store_n(&announced[slot], 0, __ATOMIC_RELAXED);
        announce(slot);
        *current = fresh->epoch;
        return fresh;
    }
}

static const struct pump_layout *cached_layout_of(CUfunction f, uint32_t *current)
{
    uintptr_t key = (uintptr_t)f;
    size_t slot = slot_of(key);
    for (size_t probe = 0; probe < PUMP_LAYOUT_SLOTS; probe++, slot = (slot + 1) & (PUMP_LAYOUT_SLOTS - 1)) {
        uintptr_t k = __atomic_load_n(&keys[slot], __ATOMIC_ACQUIRE);
        if (k == key)
            return current_at(slot, f, current);
        if (k != 0)
            continue;
        uint32_t now = __atomic_load_n(&pump_layouts_epoch, __ATOMIC_ACQUIRE);
        const struct pump_layout *layout = build(f, now);
        uintptr_t empty = 0;
        if (__atomic_compare_exchange_n(&keys[slot], &empty, key, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&values[slot], layout, __ATOMIC_RELEASE);
            announce(slot);
            *current = layout->epoch;
            return layout;
        }
        discard(layout);
        if (empty == key)  /* another thread cached the same function first */
            return current_at(slot, f, current);
    }
    pump_log_once("more than %d kernels: layouts of the newest are not cached", PUMP_LAYOUT_SLOTS);
    *current = __atomic_load_n(&pump_layouts_epoch, __ATOMIC_ACQUIRE);  /* unknown whatever the epoch */
    return &unknown_layout;
}
