// The caching device allocator: PyTorch's policies (rounded sizes, two pools, best fit per stream,
// splitting, merging, events for cross-stream use, free-and-retry on a miss) over a
// DeviceMemoryProvider.
#include "core/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "core/cuda/cuda_memory.h"
#include "core/memory_accounting.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::detail {

struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  Stream stream = 0;   // the stream it was allocated on; every block of a segment shares it
  bool small = false;  // which pool: small blocks live in 2 MiB segments
  bool allocated = false;
  int64_t charged = 0;              // while allocated: the rounded request the categories count
  int event_count = 0;              // events still pending since deallocate()
  std::vector<Stream> stream_uses;  // other streams it was used on (record_stream)
  Block* prev = nullptr;            // neighbours within the segment
  Block* next = nullptr;

  bool is_free() const { return !allocated && event_count == 0; }  // then it sits in its pool
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(a->stream, a->size, reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(b->stream, b->size, reinterpret_cast<uintptr_t>(b->ptr));
}

namespace {

// Larger requests cannot be rounded without overflow; no device has this much memory anyway.
constexpr size_t kMaxRequestBytes = size_t(1) << 60;

size_t round_up(size_t bytes, size_t multiple) { return (bytes + multiple - 1) / multiple * multiple; }

// "20971520 bytes (20.0 MiB)": exact for tests and scripts, readable for people.
std::string format_bytes(int64_t bytes) {
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f MiB", double(bytes) / double(1 << 20));
  return detail::concat(bytes, " bytes (", mib, ")");
}

}  // namespace

size_t round_block_bytes(size_t bytes) { return bytes == 0 ? kMinBlockBytes : round_up(bytes, kMinBlockBytes); }

size_t segment_bytes_for(size_t block_bytes) {
  if (block_bytes <= kSmallRequestBytes) return kSmallSegmentBytes;
  if (block_bytes < kMidRequestBytes) return kMidSegmentBytes;
  return round_up(block_bytes, kLargeRoundBytes);
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemoryProvider> provider) : provider_(std::move(provider)) {
  MIXPREC_ASSERT(provider_ != nullptr);
}

CachingAllocator::~CachingAllocator() {
  for (auto& [stream, events] : pending_)
    for (auto& [event, block] : events) provider_->release_event(event);
  for (Block* head : segments_) {
    provider_->raw_free(head->ptr);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

void* CachingAllocator::allocate(size_t bytes, MemCategory cat) {
  return allocate(bytes, cat, provider_->current_stream());
}

void* CachingAllocator::allocate(size_t bytes, MemCategory cat, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!capture_pools_.empty())
    if (auto it = capture_pools_.find(stream); it != capture_pools_.end()) stream = it->second;
  if (bytes > kMaxRequestBytes) {
    ++stats_.num_ooms;
    throw_oom(bytes, bytes, cat, bytes);
  }
  const size_t size = round_block_bytes(bytes);
  const bool small = size <= kSmallRequestBytes;
  FreeList& pool = small ? small_pool_ : large_pool_;
  const size_t seg_bytes = segment_bytes_for(size);

  process_events();
  Block* block = find_free_block(pool, stream, size);
  if (block == nullptr) block = new_segment(seg_bytes, small, stream);
  if (block == nullptr) {
    // A miss the device or the budget refuses: wait for the device, so that blocks freed while in
    // use on other streams come back, return every fully free segment, and try again.
    synchronize_and_free_events();
    release_free_segments();
    block = find_free_block(pool, stream, size);
    if (block == nullptr) block = new_segment(seg_bytes, small, stream);
    if (block == nullptr) {
      ++stats_.num_ooms;
      throw_oom(bytes, size, cat, seg_bytes);
    }
  }

  block = split_if_worth(block, size);
  block->allocated = true;
  block->charged = int64_t(size);
  live_.emplace(block->ptr, block);
  stats_.allocated_bytes += int64_t(block->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  charge_category(stats_, int64_t(size), cat);
  return block->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes, MemCategory cat) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MIXPREC_ASSERT(it != live_.end(), provider_->name(), ": deallocate of a pointer this allocator does not own");
  Block* block = it->second;
  const int64_t charged = int64_t(round_block_bytes(bytes));
  MIXPREC_ASSERT(charged == block->charged, provider_->name(), ": deallocate of ", bytes, " bytes, allocated as ",
                 block->charged);
  release_category(stats_, charged, cat);
  stats_.allocated_bytes -= int64_t(block->size);
  live_.erase(it);
  block->allocated = false;
  block->charged = 0;
  if (block->stream_uses.empty()) {
    free_block(block);
    return;
  }
  // Used on other streams: reusable once the work queued there until now has run.
  for (Stream s : block->stream_uses) {
    pending_[s].emplace_back(provider_->record_event(s), block);
    ++block->event_count;
  }
  block->stream_uses.clear();
}

void CachingAllocator::recategorize(size_t bytes, MemCategory from, MemCategory to) {
  if (from == to) return;
  std::lock_guard<std::mutex> lock(mu_);
  move_category(stats_, int64_t(round_block_bytes(bytes)), from, to);
}

void CachingAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MIXPREC_ASSERT(it != live_.end(), provider_->name(), ": record_stream on a pointer this allocator does not own");
  Block* block = it->second;
  if (stream == block->stream) return;  // its own stream orders the reuse already
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);
}

