// The allocator interface every device implements (CPU, fenced, CUDA), and the per-category
// accounting they share. Internal: code outside the library uses mixprec/allocator.h.
#pragma once
#include <cstddef>

#include "core/memory_accounting.h"
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
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void set_budget(int64_t bytes) = 0;
  virtual void empty_cache() = 0;
};

// The process-wide allocator of a device (created on first use, never destroyed: tensors may
// outlive static destruction). Throws mixprec::Error for a device this process cannot use.
DeviceAllocator& device_allocator(const Device& d);
DeviceAllocator& fenced_allocator();  // core/fenced.cpp
// A GPU's: core/cuda/cuda_memory.h (cuda_caching_allocator).

// Live and peak bytes per category (callers hold their allocator's lock).
struct MemoryAccounting {
  MemoryStats s;

  void add(int64_t bytes, MemCategory cat) { charge_category(s, bytes, cat); }
  void remove(int64_t bytes, MemCategory cat) { release_category(s, bytes, cat); }
  void move(int64_t bytes, MemCategory from, MemCategory to) {
    if (from != to) move_category(s, bytes, from, to);
  }
  void reset_peak() { reset_category_peaks(s); }
};

}  // namespace mixprec::detail
