// A caching allocator of device memory in the manner of PyTorch's CUDACachingAllocator, written
// against an abstract provider of raw memory and stream events, so that it runs (and is tested) on
// the host; src/core/cuda/cuda_memory.cpp gives it cudaMalloc and CUDA events.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_allocator.h"
#include "mixprec/allocator.h"

namespace mixprec::detail {

// What the allocator needs from a device. Every call is made with the allocator's mutex held, so a
// provider serving one allocator needs no locking of its own.
struct DeviceMemoryProvider {
  using Stream = uintptr_t;  // opaque: a cudaStream_t on CUDA
  using Event = uintptr_t;   // opaque: a cudaEvent_t on CUDA

  virtual ~DeviceMemoryProvider() = default;
  // `bytes` of device memory, aligned to at least 512 bytes; nullptr when the device has none left
  // (no throw). Other failures (a broken device) may throw mixprec::Error.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // An event recorded on `stream` now: done once the work queued on the stream so far has run.
  virtual Event record_event(Stream stream) = 0;
  virtual bool event_done(Event event) = 0;
  virtual void release_event(Event event) = 0;  // the provider may keep it for a later record_event
  // Waits for all work of the device, on every stream (before cached segments are released).
  virtual void synchronize() = 0;
  // The stream that allocate(bytes, cat) without a stream charges the block to.
  virtual Stream current_stream() = 0;
  // The device's total memory in bytes (the limit an OutOfMemory message names without a budget);
  // 0 where unknown.
  virtual int64_t capacity_bytes() = 0;
  virtual std::string name() const = 0;  // "cuda:0", for messages
};

// Sizes and pools, PyTorch's (c10/cuda/CUDACachingAllocator.cpp).
constexpr size_t kMinBlockBytes = 512;          // every block size is a multiple of this
constexpr size_t kSmallRequestBytes = 1 << 20;  // requests up to 1 MiB use the small pool
constexpr size_t kSmallSegmentBytes = 2 << 20;  // which is carved from 2 MiB segments
constexpr size_t kMidRequestBytes = 10 << 20;   // requests below 10 MiB take a
constexpr size_t kMidSegmentBytes = 20 << 20;   // 20 MiB segment, split;
constexpr size_t kLargeRoundBytes = 2 << 20;    // larger ones a segment rounded to 2 MiB
size_t round_block_bytes(size_t bytes);         // 0 -> 512, else up to a multiple of 512
size_t segment_bytes_for(size_t block_bytes);   // the raw_alloc size a miss of this block makes

// The allocator. Blocks belong to the stream they were allocated on and are reused only by that
// stream (its work is ordered, so no event is needed); record_stream() marks use on another stream,
// and such a block is reused only once events recorded on those streams at deallocate() time have
// completed. Thread-safe (one mutex). Never calls raw_free except in empty_cache() and on a miss
// that raw_alloc or the budget refuses.
class CachingAllocator final : public DeviceAllocator {
 public:
  using Stream = DeviceMemoryProvider::Stream;

  explicit CachingAllocator(std::unique_ptr<DeviceMemoryProvider> provider);
  // Frees every segment, live blocks included: destroy only when nothing is live (the per-GPU
  // instances are never destroyed).
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (512-byte aligned) on `stream`, or on the provider's current
  // stream. Throws mixprec::OutOfMemory after freeing the cache and retrying; the allocator stays
  // usable.
  void* allocate(size_t bytes, MemCategory cat) override;
  void* allocate(size_t bytes, MemCategory cat, Stream stream);
  // `bytes` and `cat` as allocated (or last recategorized); nullptr is ignored.
  void deallocate(void* ptr, size_t bytes, MemCategory cat) override;
  void recategorize(size_t bytes, MemCategory from, MemCategory to) override;  // ownership moved
  // The block at `ptr` is used on `stream` too: its reuse waits for the work queued there until
  // deallocate().
  void record_stream(void* ptr, Stream stream);

  MemoryStats stats() const override;
  void reset_peak() override;               // peaks := live, for every category, allocated and reserved
  void set_budget(int64_t bytes) override;  // 0 disables; counts reserved bytes (PyTorch's memory fraction)
  void empty_cache() override;              // waits for the device, returns every fully free segment

  // CUDA graphs (mixprec/cuda_stream.h): while `stream` is captured, its allocations come from a
  // pool of their own, keyed by `pool` (a value no stream has) in place of the stream, so that the
  // blocks a graph's replays write are never handed to work outside the graph (PyTorch's private
  // pools). Blocks freed during the capture go back to that pool, where the capture's later
  // allocations reuse them as an eager step would. end_pool() ends the mapping; release_pool(),
  // once nothing replays the graph any more, waits for the device and returns the pool's fully free
  // segments (blocks still live stay in the pool, and their segments go with empty_cache()).
  void begin_pool(Stream stream, Stream pool);
  void end_pool(Stream stream);
  void release_pool(Stream pool);

  // Checks the internal invariants (free lists, segment chains, byte counts); aborts with
  // file:line when one is broken. For tests: linear in the number of blocks.
  void check_invariants() const;

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeList = std::set<Block*, BlockLess>;  // by (stream, size, address): best fit per stream

  Block* find_free_block(FreeList& pool, Stream stream, size_t size);
  Block* new_segment(size_t segment_bytes, bool small, Stream stream);
  Block* split_if_worth(Block* block, size_t size);
  void free_block(Block* block);  // into its pool, merged with free neighbours
  void process_events();
  void synchronize_and_free_events();
  void release_free_segments(const Stream* only = nullptr);  // only: the segments of this stream or pool
  [[noreturn]] void throw_oom(size_t bytes, size_t size, MemCategory cat, size_t segment_bytes);

  std::unique_ptr<DeviceMemoryProvider> provider_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  FreeList small_pool_, large_pool_;
  std::unordered_map<void*, Block*> live_;  // handed out, by address
  std::vector<Block*> segments_;            // the first block of each segment (for the invariants)
  // Blocks freed while in use on other streams: per stream, (event, block) in recording order.
  std::map<Stream, std::deque<std::pair<DeviceMemoryProvider::Event, Block*>>> pending_;
  std::map<Stream, Stream> capture_pools_;  // stream being captured -> the pool its allocations use
};

}  // namespace mixprec::detail
