// The allocator interface every device implements (CPU, fenced, CUDA), and the per-category
// accounting they share. Internal: code outside the library uses mixprec/allocator.h.
#pragma once
#include <cstddef>

#include "mixprec/allocator.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::detail {

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes, MemCategory cat) = 0;  // throws OutOfMemory
  virtual void deallocate(void* ptr, size_t bytes, MemCategory cat) = 0;
  virtual void recategorize(size_t bytes, MemCategory from, MemCategory to) = 0;
  virtual MemoryStats stats() = 0;
  virtual void reset_peak() = 0;
  virtual void set_budget(int64_t bytes) = 0;
  virtual void empty_cache() = 0;
};

// The process-wide allocator of a device (created on first use, never destroyed: tensors may
// outlive static destruction). Throws mixprec::Error for a device this process cannot use.
DeviceAllocator& device_allocator(const Device& d);
DeviceAllocator& fenced_allocator();  // core/fenced.cpp
#ifdef MIXPREC_WITH_CUDA
DeviceAllocator& cuda_allocator(int index);  // core/cuda/
#endif

// Live and peak bytes per category (callers hold their allocator's lock).
struct MemoryAccounting {
  MemoryStats s;

  void add(int64_t bytes, MemCategory cat) {
    auto i = static_cast<size_t>(cat);
    s.live_bytes[i] += bytes;
    s.live_total += bytes;
    if (s.live_bytes[i] > s.peak_bytes[i]) s.peak_bytes[i] = s.live_bytes[i];
    if (s.live_total > s.peak_total) {
      s.peak_total = s.live_total;
      s.at_peak_bytes = s.live_bytes;
    }
  }
  void remove(int64_t bytes, MemCategory cat) {
    auto i = static_cast<size_t>(cat);
    s.live_bytes[i] -= bytes;
    s.live_total -= bytes;
    MIXPREC_ASSERT(s.live_bytes[i] >= 0, "category ", mem_category_name(cat), " went negative");
  }
  void move(int64_t bytes, MemCategory from, MemCategory to) {
    if (from == to) return;
    remove(bytes, from);
    add(bytes, to);
  }
  void reset_peak() {
    s.peak_bytes = s.live_bytes;
    s.peak_total = s.live_total;
    s.at_peak_bytes = s.live_bytes;
  }
};

}  // namespace mixprec::detail