void CachingAllocator::begin_pool(Stream stream, Stream pool) {
  std::lock_guard<std::mutex> lock(mu_);
  MIXPREC_ASSERT(capture_pools_.emplace(stream, pool).second, provider_->name(), ": a stream captured twice at once");
}

void CachingAllocator::end_pool(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  capture_pools_.erase(stream);
}

void CachingAllocator::release_pool(Stream pool) {
  std::lock_guard<std::mutex> lock(mu_);
  provider_->synchronize();  // a replay may still be running
  release_free_segments(&pool);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats s = stats_;
  s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  reset_category_peaks(stats_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::set_budget(int64_t bytes) {
  MIXPREC_CHECK(bytes >= 0, "memory budget must be >= 0 bytes, got ", bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.budget_bytes = bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  synchronize_and_free_events();
  release_free_segments();
}

// The smallest free block of `stream` with at least `size` bytes, taken out of the pool.
CachingAllocator::Block* CachingAllocator::find_free_block(FreeList& pool, Stream stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  ++stats_.num_cache_hits;
  return block;
}

// A new segment as one block (not in a pool), or nullptr when the budget or the device refuses.
CachingAllocator::Block* CachingAllocator::new_segment(size_t segment_bytes, bool small, Stream stream) {
  if (stats_.budget_bytes > 0 && stats_.reserved_bytes + int64_t(segment_bytes) > stats_.budget_bytes) return nullptr;
  void* p = provider_->raw_alloc(segment_bytes);
  if (p == nullptr) return nullptr;
  ++stats_.num_allocs;
  stats_.reserved_bytes += int64_t(segment_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  auto* block = new Block;
  block->ptr = static_cast<char*>(p);
  block->size = segment_bytes;
  block->stream = stream;
  block->small = small;
  segments_.push_back(block);
  return block;
}

// Keeps the first `size` bytes of `block` and returns the rest to the pool when the rest is worth
// keeping apart: any remainder in the small pool; in the large pool only one above 1 MiB, so that
// large segments do not crumble into slivers (PyTorch's should_split). Otherwise the caller gets
// the whole block.
CachingAllocator::Block* CachingAllocator::split_if_worth(Block* block, size_t size) {
  const size_t remaining = block->size - size;
  if (block->small ? remaining < kMinBlockBytes : remaining <= kSmallRequestBytes) return block;
  auto* rest = new Block;
  rest->ptr = block->ptr + size;
  rest->size = remaining;
  rest->stream = block->stream;
  rest->small = block->small;
  rest->prev = block;
  rest->next = block->next;
  if (rest->next != nullptr) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  (block->small ? small_pool_ : large_pool_).insert(rest);
  return block;
}

void CachingAllocator::free_block(Block* block) {
  FreeList& pool = block->small ? small_pool_ : large_pool_;
  if (Block* next = block->next; next != nullptr && next->is_free()) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev != nullptr && prev->is_free()) {
    pool.erase(prev);  // its size, part of its key, changes
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next != nullptr) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.insert(block);
}

// PyTorch's process_events: per stream, the events in recording order until the first one that has
// not completed; a block whose last event completed goes back to its pool.
void CachingAllocator::process_events() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto& events = it->second;
    while (!events.empty() && provider_->event_done(events.front().first)) {
      auto [event, block] = events.front();
      events.pop_front();
      provider_->release_event(event);
      if (--block->event_count == 0) free_block(block);
    }
    it = events.empty() ? pending_.erase(it) : std::next(it);
  }
}

void CachingAllocator::synchronize_and_free_events() {
  provider_->synchronize();
  for (auto& [stream, events] : pending_) {
    for (auto& [event, block] : events) {
      provider_->release_event(event);
      if (--block->event_count == 0) free_block(block);
    }
  }
  pending_.clear();
}

// Returns every segment that is one free block (nothing of it live or pending) to the device.
void CachingAllocator::release_free_segments(const Stream* only) {
  for (FreeList* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr || (only != nullptr && block->stream != *only)) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      provider_->raw_free(block->ptr);
      stats_.reserved_bytes -= int64_t(block->size);
      segments_.erase(std::find(segments_.begin(), segments_.end(), block));
      delete block;
    }
  }
}

