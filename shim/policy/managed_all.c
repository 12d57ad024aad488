/* managed_all.c: PUMP_MANAGED_ALL. A program that allocates device memory
 * (PyTorch, cuda-python, CuPy) gives pump nothing to prefetch; made managed,
 * the same allocations can be prefetched, and can go beyond GPU memory where
 * the capacity allows.
 *
 * Managed memory stands in for device memory only where every visible device
 * has concurrent managed access: without it, the host may not touch any
 * managed memory while a kernel runs, a rule a program written for device
 * memory never had to follow. Elsewhere managed_all is off, said once.
 *
 * Nor is it on where the driver cannot tell a kernel's parameter layout
 * (cuFuncGetParamInfo and cuKernelGetParamInfo came with CUDA 12.4; the
 * long-term 535 branch is CUDA 12.2): the launches the CUDA runtime and
 * PyTorch make pass their arguments as kernelParams, which pump cannot scan
 * without it, so the memory made managed would only fault in, never be
 * prefetched. There pump counts only, said once.
 */
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unwind.h>

#include "capture_mode.h"
#include "captures.h"
#include "managed_all.h"

enum { UNDECIDED, ON, OFF };
static _Atomic int decision = UNDECIDED;

/* The decision, from driver calls made with no lock held; what to say of it goes in `why`
 * (said at level 1 for ON, always for OFF), said by the one thread whose decision stands. */
static int decide(char *why, size_t size)
{
    if (!pump_config.managed_all)
        return OFF;
    int count = 0;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (pump_driver.device_get_count != NULL && pump_driver.device_get_attribute != NULL)
        r = pump_driver.device_get_count(&count);
    if (r == CUDA_ERROR_NOT_INITIALIZED)
        return UNDECIDED;  /* before cuInit: the program's call fails anyway; ask at the next */
    if (r != CUDA_SUCCESS || count < 1) {
        snprintf(why, size, "managed_all is off: the driver cannot list its devices (CUresult %d); device allocations "
                 "stay device memory",
                 (int)r);
        return OFF;
    }
    if (pump_driver.func_param_info == NULL && pump_driver.kernel_param_info == NULL) {
        snprintf(why, size, "managed_all is off: this driver cannot tell kernel parameter layouts "
                 "(cuFuncGetParamInfo, CUDA 12.4), so pump cannot see which memory the runtime's and PyTorch's "
                 "launches use; device allocations stay device memory, and pump counts only");
        return OFF;
    }
    for (int device = 0; device < count; device++) {
        int concurrent = 0;
        r = pump_driver.device_get_attribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, device);
        if (r != CUDA_SUCCESS || !concurrent) {
            snprintf(why, size, "managed_all is off: device %d has no concurrent managed access (the host could not "
                     "touch managed memory while kernels run); device allocations stay device memory, and pump "
                     "prefetches only the program's own managed allocations",
                     device);
            return OFF;
        }
    }
    snprintf(why, size, "managed_all: device allocations become managed memory (%d device%s)", count,
             count == 1 ? "" : "s");
    return ON;
}

/* Threads that come first may each decide (the same answer from the same driver); the first
 * to publish says why. */
PUMP_HIDDEN bool pump_managed_all(void)
{
    int d = atomic_load_explicit(&decision, memory_order_acquire);
    if (PUMP_LIKELY(d != UNDECIDED))
        return d == ON;
    char why[400] = "";
    struct pump_capture_mode mode = pump_capture_relax();
    int decided = decide(why, sizeof why);
    pump_capture_restore(&mode);
    if (decided == UNDECIDED)
        return false;
    if (atomic_compare_exchange_strong_explicit(&decision, &d, decided, memory_order_acq_rel,
                                                memory_order_acquire)) {
        d = decided;
        if (why[0] != '\0' && d == ON)
            pump_log(1, "%s", why);
        else if (why[0] != '\0')
            pump_notice("%s", why);
    }
    return d == ON;
}

