// The caching device allocator's policies on a fake device (host memory, streams whose work the
// test completes, a settable capacity): rounding, pools, splitting, merging, per-stream reuse,
// events, free-and-retry, OutOfMemory, the budget on reserved bytes, stats, and a randomized run
// checked against a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/caching_allocator.h"
#include "mixprec/error.h"

namespace mixprec::detail {
namespace {

constexpr size_t kKiB = 1 << 10, kMiB = 1 << 20;
using Stream = DeviceMemoryProvider::Stream;

// The fake device's state, owned by the test so it outlives the allocator.
struct FakeDevice {
  int64_t capacity = int64_t(1) << 40;  // raw_alloc fails beyond this many bytes in use
  int64_t used = 0;
  std::map<char*, size_t> segments;  // raw allocations alive
  int raw_allocs = 0, raw_frees = 0, syncs = 0;
  Stream current = 1;
  // A stream's events complete in order: event k of stream s is done once finished[s] >= k.
  std::map<Stream, uint64_t> recorded, finished;
  struct EventRec {
    Stream stream;
    uint64_t seq;
    bool released;
  };
  std::vector<EventRec> events;

  void finish(Stream s) { finished[s] = recorded[s]; }  // the work queued on s so far has run
  int outstanding_events() const {
    int n = 0;
    for (const EventRec& e : events) n += e.released ? 0 : 1;
    return n;
  }
};

class FakeProvider : public DeviceMemoryProvider {
 public:
  explicit FakeProvider(FakeDevice* dev) : dev_(dev) {}
  void* raw_alloc(size_t bytes) override {
    if (dev_->used + int64_t(bytes) > dev_->capacity) return nullptr;
    auto* p = static_cast<char*>(std::aligned_alloc(kMinBlockBytes, bytes));
    if (p == nullptr) return nullptr;
    dev_->used += int64_t(bytes);
    dev_->segments.emplace(p, bytes);
    ++dev_->raw_allocs;
    return p;
  }
  void raw_free(void* ptr) override {
    auto it = dev_->segments.find(static_cast<char*>(ptr));
    if (it == dev_->segments.end()) {
      ADD_FAILURE() << "raw_free of a pointer raw_alloc did not return";
      return;
    }
    dev_->used -= int64_t(it->second);
    dev_->segments.erase(it);
    std::free(ptr);
    ++dev_->raw_frees;
  }
  Event record_event(Stream s) override {
    dev_->events.push_back({s, ++dev_->recorded[s], false});
    return dev_->events.size() - 1;
  }
  bool event_done(Event e) override {
    const FakeDevice::EventRec& r = dev_->events.at(e);
    EXPECT_FALSE(r.released) << "query of a released event";
    return dev_->finished[r.stream] >= r.seq;
  }
  void release_event(Event e) override {
    EXPECT_FALSE(dev_->events.at(e).released) << "event released twice";
    dev_->events.at(e).released = true;
  }
  void synchronize() override {
    ++dev_->syncs;
    for (auto& [s, n] : dev_->recorded) dev_->finished[s] = n;
  }
  Stream current_stream() override { return dev_->current; }
  int64_t capacity_bytes() override { return dev_->capacity < (int64_t(1) << 40) ? dev_->capacity : 0; }
  std::string name() const override { return "fake:0"; }

 private:
  FakeDevice* dev_;
};

// An allocator over a fresh fake device; the device is checked for leaks when the test ends.
struct Fixture : ::testing::Test {
  FakeDevice dev;
  std::unique_ptr<CachingAllocator> alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeProvider>(&dev));
  MemCategory act = MemCategory::activations;

