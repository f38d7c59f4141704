// The allocator: bytes by category (MemoryScope), live and peak accounting, 64-byte alignment,
// reuse of large blocks, huge-page advice on blocks of 2 MiB or more, the budget (OutOfMemory,
// nothing leaked), reset_peak, and the guard past each block's end that the suite runs with.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "mixprec/allocator.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/tensor.h"

namespace mixprec {
namespace {

int64_t live(MemCategory c) { return allocator::stats().live_bytes[static_cast<size_t>(c)]; }
int64_t peak(MemCategory c) { return allocator::stats().peak_bytes[static_cast<size_t>(c)]; }
int64_t rounded(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + 63) / 64 * 64; }

// Restores "no budget" however the test exits.
struct BudgetGuard {
  ~BudgetGuard() { allocator::set_budget(0); }
};

TEST(Allocator, MemoryScopeSetsTheCategory) {
  EXPECT_EQ(current_mem_category(), MemCategory::activations);  // the default
  const int64_t p0 = live(MemCategory::parameters), o0 = live(MemCategory::optimizer_state),
                a0 = live(MemCategory::activations);
  Tensor p, o, a;
  {
    MemoryScope params(MemCategory::parameters);
    p = Tensor::zeros({100});  // 400 bytes -> 448
    {
      MemoryScope opt(MemCategory::optimizer_state);
      EXPECT_EQ(current_mem_category(), MemCategory::optimizer_state);
      o = Tensor::zeros({10}, DType::f64);  // 80 -> 128
    }
    EXPECT_EQ(current_mem_category(), MemCategory::parameters);
  }
  a = Tensor::zeros({3});
  EXPECT_EQ(live(MemCategory::parameters) - p0, rounded(400));
  EXPECT_EQ(live(MemCategory::optimizer_state) - o0, rounded(80));
  EXPECT_EQ(live(MemCategory::activations) - a0, rounded(12));
  EXPECT_EQ(p.storage()->category(), MemCategory::parameters);
  EXPECT_EQ(o.storage()->category(), MemCategory::optimizer_state);
  p = Tensor();
  o = Tensor();
  EXPECT_EQ(live(MemCategory::parameters), p0);
  EXPECT_EQ(live(MemCategory::optimizer_state), o0);
  EXPECT_EQ(mem_category_name(MemCategory::gradients), "gradients");
}

TEST(Allocator, LiveAndPeakAccounting) {
  allocator::reset_peak();
  const MemoryStats s0 = allocator::stats();
  EXPECT_EQ(s0.peak_total, s0.live_total);
  Tensor a = Tensor::empty({1000});        // 4000 -> 4032
  Tensor b = Tensor::empty({10, 10, 10});  // 4032
  const MemoryStats s1 = allocator::stats();
  EXPECT_EQ(s1.live_total - s0.live_total, 2 * 4032);
  EXPECT_EQ(s1.peak_total - s0.live_total, 2 * 4032);
  a = Tensor();
  const MemoryStats s2 = allocator::stats();
  EXPECT_EQ(s2.live_total - s0.live_total, 4032);
  EXPECT_EQ(s2.peak_total - s0.live_total, 2 * 4032);  // the peak stays
  const size_t act = static_cast<size_t>(MemCategory::activations);
  EXPECT_EQ(s2.at_peak_bytes[act] - s0.live_bytes[act], 2 * 4032);
  // Views share storage: no new bytes.
  Tensor v = b.reshape({100, 10}).transpose(0, 1).slice(0, 2, 5);
  EXPECT_EQ(allocator::stats().live_total, s2.live_total);
  b = Tensor();
  EXPECT_EQ(allocator::stats().live_total, s2.live_total);  // v keeps the storage alive
  v = Tensor();
  EXPECT_EQ(allocator::stats().live_total, s0.live_total);
}

TEST(Allocator, ResetPeakForgetsThePast) {
  {
    Tensor big = Tensor::empty({1 << 16});
    EXPECT_GE(allocator::stats().peak_total, allocator::stats().live_total);
  }
  const MemoryStats before = allocator::stats();
  EXPECT_GE(before.peak_total - before.live_total, int64_t(4) << 16);
  allocator::reset_peak();
  const MemoryStats after = allocator::stats();
  EXPECT_EQ(after.peak_total, after.live_total);
  for (size_t c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(after.peak_bytes[c], after.live_bytes[c]) << c;
  Tensor t = Tensor::empty({16});
  EXPECT_EQ(peak(MemCategory::activations), live(MemCategory::activations));
}

TEST(Allocator, SixtyFourByteAlignment) {
  for (int64_t n : {1, 3, 17, 64, 65, 1000, 20000, 100000}) {
    Tensor t = Tensor::empty({n}, DType::u8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage()->data()) % 64, 0u) << n;
  }
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(4097), size_t(1) << 17}) {
    void* p = allocator::allocate(bytes, MemCategory::workspace);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    allocator::deallocate(p, bytes, MemCategory::workspace);
  }
  EXPECT_EQ(live(MemCategory::workspace), 0);
}

