// The CUDA providers of the caching allocator: GPU memory (cudaMalloc, CUDA events,
// cudaDeviceSynchronize, each call on the allocator's GPU) and pinned host memory (cudaHostAlloc),
// and the process-wide allocators over them.
#include "core/cuda/cuda_memory.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_util.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::detail {
namespace {

using Event = DeviceMemoryProvider::Event;
using Stream = DeviceMemoryProvider::Stream;

void check(cudaError_t err, const char* call, const std::string& where) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clear it, so the next call does not report it again
  throw Error(concat("CUDA error in ", call, " for ", where, ": ", cudaGetErrorString(err)));
}

std::string device_name(int device) { return "cuda:" + std::to_string(device); }

using cuda::detail::DeviceGuard;

// Events without timing (cheaper to record and query), kept for reuse as PyTorch's EventPool does:
// creating one per freed block would cost a driver call each. Called under the allocator's mutex.
class EventPool {
 public:
  Event record(int device, cudaStream_t stream) {
    DeviceGuard guard(device);
    std::vector<cudaEvent_t>& free = free_[device];
    cudaEvent_t e = nullptr;
    if (free.empty()) {
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", device_name(device));
      device_of_[e] = device;
    } else {
      e = free.back();
      free.pop_back();
    }
    check(cudaEventRecord(e, stream), "cudaEventRecord", device_name(device));
    return reinterpret_cast<Event>(e);
  }

  bool done(Event event) {
    auto e = reinterpret_cast<cudaEvent_t>(event);
    const cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(err, "cudaEventQuery", device_name(device_of_.at(e)));
    return true;
  }

  void release(Event event) {
    auto e = reinterpret_cast<cudaEvent_t>(event);
    free_[device_of_.at(e)].push_back(e);
  }

 private:
  std::unordered_map<int, std::vector<cudaEvent_t>> free_;  // by device
  std::unordered_map<cudaEvent_t, int> device_of_;          // every event created
};

class CudaDeviceProvider final : public DeviceMemoryProvider {
 public:
  explicit CudaDeviceProvider(int device) : device_(device), name_(device_name(device)) {}

  void* raw_alloc(size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    // cudaMalloc is not queued on a stream, so a capture (cuda::Graph) on this thread would count it
    // as unsafe and fail; the block goes to the capture's own pool, so it is safe here (PyTorch's
    // allocator relaxes the mode the same way).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode", name_);
    const cudaError_t err = cudaMalloc(&p, bytes);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(err, "cudaMalloc", name_);
    return p;
  }
  void raw_free(void* ptr) override {
    DeviceGuard guard(device_);
    check(cudaFree(ptr), "cudaFree", name_);
  }
  Event record_event(Stream stream) override { return events_.record(device_, reinterpret_cast<cudaStream_t>(stream)); }
  bool event_done(Event event) override { return events_.done(event); }
  void release_event(Event event) override { events_.release(event); }
  void synchronize() override {
    DeviceGuard guard(device_);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", name_);
  }
  // The stream this thread queues the device's work on (core/cuda/cuda_util.h).
  Stream current_stream() override { return reinterpret_cast<Stream>(cuda::detail::current_stream(device_)); }
  int64_t capacity_bytes() override {
    DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return int64_t(total);
  }
  std::string name() const override { return name_; }

 private:
  int device_;
  std::string name_;
  EventPool events_;
};

// Pinned host memory: portable (pinned for every GPU's context), events recorded on the device of
// the stream a copy was queued on.
class PinnedHostProvider final : public DeviceMemoryProvider {
 public:
  // Blocks belong to no stream: no real cudaStream_t has this value, so record_stream() on any
  // stream, the default one included, records an event.
  static constexpr Stream kNoStream = ~Stream(0);

  void* raw_alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(err, "cudaHostAlloc", name());
    return p;
  }
  void raw_free(void* ptr) override { check(cudaFreeHost(ptr), "cudaFreeHost", name()); }
  Event record_event(Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    int device = 0;
#if CUDART_VERSION >= 12080
    check(cudaStreamGetDevice(s, &device), "cudaStreamGetDevice", name());
#else
    check(cudaGetDevice(&device), "cudaGetDevice", name());  // the copy's device is the current one
#endif
    return events_.record(device, s);
  }
  bool event_done(Event event) override { return events_.done(event); }
  void release_event(Event event) override { events_.release(event); }
  void synchronize() override {
    for (int d = 0; d < cuda::device_count(); ++d) {
      DeviceGuard guard(d);
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device_name(d));
    }
  }
  Stream current_stream() override { return kNoStream; }
  int64_t capacity_bytes() override { return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE); }
  std::string name() const override { return "pinned host memory"; }

 private:
  EventPool events_;
};

constexpr int kMaxDevices = 64;
std::array<std::atomic<CachingAllocator*>, kMaxDevices> g_device_allocators{};
std::atomic<CachingAllocator*> g_pinned_allocator{nullptr};
std::mutex g_create_mu;

// Creates the allocator in `slot` once; later calls take the fast path without the lock.
template <class Make>
CachingAllocator& get_or_create(std::atomic<CachingAllocator*>& slot, const Make& make) {
  if (CachingAllocator* a = slot.load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(g_create_mu);
  CachingAllocator* a = slot.load(std::memory_order_relaxed);
  if (a == nullptr) {
    a = new CachingAllocator(make());  // never destroyed: tensors may outlive static destruction
    slot.store(a, std::memory_order_release);
  }
  return *a;
}

}  // namespace

CachingAllocator& cuda_caching_allocator(int device) {
  if (device >= 0 && device < kMaxDevices) {
    if (CachingAllocator* a = g_device_allocators[size_t(device)].load(std::memory_order_acquire)) return *a;
  }
  cuda::require(Device::cuda(device));  // one line when there is no such GPU
  MIXPREC_CHECK(device < kMaxDevices, "cuda:", device, ": at most ", kMaxDevices, " GPUs are supported");
  return get_or_create(g_device_allocators[size_t(device)],
                       [device] { return std::make_unique<CudaDeviceProvider>(device); });
}

CachingAllocator& cuda_pinned_allocator() {
  if (CachingAllocator* a = g_pinned_allocator.load(std::memory_order_acquire)) return *a;
  cuda::require(Device::cuda(0));
  return get_or_create(g_pinned_allocator, [] { return std::make_unique<PinnedHostProvider>(); });
}

}  // namespace mixprec::detail
