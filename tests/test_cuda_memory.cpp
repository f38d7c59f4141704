// The CUDA providers of the caching allocator on a real GPU (cudaMalloc, events, OutOfMemory from
// the device itself, pinned host memory); without a GPU, that asking for them is one clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/cuda/cuda_memory.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::detail {
namespace {

constexpr size_t kMiB = 1 << 20;

TEST(CudaMemory, WithoutAGpuAskingIsOneClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU: the CudaMemory GPU tests run instead";
  for (auto ask : {+[] { cuda_caching_allocator(0); }, +[] { cuda_pinned_allocator(); }}) {
    try {
      ask();
      FAIL() << "expected mixprec::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos);
      EXPECT_NE(msg.find(cuda::unavailable_reason()), std::string::npos) << msg;
    }
  }
}

TEST(CudaMemory, DeviceBlocksAreCachedAndReused) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  CachingAllocator& a = cuda_caching_allocator(0);
  EXPECT_EQ(&a, &cuda_caching_allocator(0));  // one per GPU
  EXPECT_THROW(cuda_caching_allocator(cuda::device_count()), Error);
  a.empty_cache();
  const MemoryStats s0 = a.stats();
  void* p = a.allocate(3 * kMiB, MemCategory::activations);
  void* q = a.allocate(100, MemCategory::workspace);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kMinBlockBytes, 0u);
  a.deallocate(p, 3 * kMiB, MemCategory::activations);
  EXPECT_EQ(a.allocate(3 * kMiB, MemCategory::gradients), p);  // from the cache
  const MemoryStats s1 = a.stats();
  EXPECT_EQ(s1.num_allocs - s0.num_allocs, 2);  // a 20 MiB and a 2 MiB segment
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, int64_t(22 * kMiB));
  a.record_stream(p, 0);  // its own stream: nothing to wait for
  a.deallocate(p, 3 * kMiB, MemCategory::gradients);
  a.deallocate(q, 100, MemCategory::workspace);
  a.empty_cache();  // cudaDeviceSynchronize, then cudaFree of both segments
  EXPECT_EQ(a.stats().reserved_bytes, s0.reserved_bytes);
  a.check_invariants();
}

TEST(CudaMemory, DeviceOutOfMemoryIsReportedAndSurvived) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  CachingAllocator& a = cuda_caching_allocator(0);
  const size_t total = cuda::devices().at(0).total_bytes;
  try {
    a.allocate(total + kMiB, MemCategory::activations);  // more than the GPU has: cudaMalloc refuses
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the device's memory"), std::string::npos) << msg;
  }
  void* p = a.allocate(kMiB, MemCategory::activations);  // the process goes on
  a.deallocate(p, kMiB, MemCategory::activations);
  a.set_budget(a.stats().reserved_bytes + int64_t(kMiB));
  EXPECT_THROW(a.allocate(64 * kMiB, MemCategory::activations), OutOfMemory);
  a.set_budget(0);
  a.check_invariants();
}

TEST(CudaMemory, PinnedHostMemoryWaitsForTheCopyStream) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  CachingAllocator& pinned = cuda_pinned_allocator();
  auto* p = static_cast<unsigned char*>(pinned.allocate(kMiB, MemCategory::data));
  std::memset(p, 0xab, kMiB);  // host memory: the host writes it
  EXPECT_EQ(p[kMiB - 1], 0xab);
  pinned.record_stream(p, 0);  // a copy queued on the default stream
  pinned.deallocate(p, kMiB, MemCategory::data);
  pinned.empty_cache();  // waits for the GPU: the event completes, the segment is freed
  EXPECT_EQ(pinned.stats().reserved_bytes, 0);
  pinned.check_invariants();
}

}  // namespace
}  // namespace mixprec::detail
