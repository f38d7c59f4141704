// The allocators every tensor byte goes through, one per device: live and peak bytes by category
// and an optional budget (OutOfMemory). The CPU's: 64-byte alignment, a caching free-list for
// large blocks.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mixprec/device.h"

namespace mixprec {

enum class MemCategory : uint8_t {
  parameters,       // model weights and buffers (running stats)
  gradients,        // .grad of leaves
  optimizer_state,  // momentum, Adam moments, fp32 master copies
  activations,      // everything the forward pass allocates (incl. tensors saved for backward)
  temporaries,      // backward-pass intermediates
  workspace,        // oneDNN scratchpads and kernel scratch
  data,             // input batches
  other,
  count_
};
constexpr size_t kNumMemCategories = static_cast<size_t>(MemCategory::count_);
std::string_view mem_category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> live_bytes{};
  std::array<int64_t, kNumMemCategories> peak_bytes{};     // each category's own peak
  std::array<int64_t, kNumMemCategories> at_peak_bytes{};  // the split at the moment of peak_total
  int64_t live_total = 0;
  int64_t peak_total = 0;
  int64_t cached_bytes = 0;  // free blocks held for reuse (not live)
  int64_t budget_bytes = 0;  // 0: no budget
  int64_t num_allocs = 0;    // calls that reached malloc (cache misses)
  int64_t num_cache_hits = 0;
  // The bytes held from the system or device, as PyTorch reports them (memory_allocated and
  // memory_reserved). On a GPU a block may be larger than its rounded request (a remainder too small
  // to split), so allocated_bytes >= live_total there; on the CPU they are equal.
  int64_t allocated_bytes = 0;  // live blocks' sizes
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // allocated + cached; what a device's budget counts
  int64_t peak_reserved_bytes = 0;
  int64_t num_ooms = 0;  // OutOfMemory thrown (device allocators)
};

// Thread-safe process-wide allocators, one per device. The calls without a device are the CPU's.
namespace allocator {
void* allocate(size_t bytes, MemCategory cat);  // 64-byte aligned; throws OutOfMemory
void deallocate(void* ptr, size_t bytes, MemCategory cat);
void recategorize(size_t bytes, MemCategory from, MemCategory to);  // ownership moved
MemoryStats stats();
void reset_peak();               // peak := live, for every category
void set_budget(int64_t bytes);  // 0 disables; live + new > budget -> OutOfMemory
void empty_cache();              // return cached blocks to the system

MemoryStats stats(const Device& d);
void reset_peak(const Device& d);
void set_budget(int64_t bytes, const Device& d);
void empty_cache(const Device& d);
}  // namespace allocator

// Thread-local category for new allocations (RAII, nests).
MemCategory current_mem_category();
class MemoryScope {
 public:
  explicit MemoryScope(MemCategory c);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemCategory prev_;
};

}  // namespace mixprec
