// The counting, caching, budgeted allocator behind every tensor.
#include "mixprec/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/memory_accounting.h"
#include "mixprec/error.h"

namespace mixprec {
namespace {

constexpr size_t kAlign = 64;                         // one cache line; AVX-512 loads are aligned
constexpr size_t kCacheMinBytes = 1 << 16;            // blocks this large are kept for reuse
constexpr int64_t kCacheMaxBytes = int64_t(1) << 31;  // cap on idle cached bytes

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct State {
  std::mutex mu;
  MemoryStats s;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block

  void release_cache_locked() {
    for (auto& [bytes, p] : free_blocks) std::free(p);
    free_blocks.clear();
    s.cached_bytes = 0;
  }
};

State& state() {
  static State* st = new State();  // never destroyed: tensors may outlive static destruction
  return *st;
}

thread_local MemCategory tl_category = MemCategory::activations;

}  // namespace

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::parameters:
      return "parameters";
    case MemCategory::gradients:
      return "gradients";
    case MemCategory::optimizer_state:
      return "optimizer_state";
    case MemCategory::activations:
      return "activations";
    case MemCategory::temporaries:
      return "temporaries";
    case MemCategory::workspace:
      return "workspace";
    case MemCategory::data:
      return "data";
    case MemCategory::other:
      return "other";
    case MemCategory::count_:
      break;
  }
  return "?";
}

MemCategory current_mem_category() { return tl_category; }
MemoryScope::MemoryScope(MemCategory c) : prev_(tl_category) { tl_category = c; }
MemoryScope::~MemoryScope() { tl_category = prev_; }

namespace allocator {

void* allocate(size_t bytes, MemCategory cat) {
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.s.budget_bytes > 0 && st.s.live_total + int64_t(size) > st.s.budget_bytes) {
    ++st.s.num_ooms;
    throw OutOfMemory(detail::concat("out of memory: allocating ", size, " bytes of ", mem_category_name(cat), " with ",
                                     st.s.live_total, " bytes live would exceed the budget of ", st.s.budget_bytes,
                                     " bytes"));
  }
  void* p = nullptr;
  if (size >= kCacheMinBytes) {
    auto it = st.free_blocks.find(size);
    if (it != st.free_blocks.end()) {
      p = it->second;
      st.free_blocks.erase(it);
      st.s.cached_bytes -= int64_t(size);
      ++st.s.num_cache_hits;
    }
  }
  if (p == nullptr) {
    // With a budget, live + cached must fit too (a device has only so much); drop the cache.
    if (st.s.budget_bytes > 0 && st.s.live_total + st.s.cached_bytes + int64_t(size) > st.s.budget_bytes)
      st.release_cache_locked();
    p = std::aligned_alloc(kAlign, size);
    if (p == nullptr) {
      st.release_cache_locked();
      p = std::aligned_alloc(kAlign, size);
    }
    if (p == nullptr) {
      ++st.s.num_ooms;
      throw OutOfMemory(detail::concat("out of memory: the system refused ", size, " bytes"));
    }
    ++st.s.num_allocs;
  }
  detail::charge_category(st.s, int64_t(size), cat);
  st.s.peak_reserved_bytes = std::max(st.s.peak_reserved_bytes, st.s.live_total + st.s.cached_bytes);
  return p;
}

void deallocate(void* ptr, size_t bytes, MemCategory cat) {
  if (ptr == nullptr) return;
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  detail::release_category(st.s, int64_t(size), cat);
  if (size >= kCacheMinBytes && st.s.cached_bytes + int64_t(size) <= kCacheMaxBytes) {
    st.free_blocks.emplace(size, ptr);
    st.s.cached_bytes += int64_t(size);
  } else {
    std::free(ptr);
  }
}

void recategorize(size_t bytes, MemCategory from, MemCategory to) {
  if (from == to) return;
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  detail::move_category(st.s, int64_t(size), from, to);
}

MemoryStats stats() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  MemoryStats s = st.s;
  // Every block is exactly its rounded request, and cached blocks are all that is held beyond them.
  s.allocated_bytes = s.live_total;
  s.peak_allocated_bytes = s.peak_total;
  s.reserved_bytes = s.live_total + s.cached_bytes;
  return s;
}

void reset_peak() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  detail::reset_category_peaks(st.s);
  st.s.peak_reserved_bytes = st.s.live_total + st.s.cached_bytes;
}

void set_budget(int64_t bytes) {
  MIXPREC_CHECK(bytes >= 0, "memory budget must be >= 0 bytes, got ", bytes);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.s.budget_bytes = bytes;
}

void empty_cache() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.release_cache_locked();
}

}  // namespace allocator
}  // namespace mixprec
