// The CPU allocator (counting, caching, budgeted) and the choice of allocator per device.
#include "mixprec/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string_view>

#include <sys/mman.h>

#include "core/cuda/cuda_memory.h"
#include "core/device_allocator.h"
#include "core/fenced.h"
#include "mixprec/error.h"

namespace mixprec {
namespace {

constexpr size_t kAlign = 64;                         // one cache line; AVX-512 loads are aligned
constexpr size_t kCacheMinBytes = 1 << 16;            // blocks this large are kept for reuse
constexpr int64_t kCacheMaxBytes = int64_t(1) << 31;  // cap on idle cached bytes

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

constexpr size_t kHugePage = size_t(1) << 21;

// A block of at least one huge page starts on a huge-page boundary and asks for transparent huge
// pages (Debian's kernels default to THP "madvise"): a GEMM's operands then cost a TLB entry per
// 2 MiB instead of per 4 KiB, first touch faults once per 2 MiB, and MPI's single-copy transfers
// (CMA) pin 512x fewer pages. Such a block is a mapping of its own, unmapped when released: advice
// given to memory of malloc's heap outlives the block there, and a later, smaller allocation in
// the same range faulted in whole 2 MiB pages beyond the bytes counted for it (the counted peak
// of a step fell 5-12 MB short of its resident growth after the test suite's earlier tests had
// used the heap: MemoryBudget.CountedPeakIsTheResidentGrowthOfALargeStep).
bool huge_pages_enabled() {
  static const bool huge = [] {
    const char* e = std::getenv("MIXPREC_THP");
    return e == nullptr || std::string_view(e) != "0";
  }();
  return huge;
}
bool is_huge_block(size_t size) { return size >= kHugePage && huge_pages_enabled(); }
size_t mapped_bytes(size_t size) { return (size + 4095) & ~size_t(4095); }

void* system_alloc(size_t size) {
  if (!is_huge_block(size)) return std::aligned_alloc(kAlign, size);
  // Over-map by one huge page and trim both ends: what is left starts on a 2 MiB boundary.
  const size_t len = mapped_bytes(size);
  void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* const base = static_cast<char*>(raw);
  char* const p = base + (kHugePage - reinterpret_cast<uintptr_t>(base) % kHugePage) % kHugePage;
  if (p > base) ::munmap(base, size_t(p - base));
  if (base + len + kHugePage > p + len) ::munmap(p + len, size_t(base + len + kHugePage - (p + len)));
  ::madvise(p, len, MADV_HUGEPAGE);
  return p;
}

// The guard, for tests (MIXPREC_ALLOC_GUARD=1; the test suite sets it, tests/alloc_guard.cpp): each
// block is 64 bytes longer than its rounded request, and everything from the request's end to the
// block's is filled with a pattern when the block is handed out and checked when it is given back.
// A kernel that stores past its tensor's end (a vector tail's mask one lane too wide, a row's last
// chunk written whole) is then an abort naming the block, where otherwise the 64-byte rounding,
// malloc's slack and AddressSanitizer (which sees only the rounded block) all hide it. The counted
// bytes are the request's rounding either way, so every memory figure is the same with the guard.
constexpr size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xA5;
size_t guard_bytes() {
  static const size_t g = [] {
    const char* e = std::getenv("MIXPREC_ALLOC_GUARD");
    return e != nullptr && std::string_view(e) == "1" ? kGuardBytes : size_t(0);
  }();
  return g;
}
void fill_guard(void* p, size_t bytes, size_t size) {
  std::memset(static_cast<char*>(p) + bytes, kGuardByte, size + guard_bytes() - bytes);
}
void check_guard(const void* p, size_t bytes, size_t size, MemCategory cat) {
  const auto* b = static_cast<const unsigned char*>(p);
  size_t first = size + guard_bytes(), last = 0;
  for (size_t i = bytes; i < size + guard_bytes(); ++i)
    if (b[i] != kGuardByte) first = std::min(first, i), last = i;
  if (first > last) return;
  // Called from destructors: no exception can leave; the process ends with the one line.
  std::fprintf(stderr,
               "mixprec: allocation guard: bytes %zu to %zu of a %zu-byte %s block at %p were written past its end "
               "(a kernel stored beyond its tensor)\n",
               first, last, bytes, std::string(mem_category_name(cat)).c_str(), p);
  std::abort();
}

void system_free(void* p, size_t size) {
  if (is_huge_block(size))
    ::munmap(p, mapped_bytes(size));
  else
    std::free(p);
}

class CpuAllocator final : public detail::DeviceAllocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override;
  void deallocate(void* ptr, size_t bytes, MemCategory cat) override;
  void recategorize(size_t bytes, MemCategory from, MemCategory to) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.move(int64_t(round_up(bytes == 0 ? 1 : bytes)), from, to);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats s = acc_.s;
    // Every block is exactly its rounded request, and cached blocks are all that is held beyond them.
    s.allocated_bytes = s.live_total;
    s.peak_allocated_bytes = s.peak_total;
    s.reserved_bytes = s.live_total + s.cached_bytes;
    return s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.reset_peak();
    acc_.s.peak_reserved_bytes = acc_.s.live_total + acc_.s.cached_bytes;
  }
  void set_budget(int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.s.budget_bytes = bytes;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cache_locked();
  }