// The kernel's flags on the mapping that holds `p` (the VmFlags line of /proc/self/smaps), or ""
// where smaps cannot be read.
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') > line.find('-') && head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;  // a mapping's first line: "lo-hi perms offset ..."
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

// A block of 2 MiB or more starts on a huge-page boundary and carries the advice to back it with
// transparent huge pages (VmFlags "hg"): Debian's kernels give them only where asked ("madvise").
TEST(Allocator, LargeBlocksAskForHugePages) {
  if (const char* e = std::getenv("MIXPREC_THP"); e != nullptr && std::string(e) == "0")
    GTEST_SKIP() << "MIXPREC_THP=0 turns the huge-page advice off";
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)";
  // glibc raises its mmap threshold past a freed mapping's size, as a long run's earlier work does:
  // a 3 MiB request from malloc then comes from the heap, where the advice would outlive the block.
  void* volatile big = std::malloc(size_t(8) << 20);
  std::free(big);
  allocator::empty_cache();                      // a fresh block from the system, not a cached one
  const size_t bytes = (size_t(3) << 20) + 100;  // not a whole number of pages
  void* p = allocator::allocate(bytes, MemCategory::workspace);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t(1) << 21), 0u);
  const std::string flags = vm_flags_at(p);
  allocator::deallocate(p, bytes, MemCategory::workspace);
  allocator::empty_cache();
  if (flags.empty()) GTEST_SKIP() << "/proc/self/smaps has no VmFlags line for the block (no /proc?)";
  EXPECT_NE(flags.find(" hg "), std::string::npos) << "VmFlags:" << flags;
  // Released, the advice goes with the block (its mapping is gone), instead of staying on a range
  // of the heap that later, smaller blocks would be faulted into in 2 MiB pages.
  EXPECT_EQ(vm_flags_at(p).find(" hg "), std::string::npos) << "the released block's range is still advised";
}

TEST(Allocator, LargeBlocksAreReused) {
  const int64_t n = 1 << 18;  // 1 MiB of f32: above the cache threshold
  allocator::empty_cache();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({n});
    first = t.storage()->data();
  }
  const MemoryStats s0 = allocator::stats();
  EXPECT_GE(s0.cached_bytes, n * 4);
  Tensor again = Tensor::empty({n});
  const MemoryStats s1 = allocator::stats();
  EXPECT_EQ(s1.num_cache_hits, s0.num_cache_hits + 1);
  EXPECT_EQ(s1.num_allocs, s0.num_allocs);
  EXPECT_EQ(s1.cached_bytes, s0.cached_bytes - n * 4);
  EXPECT_EQ(again.storage()->data(), first);
  // Small blocks go back to the system: no cache hit.
  { Tensor small = Tensor::empty({16}); }
  Tensor small2 = Tensor::empty({16});
  EXPECT_EQ(allocator::stats().num_cache_hits, s1.num_cache_hits);
  again = Tensor();
  allocator::empty_cache();
  EXPECT_EQ(allocator::stats().cached_bytes, 0);
}

// Of the cached blocks of a size, the one given back last comes out first (its lines are the
// likeliest to be in cache: docs/design.md, "The CPU allocator's reuse"), then the one before it.
TEST(Allocator, TheBlockGivenBackLastIsReusedFirst) {
  const int64_t n = 1 << 18;  // 1 MiB of f32: above the cache threshold
  allocator::empty_cache();
  void *older = nullptr, *newer = nullptr;
  {
    Tensor a = Tensor::empty({n}), b = Tensor::empty({n});
    older = a.storage()->data();
    newer = b.storage()->data();
    a = Tensor();  // given back first
    b = Tensor();  // given back last
  }
  ASSERT_NE(older, newer);
  Tensor first = Tensor::empty({n}), second = Tensor::empty({n});
  EXPECT_EQ(first.storage()->data(), newer);
  EXPECT_EQ(second.storage()->data(), older);
  first = Tensor();
  second = Tensor();
  allocator::empty_cache();
}