void CachingAllocator::throw_oom(size_t bytes, size_t size, MemCategory cat, size_t segment_bytes) {
  const int64_t capacity = provider_->capacity_bytes();
  std::string limit;
  if (stats_.budget_bytes > 0)
    limit = format_bytes(stats_.budget_bytes) + ", the budget";
  else if (capacity > 0)
    limit = format_bytes(capacity) + ", the device's memory";
  else
    limit = "unknown";
  std::string need = size < segment_bytes
                         ? detail::concat(" needs a new segment of ", format_bytes(int64_t(segment_bytes)))
                         : std::string();
  throw OutOfMemory(detail::concat("out of memory on ", provider_->name(), ": allocating ",
                                   format_bytes(int64_t(bytes)), " of ", mem_category_name(cat), need, "; allocated ",
                                   format_bytes(stats_.allocated_bytes), ", reserved ",
                                   format_bytes(stats_.reserved_bytes), ", limit ", limit));
}

void CachingAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t reserved = 0, allocated = 0, charged = 0;
  size_t num_live = 0, num_free = 0, num_events = 0;
  for (const Block* head : segments_) {
    MIXPREC_ASSERT(head->prev == nullptr, "a segment's first block has a predecessor");
    for (const Block* b = head; b != nullptr; b = b->next) {
      reserved += int64_t(b->size);
      MIXPREC_ASSERT(b->size > 0 && b->size % kMinBlockBytes == 0, "block size ", b->size);
      MIXPREC_ASSERT(b->stream == head->stream && b->small == head->small, "a segment mixes streams or pools");
      if (b->next != nullptr) {
        MIXPREC_ASSERT(b->next->prev == b && b->ptr + b->size == b->next->ptr, "a broken segment chain");
        MIXPREC_ASSERT(!(b->is_free() && b->next->is_free()), "two adjacent free blocks left unmerged");
      }
      const FreeList& pool = b->small ? small_pool_ : large_pool_;
      const bool pooled = pool.count(const_cast<Block*>(b)) == 1 && *pool.find(const_cast<Block*>(b)) == b;
      if (b->allocated) {
        ++num_live;
        allocated += int64_t(b->size);
        charged += b->charged;
        auto it = live_.find(b->ptr);
        MIXPREC_ASSERT(it != live_.end() && it->second == b, "a live block missing from the live map");
        MIXPREC_ASSERT(b->charged > 0 && size_t(b->charged) <= b->size && b->event_count == 0 && !pooled);
      } else {
        MIXPREC_ASSERT(b->stream_uses.empty(), "a free block with stream uses");
        num_events += size_t(b->event_count);
        if (b->event_count == 0) ++num_free;
        MIXPREC_ASSERT(pooled == (b->event_count == 0), "a free block in the wrong place");
      }
    }
  }
  size_t pending = 0;
  for (const auto& [stream, events] : pending_) pending += events.size();
  MIXPREC_ASSERT(num_live == live_.size(), num_live, " live blocks, ", live_.size(), " in the live map");
  MIXPREC_ASSERT(num_free == small_pool_.size() + large_pool_.size(), "stale blocks in the free lists");
  MIXPREC_ASSERT(num_events == pending, "pending events do not match the blocks' counts");
  MIXPREC_ASSERT(reserved == stats_.reserved_bytes, "reserved ", stats_.reserved_bytes, ", segments hold ", reserved);
  MIXPREC_ASSERT(allocated == stats_.allocated_bytes, "allocated ", stats_.allocated_bytes, ", blocks ", allocated);
  MIXPREC_ASSERT(charged == stats_.live_total, "live_total ", stats_.live_total, ", blocks charged ", charged);
  int64_t by_category = 0;
  for (int64_t v : stats_.live_bytes) by_category += v;
  MIXPREC_ASSERT(by_category == stats_.live_total, "the categories do not add up to live_total");
}

#ifndef MIXPREC_WITH_CUDA
// A build without CUDA has no GPU memory (src/core/cuda/cuda_memory.cpp defines these in one with).
CachingAllocator& cuda_caching_allocator(int device) {
  cuda::require(Device::cuda(device));  // throws: there is no GPU in a build without CUDA
  throw Error(concat("device cuda:", device, " asked for, but ", cuda::unavailable_reason()));
}
CachingAllocator& cuda_pinned_allocator() {
  throw Error(concat("pinned host memory asked for, but ", cuda::unavailable_reason()));
}
#endif

}  // namespace mixprec::detail