/* ---- which library allocates ----
 * Communication libraries share their own device buffers with the other
 * processes of a job by IPC handle (NCCL's P2P transport probes "legacy IPC"
 * on a cudaMalloc buffer and silently falls back to slower transports when the
 * handle fails); managed memory has none. Their allocations stay device
 * memory. They are known by the file name of the library whose code called the
 * hook: NCCL links the CUDA runtime statically by default (its src/Makefile:
 * CUDARTLIB ?= cudart_static), so the caller is the library itself; Open MPI
 * and UCX call the driver. Through the shared runtime (libcudart.so.*) the caller
 * is the runtime: then the stack is unwound by its DWARF call-frame
 * information (libgcc's unwinder; the x86-64 ABI requires that information of
 * every object, and frame pointers may be absent, so no
 * __builtin_return_address(n > 0)), past the runtime's frames, to the library
 * that called it. An unwind that stops early names no library: the allocation
 * is made managed, as before. */
static const char *const sharing_libraries[] = {
    "libnccl",    /* NCCL and its network plugins (libnccl-net-*.so) */
    "libnvshmem", /* libnvshmem_host.so, libnvshmem.so */
    "libmpi",     /* Open MPI, MPICH (libmpich.so), Intel MPI, MVAPICH */
    "libopen-pal", "libmca_", "mca_", /* Open MPI's CUDA support: built in, common, or a component */
    "libucp", "libuct",    /* UCX, under MPI and NVSHMEM: its cuda_ipc transport */
};
static const char runtime_library[] = "libcudart.so";

enum caller { CALLER_UNKNOWN, CALLER_RUNTIME, CALLER_SHARING, CALLER_OTHER };

static bool starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

static enum caller caller_of_file(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash != NULL ? slash + 1 : path;
    if (starts_with(name, runtime_library))
        return CALLER_RUNTIME;
    for (size_t i = 0; i < sizeof sharing_libraries / sizeof *sharing_libraries; i++)
        if (starts_with(name, sharing_libraries[i]) && strstr(name, ".so") != NULL)
            return CALLER_SHARING;
    return CALLER_OTHER;
}

struct code_query {
    uintptr_t address;
    enum caller caller;
};

/* dl_iterate_phdr, not dladdr: only the object is needed, not a search of its
 * symbols (libtorch's are hundreds of thousands); the name is read under the
 * loader's lock, so a concurrent dlclose cannot free it. */
static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct code_query *query = data;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type == PT_LOAD && query->address - (info->dlpi_addr + segment->p_vaddr) < segment->p_memsz) {
            query->caller = caller_of_file(info->dlpi_name != NULL ? info->dlpi_name : "");
            return 1;
        }
    }
    return 0;
}

/* A return address: the call instruction is just before it. */
static enum caller caller_at(uintptr_t return_address)
{
    struct code_query query = {.address = return_address - 1, .caller = CALLER_UNKNOWN};
    dl_iterate_phdr(find_object, &query);
    return query.caller;
}

/* Far enough for any runtime's own frames; the walk stops at the first other library. */
#define UNWIND_FRAMES 32

struct unwind_walk {
    uintptr_t hook_return;  /* the runtime's frame that called the hook */
    bool past_hook;
    int frames;
    enum caller caller;
};

static _Unwind_Reason_Code unwind_step(struct _Unwind_Context *context, void *data)
{
    struct unwind_walk *walk = data;
    uintptr_t ip = _Unwind_GetIP(context);
    if (ip == 0 || ++walk->frames > UNWIND_FRAMES)
        return _URC_END_OF_STACK;
    if (!walk->past_hook) {  /* pump's own frames, up to the hook's caller */
        walk->past_hook = ip == walk->hook_return;
        return _URC_NO_REASON;
    }
    enum caller caller = caller_at(ip);
    if (caller == CALLER_RUNTIME)
        return _URC_NO_REASON;
    walk->caller = caller;
    return _URC_END_OF_STACK;
}

static enum caller caller_through_runtime(uintptr_t hook_return)
{
    struct unwind_walk walk = {.hook_return = hook_return, .caller = CALLER_UNKNOWN};
    _Unwind_Backtrace(unwind_step, &walk);
    return walk.caller;
}