// The device-style figures: on the CPU every block is its rounded request, and the cache is all
// that is held beyond the live blocks.
TEST(Allocator, AllocatedAndReservedAsADeviceReportsThem) {
  allocator::empty_cache();
  allocator::reset_peak();
  const int64_t n = 1 << 18;  // 1 MiB of f32: cached when freed
  { Tensor t = Tensor::empty({n}); }
  const MemoryStats s = allocator::stats();
  EXPECT_EQ(s.allocated_bytes, s.live_total);
  EXPECT_EQ(s.peak_allocated_bytes, s.peak_total);
  EXPECT_EQ(s.reserved_bytes, s.live_total + s.cached_bytes);
  EXPECT_GE(s.cached_bytes, n * 4);
  EXPECT_GE(s.peak_reserved_bytes, s.reserved_bytes);  // it was live, then cached: reserved throughout
  allocator::empty_cache();
  allocator::reset_peak();
  EXPECT_EQ(allocator::stats().peak_reserved_bytes, allocator::stats().live_total);
}

TEST(Allocator, BudgetThrowsOutOfMemoryAndLeaksNothing) {
  BudgetGuard guard;
  allocator::empty_cache();
  const int64_t live0 = allocator::stats().live_total;
  const int64_t budget = live0 + (int64_t(1) << 20);  // 1 MiB of headroom
  allocator::set_budget(budget);
  EXPECT_EQ(allocator::stats().budget_bytes, budget);
  Tensor fits = Tensor::empty({1 << 17});  // 512 KiB
  try {
    Tensor too_big = Tensor::empty({1 << 18});  // another 1 MiB
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(budget)), std::string::npos) << msg;
  }
  EXPECT_EQ(allocator::stats().live_total, live0 + (int64_t(4) << 17));
  fits = Tensor();
  EXPECT_EQ(allocator::stats().live_total, live0);

  // An op that runs out half way (its output does not fit) leaves nothing behind, graph included.
  Generator g(1);
  Tensor w = Tensor::randn({256, 256}, g).set_requires_grad();  // 256 KiB
  Tensor x = Tensor::randn({512, 256}, g);                      // 512 KiB
  const int64_t live1 = allocator::stats().live_total;
  EXPECT_THROW(ops::gelu(ops::linear(x, w)), OutOfMemory);  // the 512 KiB linear output does not fit
  EXPECT_EQ(allocator::stats().live_total, live1);
  EXPECT_THROW(ops::exp(x), OutOfMemory);
  EXPECT_EQ(allocator::stats().live_total, live1);
  allocator::set_budget(0);
  EXPECT_NO_THROW(ops::gelu(ops::linear(x, w)));
  EXPECT_THROW(allocator::set_budget(-1), Error);
}

TEST(Allocator, BudgetCountsCachedBlocksAsReclaimable) {
  BudgetGuard guard;
  allocator::empty_cache();
  { Tensor t = Tensor::empty({1 << 18}); }  // leaves 1 MiB cached
  ASSERT_GE(allocator::stats().cached_bytes, int64_t(4) << 18);
  // A budget with room for one 1.5 MiB block: the cached 1 MiB must be dropped, not counted.
  allocator::set_budget(allocator::stats().live_total + (int64_t(3) << 19));
  EXPECT_NO_THROW(Tensor::empty({3 << 17}));
  EXPECT_EQ(allocator::stats().cached_bytes, int64_t(3) << 19);
}

// The suite runs with the guard (tests/alloc_guard.cpp). One byte stored past a request, inside
// its 64-byte rounding where nothing else would notice it, ends the process with a line that says
// where; as do bytes past the rounding, in a small block and in a cached large one; a block written
// to its last byte is freed quietly, and the counted bytes are the request's rounding as without it.
TEST(Allocator, GuardCatchesAStorePastTheEnd) {
  ASSERT_STREQ(std::getenv("MIXPREC_ALLOC_GUARD"), "1") << "tests/alloc_guard.cpp sets it before main";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto store_past = [](size_t bytes, size_t at) {
    auto* p = static_cast<unsigned char*>(allocator::allocate(bytes, MemCategory::activations));
    p[at] = 0;
    allocator::deallocate(p, bytes, MemCategory::activations);
  };
  EXPECT_DEATH(store_past(100, 100), "allocation guard: bytes 100 to 100 of a 100-byte activations block");
  EXPECT_DEATH(store_past(100, 130), "bytes 130 to 130 of a 100-byte");
  EXPECT_DEATH(store_past(size_t(1) << 17, (size_t(1) << 17) + 5), "bytes 131077 to 131077 of a 131072-byte");
  const int64_t live0 = live(MemCategory::activations);
  auto* p = static_cast<unsigned char*>(allocator::allocate(100, MemCategory::activations));
  EXPECT_EQ(live(MemCategory::activations) - live0, rounded(100));
  std::memset(p, 0, 100);
  allocator::deallocate(p, 100, MemCategory::activations);
  EXPECT_EQ(live(MemCategory::activations), live0);
}

}  // namespace
}  // namespace mixprec