 private:
  void release_cache_locked() {
    for (auto& [bytes, p] : free_blocks_) system_free(p, bytes + guard_bytes());
    free_blocks_.clear();
    acc_.s.cached_bytes = 0;
  }

  mutable std::mutex mu_;
  detail::MemoryAccounting acc_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
};

CpuAllocator& cpu_allocator() {
  static auto* a = new CpuAllocator();  // never destroyed: tensors may outlive static destruction
  return *a;
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

void* CpuAllocator::allocate(size_t bytes, MemCategory cat) {
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats& s = acc_.s;
  if (s.budget_bytes > 0 && s.live_total + int64_t(size) > s.budget_bytes) {
    ++s.num_ooms;
    throw OutOfMemory(detail::concat("out of memory: allocating ", size, " bytes of ", mem_category_name(cat), " with ",
                                     s.live_total, " bytes live would exceed the budget of ", s.budget_bytes,
                                     " bytes"));
  }
  void* p = nullptr;
  if (size >= kCacheMinBytes) {
    // The block of this size given back last (a multimap keeps equal keys in insertion order, and
    // find() returns the oldest): its lines are the likeliest to be in cache still, so a kernel
    // writing its output there reads fewer lines back from memory for ownership first. The gpt's
    // amp-bf16 step, alternating runs of one binary on the AMX host: 1-9% faster in six pairs out of
    // six (median 3%), fp32 in two of three (docs/design.md, "The CPU allocator's reuse").
    auto [lo, hi] = free_blocks_.equal_range(size);
    if (lo != hi) {
      const auto it = std::prev(hi);
      p = it->second;
      free_blocks_.erase(it);
      s.cached_bytes -= int64_t(size);
      ++s.num_cache_hits;
    }
  }
  if (p == nullptr) {
    // With a budget, live + cached must fit too (a device has only so much); drop the cache.
    if (s.budget_bytes > 0 && s.live_total + s.cached_bytes + int64_t(size) > s.budget_bytes) release_cache_locked();
    p = system_alloc(size + guard_bytes());
    if (p == nullptr) {
      release_cache_locked();
      p = system_alloc(size + guard_bytes());
    }
    if (p == nullptr) {
      ++s.num_ooms;
      throw OutOfMemory(detail::concat("out of memory: the system refused ", size, " bytes"));
    }
    ++s.num_allocs;
  }
  if (guard_bytes() > 0) fill_guard(p, bytes, size);
  acc_.add(int64_t(size), cat);
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, s.live_total + s.cached_bytes);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t bytes, MemCategory cat) {
  if (ptr == nullptr) return;
  const size_t size = round_up(bytes == 0 ? 1 : bytes);
  if (guard_bytes() > 0) check_guard(ptr, bytes, size, cat);
  std::lock_guard<std::mutex> lock(mu_);
  acc_.remove(int64_t(size), cat);
  if (size >= kCacheMinBytes && acc_.s.cached_bytes + int64_t(size) <= kCacheMaxBytes) {
    free_blocks_.emplace(size, ptr);
    acc_.s.cached_bytes += int64_t(size);
  } else {
    system_free(ptr, size + guard_bytes());
  }
}

namespace detail {
DeviceAllocator& device_allocator(const Device& d) {
  switch (d.type) {
    case DeviceType::cpu:
      return cpu_allocator();
    case DeviceType::fenced:
      return fenced_allocator();
    case DeviceType::cuda:
      break;
  }
  return cuda_caching_allocator(d.index);  // throws one line where there is no such GPU
}
}  // namespace detail

namespace allocator {

void* allocate(size_t bytes, MemCategory cat) { return cpu_allocator().allocate(bytes, cat); }
void deallocate(void* ptr, size_t bytes, MemCategory cat) { cpu_allocator().deallocate(ptr, bytes, cat); }
void recategorize(size_t bytes, MemCategory from, MemCategory to) { cpu_allocator().recategorize(bytes, from, to); }
MemoryStats stats() { return cpu_allocator().stats(); }
void reset_peak() { cpu_allocator().reset_peak(); }
void set_budget(int64_t bytes) { set_budget(bytes, Device::cpu()); }
void empty_cache() { cpu_allocator().empty_cache(); }

MemoryStats stats(const Device& d) { return detail::device_allocator(d).stats(); }
void reset_peak(const Device& d) { detail::device_allocator(d).reset_peak(); }
void set_budget(int64_t bytes, const Device& d) {
  MIXPREC_CHECK(bytes >= 0, "memory budget must be >= 0 bytes, got ", bytes);
  detail::device_allocator(d).set_budget(bytes);
}
void empty_cache(const Device& d) { detail::device_allocator(d).empty_cache(); }

}  // namespace allocator
}  // namespace mixprec