PUMP_HIDDEN bool pump_managed_all_for(const void *caller)
{
    if (!pump_managed_all())
        return false;
    uintptr_t hook_return = (uintptr_t)caller;
    enum caller kind = caller_at(hook_return);
    if (kind == CALLER_RUNTIME)
        kind = caller_through_runtime(hook_return);
    if (kind != CALLER_SHARING)
        return true;
    PUMP_COUNT(managed_all_kept_shared, 1);
    pump_log_once("managed_all: a communication library's allocations (NCCL, MPI, NVSHMEM, UCX) stay device "
                  "memory: it shares them with other processes by IPC handle");
    return false;
}

/* Each device's default pools, looked up once: the one cuMemAllocAsync uses
 * unless the program sets another (pinned), and the managed one pump uses
 * instead. Devices past the table pass through. */
static struct {
    _Atomic(CUmemoryPool) device_default;
    _Atomic(CUmemoryPool) managed;
    _Atomic bool following;  /* the managed pool follows the device default pool's threshold */
    _Atomic uint64_t threshold; /* ... the value last copied (managed_all_cache.c keeps as much) */
} pools[PUMP_DEVICES_MAX];

/* A racing lookup stores the same handle: no lock needed. */
static CUmemoryPool cached(_Atomic(CUmemoryPool) *slot, CUresult (*lookup)(CUmemoryPool *, CUdevice), CUdevice device)
{
    CUmemoryPool pool = atomic_load_explicit(slot, memory_order_acquire);
    if (pool == NULL && lookup(&pool, device) == CUDA_SUCCESS)
        atomic_store_explicit(slot, pool, memory_order_release);
    return pool;
}

static CUresult device_default_pool(CUmemoryPool *pool, CUdevice device)
{
    return pump_driver.device_get_default_mem_pool(pool, device);
}

static CUresult managed_default_pool(CUmemoryPool *pool, CUdevice device)
{
    CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
    return pump_driver.mem_get_default_mem_pool(pool, &location, CU_MEM_ALLOCATION_TYPE_MANAGED);
}

static CUmemoryPool managed_pool_for(CUstream stream, int *device_out);
static void follow_threshold(CUdevice device);

PUMP_HIDDEN CUmemoryPool pump_managed_pool_for(CUstream stream, int *device)
{
    struct pump_capture_mode mode = pump_capture_relax();
    CUmemoryPool pool = managed_pool_for(stream, device);
    pump_capture_restore(&mode);
    return pool;
}

static CUmemoryPool managed_pool_for(CUstream stream, int *device_out)
{
    if (pump_driver.mem_get_default_mem_pool == NULL || pump_driver.stream_get_device == NULL ||
        pump_driver.device_get_mem_pool == NULL || pump_driver.device_get_default_mem_pool == NULL ||
        pump_driver.stream_is_capturing == NULL) {
        pump_log_once("managed_all: this driver has no managed memory pools (CUDA 13): stream-ordered "
                      "allocations stay device memory");
        return NULL;
    }
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;  /* no capture open: not asked (captures.h) */
    if (!pump_captures_none() && pump_driver.stream_is_capturing(stream, &capture) != CUDA_SUCCESS)
        return NULL;  /* the driver's own call will say what is wrong with the stream */
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        PUMP_COUNT(managed_all_captured, 1);  /* the graph owns the allocation: its node is the program's */
        return NULL;
    }
    CUdevice device;
    if (pump_driver.stream_get_device(stream, &device) != CUDA_SUCCESS || device < 0 || device >= PUMP_DEVICES_MAX)
        return NULL;
    CUmemoryPool current, device_default = cached(&pools[device].device_default, device_default_pool, device);
    if (device_default == NULL || pump_driver.device_get_mem_pool(&current, device) != CUDA_SUCCESS)
        return NULL;
    if (current != device_default) {
        pump_log_once("managed_all: the program chose its own memory pool for device %d: its stream-ordered "
                      "allocations come from it unchanged",
                      (int)device);
        return NULL;
    }
    CUmemoryPool managed = cached(&pools[device].managed, managed_default_pool, device);
    if (managed != NULL && !atomic_exchange_explicit(&pools[device].following, true, memory_order_acq_rel))
        follow_threshold(device);
    *device_out = (int)device;
    return managed;
}