  void* get(size_t bytes, Stream s = 1) { return alloc->allocate(bytes, act, s); }
  void put(void* p, size_t bytes) { alloc->deallocate(p, bytes, act); }
  MemoryStats st() const { return alloc->stats(); }
  void TearDown() override {
    alloc->check_invariants();
    alloc.reset();
    EXPECT_TRUE(dev.segments.empty()) << "the allocator's destructor left device memory behind";
    EXPECT_EQ(dev.outstanding_events(), 0);
  }
};
using CachingAllocatorTest = Fixture;

int64_t live(const MemoryStats& s, MemCategory c) { return s.live_bytes[static_cast<size_t>(c)]; }

TEST(CachingAllocatorSizes, RoundingAndSegments) {
  EXPECT_EQ(round_block_bytes(0), 512u);
  EXPECT_EQ(round_block_bytes(1), 512u);
  EXPECT_EQ(round_block_bytes(512), 512u);
  EXPECT_EQ(round_block_bytes(513), 1024u);
  EXPECT_EQ(segment_bytes_for(512), 2 * kMiB);
  EXPECT_EQ(segment_bytes_for(kMiB), 2 * kMiB);  // 1 MiB is still small
  EXPECT_EQ(segment_bytes_for(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(segment_bytes_for(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(segment_bytes_for(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(segment_bytes_for(10 * kMiB + 512), 12 * kMiB);  // rounded up to 2 MiB
}

TEST_F(CachingAllocatorTest, SmallAndLargePools) {
  void* a = get(1);  // 512 bytes from a 2 MiB small segment
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
  EXPECT_EQ(st().live_total, 512);
  EXPECT_EQ(st().reserved_bytes, int64_t(2 * kMiB));
  void* b = get(kMiB);  // the largest small request: the same segment
  EXPECT_EQ(dev.raw_allocs, 1);
  void* c = get(kMiB + 1);  // large: a 20 MiB segment, not the small one's remaining space
  EXPECT_EQ(dev.raw_allocs, 2);
  EXPECT_EQ(st().reserved_bytes, int64_t(22 * kMiB));
  void* d = get(30 * kMiB);  // above 10 MiB: a segment of its own rounded size
  EXPECT_EQ(dev.raw_allocs, 3);
  EXPECT_EQ(dev.segments.at(static_cast<char*>(d)), 30 * kMiB);
  EXPECT_EQ(st().num_allocs, 3);
  alloc->check_invariants();
  put(a, 1);
  put(b, kMiB);
  put(c, kMiB + 1);
  put(d, 30 * kMiB);
  EXPECT_EQ(st().live_total, 0);
  EXPECT_EQ(st().allocated_bytes, 0);
  EXPECT_EQ(st().cached_bytes, int64_t(52 * kMiB));
  EXPECT_EQ(dev.raw_frees, 0);  // never on the hot path
}

TEST_F(CachingAllocatorTest, SplitsAndMerges) {
  char* a = static_cast<char*>(get(1000));
  char* b = static_cast<char*>(get(3000));
  char* c = static_cast<char*>(get(512));
  EXPECT_EQ(b, a + 1024);  // split off the same small segment, best fit from the lowest address
  EXPECT_EQ(c, b + 3072);
  EXPECT_EQ(dev.raw_allocs, 1);
  put(b, 3000);
  put(a, 1000);  // merges with b's free block
  alloc->check_invariants();
  EXPECT_EQ(get(4096), a);  // the merged 4 KiB block, no new segment
  put(a, 4096);
  put(c, 512);  // the whole segment is one free block again
  alloc->check_invariants();
  alloc->empty_cache();
  EXPECT_EQ(dev.raw_frees, 1);
  EXPECT_EQ(st().reserved_bytes, 0);
}

TEST_F(CachingAllocatorTest, LargeBlocksSplitOnlyAboveOneMiB) {
  // 5 MiB from a 20 MiB segment: the 15 MiB rest is split off and serves the next request.
  char* a = static_cast<char*>(get(5 * kMiB));
  char* b = static_cast<char*>(get(5 * kMiB));
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(st().allocated_bytes, int64_t(10 * kMiB));
  put(a, 5 * kMiB);
  put(b, 5 * kMiB);
  // A rest of exactly 1 MiB stays with the block: allocated counts it, the categories do not.
  const size_t c_bytes = 19 * kMiB;
  char* c = static_cast<char*>(get(c_bytes));
  EXPECT_EQ(c, a);
  EXPECT_EQ(st().allocated_bytes, int64_t(20 * kMiB));
  EXPECT_EQ(st().live_total, int64_t(c_bytes));
  // A rest of 1 MiB + 512 is split off.
  put(c, c_bytes);
  char* d = static_cast<char*>(get(c_bytes - 512));
  EXPECT_EQ(st().allocated_bytes, int64_t(c_bytes - 512));
  EXPECT_EQ(get(kMiB + 512), d + c_bytes - 512);  // the rest, large, serves a large request
  EXPECT_EQ(dev.raw_allocs, 1);
  put(d + c_bytes - 512, kMiB + 512);
  put(d, c_bytes - 512);
}

TEST_F(CachingAllocatorTest, ReuseNeedsNoRawAllocOrFree) {
  const std::vector<size_t> sizes = {100, 4 * kKiB, 300 * kKiB, 3 * kMiB, 12 * kMiB, 64 * kMiB};
  std::vector<void*> first;
  for (int step = 0; step < 50; ++step) {
    std::vector<void*> ptrs;
    for (size_t n : sizes) ptrs.push_back(get(n));
    if (step == 0) first = ptrs;
    EXPECT_EQ(ptrs, first);  // a training step's sizes repeat: the same blocks come back
    for (size_t i = 0; i < sizes.size(); ++i) put(ptrs[i], sizes[i]);
  }
  EXPECT_EQ(dev.raw_allocs, 3);  // the small segment, 20 MiB (3 and 12 MiB share it), 64 MiB
  EXPECT_EQ(st().num_allocs, 3);
  EXPECT_EQ(st().num_cache_hits, 50 * 6 - 3);
  EXPECT_EQ(dev.raw_frees, 0);
}

TEST_F(CachingAllocatorTest, BlocksStayWithTheirStream) {
  void* a = get(kMiB, /*stream=*/1);
  put(a, kMiB);
  void* b = get(kMiB, /*stream=*/2);  // stream 1's free block is not stream 2's to take
  EXPECT_NE(b, a);
  EXPECT_EQ(dev.raw_allocs, 2);
  EXPECT_EQ(get(kMiB, 1), a);
  put(a, kMiB);
  put(b, kMiB);
  // Without a stream, the provider's current stream.
  dev.current = 2;
  EXPECT_EQ(alloc->allocate(kMiB, act), b);
  put(b, kMiB);
  EXPECT_EQ(dev.events.size(), 0u);  // same-stream reuse needs no event
}

TEST_F(CachingAllocatorTest, CrossStreamUseWaitsForEvents) {
  char* a = static_cast<char*>(get(4096, 1));
  alloc->record_stream(a, 1);  // its own stream: nothing to record
  alloc->record_stream(a, 2);
  alloc->record_stream(a, 3);
  alloc->record_stream(a, 2);  // once per stream
  put(a, 4096);
  EXPECT_EQ(dev.events.size(), 2u);  // one event per other stream, recorded at deallocate
  EXPECT_EQ(st().allocated_bytes, 0);
  EXPECT_EQ(st().live_total, 0);
  char* b = static_cast<char*>(get(4096, 1));  // streams 2 and 3 may still read a: not reused
  EXPECT_EQ(b, a + 4096);
  dev.finish(2);
  char* c = static_cast<char*>(get(4096, 1));  // stream 3 still pending
  EXPECT_EQ(c, a + 8192);
  dev.finish(3);
  EXPECT_EQ(get(4096, 1), a);  // both events done: a is back, best fit
  EXPECT_EQ(dev.outstanding_events(), 0);
  EXPECT_EQ(dev.raw_allocs, 1);
  EXPECT_EQ(dev.syncs, 0);
  for (char* p : {a, b, c}) put(p, 4096);
}

TEST_F(CachingAllocatorTest, EventsCompleteInOrderPerStream) {
  void* a = get(4096, 1);
  void* b = get(4096, 1);
  alloc->record_stream(a, 2);
  alloc->record_stream(b, 2);
  put(a, 4096);         // event 1 on stream 2
  put(b, 4096);         // event 2 on stream 2
  dev.finished[2] = 1;  // only the first has completed
  alloc->check_invariants();
  EXPECT_EQ(get(4096, 1), a);
  EXPECT_EQ(dev.outstanding_events(), 1);
  alloc->check_invariants();
  alloc->empty_cache();  // waits for the device: b comes back too
  EXPECT_EQ(dev.syncs, 1);
  EXPECT_EQ(dev.outstanding_events(), 0);
  put(a, 4096);
}

TEST_F(CachingAllocatorTest, MissFreesTheCacheAndRetries) {
  dev.capacity = 24 * kMiB;
  void* a = get(15 * kMiB);                     // a 16 MiB segment
  char* small = static_cast<char*>(get(kKiB));  // a 2 MiB segment, kept: partly live
  void* pending = get(kKiB, 1);
  alloc->record_stream(pending, 2);
  put(pending, kKiB);  // free but waiting on stream 2
  put(a, 15 * kMiB);
  EXPECT_EQ(st().reserved_bytes, int64_t(18 * kMiB));
  // 20 MiB more does not fit beside 18: the device refuses, the allocator waits for the device,
  // returns the free 16 MiB segment and tries again.
  void* b = get(20 * kMiB);
  EXPECT_EQ(dev.syncs, 1);
  EXPECT_EQ(dev.raw_frees, 1);
  EXPECT_EQ(st().reserved_bytes, int64_t(22 * kMiB));
  EXPECT_EQ(st().num_ooms, 0);
  EXPECT_EQ(dev.outstanding_events(), 0);  // the synchronize completed the pending block
  EXPECT_EQ(get(kKiB, 1), small + kKiB);
  put(small + kKiB, kKiB);
  put(small, kKiB);
  put(b, 20 * kMiB);
}

TEST_F(CachingAllocatorTest, OutOfMemoryReportsAndLeavesTheAllocatorUsable) {
  dev.capacity = 24 * kMiB;
  void* a = get(15 * kMiB, 1);  // 16 MiB segment; the 1 MiB rest is not split off
  try {
    get(10 * kMiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("out of memory on fake:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allocating 10485760 bytes (10.0 MiB) of activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allocated 16777216 bytes (16.0 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved 16777216 bytes (16.0 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 25165824 bytes (24.0 MiB), the device's memory"), std::string::npos) << msg;
  }
  EXPECT_EQ(st().num_ooms, 1);
  EXPECT_EQ(dev.syncs, 1);                     // it did wait and free the cache before giving up
  EXPECT_THROW(get(~size_t(0)), OutOfMemory);  // no overflow in the rounding
  EXPECT_EQ(st().num_ooms, 2);
  alloc->check_invariants();
  EXPECT_EQ(st().live_total, int64_t(15 * kMiB));
  // The process goes on: once a is freed, 20 MiB fits (a's cached segment is returned for it).
  put(a, 15 * kMiB);
  void* b = get(20 * kMiB);
  EXPECT_EQ(st().reserved_bytes, int64_t(20 * kMiB));
  EXPECT_EQ(dev.raw_frees, 1);
  void* c = get(512);  // and small requests still work
  put(c, 512);
  put(b, 20 * kMiB);
}

TEST_F(CachingAllocatorTest, BudgetCountsReservedBytes) {
  alloc->set_budget(int64_t(22 * kMiB));
  void* a = get(kKiB);       // 2 MiB reserved
  void* b = get(12 * kMiB);  // 14 MiB reserved
  // 7 MiB more: live would be 19 MiB, under the budget, but it takes a new 20 MiB segment.
  try {
    get(7 * kMiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("needs a new segment of 20971520 bytes (20.0 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved 14680064 bytes (14.0 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 23068672 bytes (22.0 MiB), the budget"), std::string::npos) << msg;
  }
  EXPECT_EQ(dev.raw_allocs, 2);  // the device was never asked
  // Once b is free, a 14 MiB miss returns b's segment to stay within the budget (2 + 14 <= 22).
  put(b, 12 * kMiB);
  void* d = get(14 * kMiB);
  EXPECT_EQ(dev.raw_frees, 1);
  EXPECT_EQ(st().reserved_bytes, int64_t(16 * kMiB));
  EXPECT_EQ(st().budget_bytes, int64_t(22 * kMiB));
  EXPECT_THROW(alloc->set_budget(-1), Error);
  alloc->set_budget(0);
  put(d, 14 * kMiB);
  put(a, kKiB);
}

TEST_F(CachingAllocatorTest, StatsByCategoryAndPeaks) {
  alloc->reset_peak();
  void* p = alloc->allocate(1000, MemCategory::parameters, 1);       // charged 1024
  void* x = alloc->allocate(3 * kMiB, MemCategory::activations, 1);  // 3 MiB
  MemoryStats s = st();
  EXPECT_EQ(live(s, MemCategory::parameters), 1024);
  EXPECT_EQ(live(s, MemCategory::activations), int64_t(3 * kMiB));
  EXPECT_EQ(s.peak_total, int64_t(3 * kMiB + 1024));
  alloc->deallocate(x, 3 * kMiB, MemCategory::activations);
  void* g = alloc->allocate(kMiB, MemCategory::temporaries, 1);
  alloc->recategorize(kMiB, MemCategory::temporaries, MemCategory::gradients);  // a .grad handed over
  s = st();
  EXPECT_EQ(live(s, MemCategory::temporaries), 0);
  EXPECT_EQ(live(s, MemCategory::gradients), int64_t(kMiB));
  EXPECT_EQ(s.live_total, int64_t(kMiB + 1024));
  EXPECT_EQ(s.peak_total, int64_t(3 * kMiB + 1024));  // the peak was before
  EXPECT_EQ(s.at_peak_bytes[size_t(MemCategory::activations)], int64_t(3 * kMiB));
  EXPECT_EQ(s.at_peak_bytes[size_t(MemCategory::gradients)], 0);
  EXPECT_EQ(s.peak_bytes[size_t(MemCategory::gradients)], int64_t(kMiB));
  EXPECT_EQ(s.peak_allocated_bytes, int64_t(3 * kMiB + 1024));
  EXPECT_EQ(s.peak_reserved_bytes, int64_t(22 * kMiB));
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.allocated_bytes);
  alloc->reset_peak();
  s = st();
  EXPECT_EQ(s.peak_total, s.live_total);
  EXPECT_EQ(s.peak_bytes, s.live_bytes);
  EXPECT_EQ(s.at_peak_bytes, s.live_bytes);
  EXPECT_EQ(s.peak_allocated_bytes, s.allocated_bytes);
  EXPECT_EQ(s.peak_reserved_bytes, s.reserved_bytes);
  alloc->deallocate(g, kMiB, MemCategory::gradients);
  alloc->deallocate(p, 1000, MemCategory::parameters);
  EXPECT_EQ(st().live_total, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheReleasesOnlyFullyFreeSegments) {
  char* a = static_cast<char*>(get(kKiB));
  char* b = static_cast<char*>(get(kKiB));  // same small segment as a
  void* big = get(40 * kMiB);
  std::memset(a, 0x5a, kKiB);
  put(b, kKiB);
  put(big, 40 * kMiB);
  alloc->empty_cache();
  EXPECT_EQ(dev.raw_frees, 1);  // the 40 MiB segment; a's segment is partly live
  EXPECT_EQ(st().reserved_bytes, int64_t(2 * kMiB));
  EXPECT_EQ(a[kKiB - 1], 0x5a);
  put(a, kKiB);
  alloc->empty_cache();
  EXPECT_EQ(st().reserved_bytes, 0);
  EXPECT_TRUE(dev.segments.empty());
  EXPECT_GE(dev.syncs, 1);
}

// A CUDA graph's capture (cuda::Graph): the captured stream's allocations come from a pool of
// their own, which reuses its own frees during the capture and hands nothing to eager work after
// it; releasing the pool returns its fully free segments and leaves its live blocks alone.
TEST_F(CachingAllocatorTest, CapturePoolsKeepTheirBlocksFromEagerWork) {
  constexpr Stream kPool = 0x1001;  // what cuda::Graph passes: no stream has an odd handle
  void* eager = get(kMiB);          // before the capture, on stream 1
  put(eager, kMiB);
  alloc->begin_pool(/*stream=*/1, kPool);
  void* a = get(kMiB);  // stream 1 is captured: not the eager free block
  EXPECT_NE(a, eager);
  put(a, kMiB);
  void* b = get(kMiB);  // the capture's own free block, as an eager step would reuse it
  EXPECT_EQ(b, a);
  void* kept = get(3 * kMiB);             // still live after the capture (a gradient the graph writes)
  void* other = get(kMiB, /*stream=*/2);  // another stream is not captured
  EXPECT_NE(other, a);
  alloc->end_pool(1);
  put(b, kMiB);                 // back to the pool, not to stream 1
  EXPECT_EQ(get(kMiB), eager);  // eager work after the capture: its own block
  void* c = get(kMiB);          // and never the pool's: a new segment, or stream 1's space
  EXPECT_NE(c, b);
  alloc->check_invariants();
  const int frees_before = dev.raw_frees;
  const int64_t reserved_before = st().reserved_bytes;
  alloc->release_pool(kPool);                  // the graph is gone: a and b's segment goes back,
  EXPECT_EQ(dev.raw_frees, frees_before + 1);  // `kept`'s stays while it is live
  EXPECT_EQ(st().reserved_bytes, reserved_before - int64_t(kSmallSegmentBytes));
  put(kept, 3 * kMiB);
  alloc->release_pool(kPool);
  EXPECT_EQ(dev.raw_frees, frees_before + 2);
  EXPECT_EQ(st().reserved_bytes, reserved_before - int64_t(kSmallSegmentBytes + kMidSegmentBytes));
  put(eager, kMiB);
  put(c, kMiB);
  put(other, kMiB);
  alloc->check_invariants();
}

TEST_F(CachingAllocatorTest, ThreadsShareOneAllocator) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::mt19937_64 rng{uint64_t(t)};
      std::vector<std::pair<void*, size_t>> held;
      for (int i = 0; i < 500; ++i) {
        if (held.size() < 8 && rng() % 2 == 0) {
          const size_t n = 1 + rng() % (3 * kMiB);
          held.emplace_back(get(n, Stream(t + 1)), n);
          std::memset(held.back().first, t, 16);
        } else if (!held.empty()) {
          EXPECT_EQ(static_cast<char*>(held.back().first)[15], char(t));
          put(held.back().first, held.back().second);
          held.pop_back();
        }
      }
      for (auto [p, n] : held) put(p, n);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(st().live_total, 0);
  EXPECT_EQ(st().allocated_bytes, 0);
}

// Random allocations (all pools, four streams' worth of ids, every category), frees, cross-stream
// uses, completed streams, recategorizations and empty_cache on a device too small for all of
// them: after every step the live blocks must not overlap, lie inside the device's segments, keep
// their bytes, and the stats must match a model of what is live.
TEST_F(CachingAllocatorTest, RandomizedAgainstAModel) {
  dev.capacity = 128 * kMiB;
  std::mt19937_64 rng(20240917);
  struct Live {
    size_t bytes;
    MemCategory cat;
    char tag;
  };
  std::map<char*, Live> model;
  auto draw_bytes = [&]() -> size_t {
    const uint64_t kind = rng() % 8;
    if (kind < 3) return rng() % 4096;  // 0 included
    if (kind < 5) return 1 + rng() % kMiB;
    if (kind < 7) return kMiB + rng() % (9 * kMiB);
    return 10 * kMiB + rng() % (20 * kMiB);
  };
  // The first and last 64 bytes of a block carry its tag: a block handed out twice, or overlapping
  // another, is overwritten.
  auto edges = [](char* p, size_t bytes) {
    const size_t n = std::min<size_t>(bytes, 64);
    return std::pair{p, p + bytes - n};
  };
  auto mark = [&](char* p, const Live& l) {
    const size_t n = std::min<size_t>(l.bytes, 64);
    auto [head, tail] = edges(p, l.bytes);
    std::memset(head, l.tag, n);
    std::memset(tail, l.tag, n);
  };
  auto marked = [&](char* p, const Live& l) {
    const size_t n = std::min<size_t>(l.bytes, 64);
    auto [head, tail] = edges(p, l.bytes);
    for (size_t i = 0; i < n; ++i)
      if (head[i] != l.tag || tail[i] != l.tag) return false;
    return true;
  };
  int ooms = 0;
  for (int step = 0; step < 4000; ++step) {
    const uint64_t op = rng() % 100;
    if (op < 42 || model.empty()) {
      const size_t bytes = draw_bytes();
      const auto cat = MemCategory(rng() % kNumMemCategories);
      const Stream stream = 1 + rng() % 4;
      try {
        char* p = static_cast<char*>(alloc->allocate(bytes, cat, stream));
        ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % kMinBlockBytes, 0u);
        ASSERT_EQ(model.count(p), 0u) << "a live block handed out again";
        const Live l{bytes, cat, char(1 + step % 120)};
        model.emplace(p, l);
        mark(p, l);
      } catch (const OutOfMemory&) {
        ++ooms;
        // Only when the device cannot take the segment even with every free segment returned.
        EXPECT_GT(dev.used + int64_t(segment_bytes_for(round_block_bytes(bytes))), dev.capacity);
      }
    } else {
      auto it = std::next(model.begin(), long(rng() % model.size()));
      if (op < 80) {
        ASSERT_TRUE(marked(it->first, it->second)) << "a live block was overwritten";
        alloc->deallocate(it->first, it->second.bytes, it->second.cat);
        model.erase(it);
      } else if (op < 85) {
        const auto to = MemCategory(rng() % kNumMemCategories);
        alloc->recategorize(it->second.bytes, it->second.cat, to);
        it->second.cat = to;
      } else if (op < 91) {
        alloc->record_stream(it->first, 1 + rng() % 4);
      } else if (op < 98) {
        dev.finish(1 + rng() % 4);
      } else {
        alloc->empty_cache();
      }
    }
    alloc->check_invariants();
    // The model's view: no overlap, every block inside one of the device's segments.
    const char* end = nullptr;
    std::array<int64_t, kNumMemCategories> by_cat{};
    int64_t total = 0;
    for (const auto& [p, l] : model) {
      const auto charged = round_block_bytes(l.bytes);
      ASSERT_TRUE(end == nullptr || end <= p) << "live blocks overlap at step " << step;
      end = p + charged;
      auto seg = dev.segments.upper_bound(p);
      ASSERT_NE(seg, dev.segments.begin());
      --seg;
      ASSERT_LE(p + charged, seg->first + seg->second) << "a block outside the device's segments";
      by_cat[size_t(l.cat)] += int64_t(charged);
      total += int64_t(charged);
    }
    const MemoryStats s = st();
    ASSERT_EQ(s.live_bytes, by_cat);
    ASSERT_EQ(s.live_total, total);
    ASSERT_EQ(s.reserved_bytes, dev.used);
    ASSERT_GE(s.allocated_bytes, s.live_total);
    ASSERT_LE(s.allocated_bytes, s.reserved_bytes);
    ASSERT_LE(s.reserved_bytes, dev.capacity);
  }
  // The run must have exercised the paths it claims to: misses refused, reuse, retries.
  EXPECT_GT(ooms, 0);
  EXPECT_GT(dev.raw_frees, 0);
  EXPECT_GT(st().num_cache_hits, 4 * st().num_allocs);
  EXPECT_GT(dev.events.size(), 0u);
  for (const auto& [p, l] : model) alloc->deallocate(p, l.bytes, l.cat);
  alloc->empty_cache();
  EXPECT_EQ(st().reserved_bytes, 0);
  EXPECT_EQ(st().live_total, 0);
}

TEST(CachingAllocatorDeathTest, ForeignPointerAborts) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeProvider>(&dev));
  int x = 0;
  EXPECT_DEATH(alloc.deallocate(&x, sizeof x, MemCategory::other), "does not own");
}

}  // namespace
}  // namespace mixprec::detail
