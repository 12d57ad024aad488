// torch_allocator.cpp: pump's allocator as PyTorch's CUDA allocator, with PyTorch's memory answers.
//
// `[memory] torch_allocator = "pump"` hands every tensor to libpump's pump_torch_alloc /
// pump_torch_free (shim/hooks/torch_allocator.c). PyTorch's own CUDAPluggableAllocator makes the
// switch, but answers none of PyTorch's memory questions: torch.cuda.memory_stats (and
// memory_allocated, max_memory_allocated, reset_peak_memory_stats, everything built on them)
// raises "CUDAPluggableAllocator does not yet support getDeviceStats", and cuDNN's workspace
// sizing raises on cacheInfo (pytorch/pytorch#98481). This file, compiled against the job's own
// PyTorch by sitecustomize.py (_pump_torch_build.py), is that allocator with those answers:
// it counts every tensor it hands out and takes back, as the caching allocator's DeviceStats
// do, each tensor being its own allocation (a segment of its own: pump allocates each from the
// device's pool, so nothing is split or cached on PyTorch's side), and answers cacheInfo as the
// caching allocator does with nothing cached: the device's free memory (cudaMemGetInfo).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <sys/types.h>

#include <array>
#include <cstdio>
#include <memory>
#include <mutex>

// Weak: a process without libpump loads this file and installs nothing.
extern "C" __attribute__((weak)) void *pump_torch_alloc(ssize_t size, int device, cudaStream_t stream);
extern "C" __attribute__((weak)) void pump_torch_free(void *ptr, size_t size, int device, cudaStream_t stream);

namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr int kMaxDevices = 64;
// The caching allocator's small pool: requests up to 1 MiB (CUDACachingAllocator.cpp, kSmallSize).
constexpr size_t kSmallSize = 1 << 20;

class Counts {
  public:
    void allocated(int device, size_t size)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        DeviceStats &s = stats_[device];
        for (size_t t : types(size)) {
            s.allocation[t].increase(1);
            s.segment[t].increase(1);
            s.active[t].increase(1);
            s.allocated_bytes[t].increase(size);
            s.reserved_bytes[t].increase(size);
            s.active_bytes[t].increase(size);
            s.requested_bytes[t].increase(size);
        }
        s.num_device_alloc++;
    }

    void freed(int device, size_t size)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        DeviceStats &s = stats_[device];
        for (size_t t : types(size)) {
            s.allocation[t].decrease(1);
            s.segment[t].decrease(1);
            s.active[t].decrease(1);
            s.allocated_bytes[t].decrease(size);
            s.reserved_bytes[t].decrease(size);
            s.active_bytes[t].decrease(size);
            s.requested_bytes[t].decrease(size);
        }
        s.num_device_free++;
    }

    DeviceStats get(int device)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        return stats_[device];
    }

    template <typename F> void each_stat(int device, F f)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        DeviceStats &s = stats_[device];
        for (auto *array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                            &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
            for (auto &stat : *array)
                f(stat);
        f(s.oversize_allocations);
        f(s.oversize_segments);
    }

    void reset_counters(int device)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        DeviceStats &s = stats_[device];
        s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
    }

  private:
    static std::array<size_t, 2> types(size_t size)
    {
        StatType pool = size <= kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL;
        return {static_cast<size_t>(StatType::AGGREGATE), static_cast<size_t>(pool)};
    }

    std::mutex mutex_;
    std::array<DeviceStats, kMaxDevices> stats_;
};

Counts counts;

bool counted(int device) { return device >= 0 && device < kMaxDevices; }

// libpump's NULL is an allocation refused: PyTorch's CUDAPluggableAllocator would hand it to
// the tensor as its data (a later "data is not allocated yet", or worse), so it is raised here
// as the caching allocator raises a refusal, OutOfMemoryError (torch.OutOfMemoryError).
void *alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = pump_torch_alloc(static_cast<ssize_t>(size), device, stream);
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr || size == 0, "CUDA out of memory: pump's allocator could not "
                     "allocate ", size, " bytes on device ", device, " (pump's log says why)");
    if (ptr != nullptr && counted(device))
        counts.allocated(device, size);
    return ptr;
}

void free_tensor(void *ptr, size_t size, int device, cudaStream_t stream)
{
    pump_torch_free(ptr, size, device, stream);
    if (ptr != nullptr && counted(device))
        counts.freed(device, size);
}

class PumpAllocator final : public CUDAPluggableAllocator {
  public:
    PumpAllocator() : CUDAPluggableAllocator(alloc, free_tensor) {}

    DeviceStats getDeviceStats(c10::DeviceIndex device) override
    {
        return counted(device) ? counts.get(device) : DeviceStats{};
    }

    void resetAccumulatedStats(c10::DeviceIndex device) override
    {
        if (!counted(device))
            return;
        counts.each_stat(device, [](c10::CachingAllocator::Stat &stat) { stat.reset_accumulated(); });
        counts.reset_counters(device);
    }

    void resetPeakStats(c10::DeviceIndex device) override
    {
        if (counted(device))
            counts.each_stat(device, [](c10::CachingAllocator::Stat &stat) { stat.reset_peak(); });
    }

    // The largest allocation that can be had at once: nothing is cached on PyTorch's side, so
    // what the caching allocator answers with an empty cache, the device's free memory.
    void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override
    {
        *largestBlock = getMemoryInfo(device).first;
    }

    std::string name() override { return "pump"; }
};

}  // namespace

// 0: installed; 1: no libpump in the process; 2: PyTorch refused (its message on stderr).
extern "C" int pump_torch_allocator_install(void)
{
    if (pump_torch_alloc == nullptr || pump_torch_free == nullptr)
        return 1;
    try {
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(std::make_shared<PumpAllocator>());
    } catch (const std::exception &error) {
        fprintf(stderr, "pump: PyTorch refused pump's allocator: %s\n", error.what());
        return 2;
    }
    return 0;
}
