// A plain cudaMalloc/cudaFree allocator per GPU with the CPU allocator's accounting: the device
// allocator until the caching allocator (issue 17, item 3) replaces it.
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/cuda_util.h"
#include "core/device_allocator.h"

namespace mixprec::detail {
namespace {

class SimpleCudaAllocator final : public DeviceAllocator {
 public:
  explicit SimpleCudaAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes, MemCategory cat) override {
    const size_t size = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mu_);
    if (acc_.s.budget_bytes > 0 && acc_.s.live_total + int64_t(size) > acc_.s.budget_bytes)
      throw OutOfMemory(concat("out of memory on cuda:", index_, ": allocating ", size, " bytes of ",
                               mem_category_name(cat), " with ", acc_.s.live_total,
                               " bytes allocated would exceed the limit of ", acc_.s.budget_bytes, " bytes"));
    cuda::detail::DeviceGuard g(index_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemory(concat("out of memory on cuda:", index_, ": cudaMalloc of ", size, " bytes failed (",
                               cudaGetErrorString(e), ") with ", acc_.s.live_total, " bytes allocated"));
    }
    ++acc_.s.num_allocs;
    acc_.add(int64_t(size), cat);
    return p;
  }
  void deallocate(void* ptr, size_t bytes, MemCategory cat) override {
    if (ptr == nullptr) return;
    const size_t size = (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(mu_);
    cuda::detail::DeviceGuard g(index_);
    cudaFree(ptr);  // no throw from a destructor's path: a failed free is a leak, not a crash
    acc_.remove(int64_t(size), cat);
  }
  void recategorize(size_t bytes, MemCategory from, MemCategory to) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.move(int64_t((std::max<size_t>(bytes, 1) + 511) / 512 * 512), from, to);
  }
  MemoryStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return acc_.s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.reset_peak();
  }
  void set_budget(int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.s.budget_bytes = bytes;
  }
  void empty_cache() override {}

 private:
  int index_;
  std::mutex mu_;
  MemoryAccounting acc_;
};

}  // namespace

DeviceAllocator& cuda_allocator(int index) {
  static std::mutex mu;
  static auto* all = new std::map<int, std::unique_ptr<SimpleCudaAllocator>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto& a = (*all)[index];
  if (!a) a = std::make_unique<SimpleCudaAllocator>(index);
  return *a;
}

}  // namespace mixprec::detail
