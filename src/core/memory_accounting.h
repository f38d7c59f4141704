// The category accounting every allocator (the CPU's, each GPU's) keeps in its MemoryStats: bytes
// charged to a category and released, moved between categories, peaks reset. Callers hold their
// allocator's lock.
#pragma once
#include <algorithm>
#include <cstdint>

#include "mixprec/allocator.h"
#include "mixprec/error.h"

namespace mixprec::detail {

inline void charge_category(MemoryStats& s, int64_t bytes, MemCategory cat) {
  const auto i = static_cast<size_t>(cat);
  s.live_bytes[i] += bytes;
  s.live_total += bytes;
  s.peak_bytes[i] = std::max(s.peak_bytes[i], s.live_bytes[i]);
  if (s.live_total > s.peak_total) {  // the split at the moment of the total's peak
    s.peak_total = s.live_total;
    s.at_peak_bytes = s.live_bytes;
  }
}

inline void release_category(MemoryStats& s, int64_t bytes, MemCategory cat) {
  const auto i = static_cast<size_t>(cat);
  s.live_bytes[i] -= bytes;
  s.live_total -= bytes;
  MIXPREC_ASSERT(s.live_bytes[i] >= 0, "category ", mem_category_name(cat), " went negative");
}

inline void move_category(MemoryStats& s, int64_t bytes, MemCategory from, MemCategory to) {
  release_category(s, bytes, from);
  charge_category(s, bytes, to);
}

inline void reset_category_peaks(MemoryStats& s) {
  s.peak_bytes = s.live_bytes;
  s.peak_total = s.live_total;
  s.at_peak_bytes = s.live_bytes;
}

}  // namespace mixprec::detail