/* ---- the managed pool follows the release threshold the program set ----
 * The managed pool stands in for the device's default pool, so it keeps what the
 * program asked that pool to keep: its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
 * default 0: what a pool keeps above it goes back to the driver at the next synchronisation
 * and must be populated again when allocated again). PyTorch's cudaMallocAsync backend
 * raises it to UINT64_MAX before a device's first allocation
 * (c10/cuda/CUDAMallocAsyncAllocator.cpp, lazy_init_device); left at 0, the managed pool gave
 * every step's memory back at its synchronisation and faulted or prefetched it in anew the
 * next step. Copied when pump takes the managed pool and again whenever the program sets it
 * (hooks_pool.c): simpler than answering every attribute call for two pools, and exact, since
 * the driver keeps the one value. What a pool keeps is not in pump's footprint (its live
 * allocations are); it is managed memory, which the driver evicts under pressure rather than
 * failing an allocation, and the live allocations that first reserved it were within the
 * capacity. */
static _Atomic uint64_t follow_requests[PUMP_DEVICES_MAX];

/* The last copy made reads the latest value, with no lock held across the driver calls: a
 * copy that another began after it began is made again (a thread that copies an old value
 * late sees the later request and copies once more). */
static void follow_threshold(CUdevice device)
{
    CUmemoryPool program = atomic_load_explicit(&pools[device].device_default, memory_order_acquire);
    CUmemoryPool managed = atomic_load_explicit(&pools[device].managed, memory_order_acquire);
    if (program == NULL || managed == NULL || pump_driver.mem_pool_get_attribute == NULL ||
        pump_driver.mem_pool_set_attribute == NULL)
        return;
    uint64_t seen = atomic_fetch_add(&follow_requests[device], 1) + 1;
    CUresult r = CUDA_SUCCESS;
    for (int copies = 0; copies < 16 && r == CUDA_SUCCESS; copies++) {
        cuuint64_t threshold = 0;
        r = pump_driver.mem_pool_get_attribute(program, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
        if (r == CUDA_SUCCESS)
            r = pump_driver.mem_pool_set_attribute(managed, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
        if (r == CUDA_SUCCESS)
            atomic_store_explicit(&pools[device].threshold, threshold, memory_order_relaxed);
        uint64_t now = atomic_load(&follow_requests[device]);
        if (now == seen)
            break;
        seen = now;
    }
    if (r != CUDA_SUCCESS)
        pump_log_once("managed_all: the managed pool cannot follow the device pool's release threshold "
                      "(CUresult %d): it gives freed memory back at synchronisations",
                      (int)r);
}

/* The device whose default pool `pool` is and whose managed pool pump took, or -1. */
static int device_standing_in(CUmemoryPool pool)
{
    for (int device = 0; pool != NULL && device < PUMP_DEVICES_MAX; device++)
        if (atomic_load_explicit(&pools[device].device_default, memory_order_acquire) == pool &&
            atomic_load_explicit(&pools[device].following, memory_order_acquire))
            return device;
    return -1;
}

PUMP_HIDDEN void pump_managed_pool_follow(CUmemoryPool program_pool)
{
    int device = device_standing_in(program_pool);
    if (device >= 0)
        follow_threshold(device);
}

PUMP_HIDDEN CUmemoryPool pump_managed_pool_standing_in(CUmemoryPool program_pool)
{
    int device = device_standing_in(program_pool);
    return device >= 0 ? atomic_load_explicit(&pools[device].managed, memory_order_acquire) : NULL;
}

PUMP_HIDDEN int pump_managed_pool_device(CUmemoryPool program_pool)
{
    return device_standing_in(program_pool);
}

PUMP_HIDDEN uint64_t pump_managed_pool_threshold(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? atomic_load_explicit(&pools[device].threshold, memory_order_relaxed)
                                                   : 0;
}
