// Just enough of CUDA to run a kernel on the CPU: one std::thread per CUDA thread of a block, the
// blocks one after another. __syncthreads and __syncwarp are both a barrier of the whole block, so
// only kernels whose every thread reaches every sync in the same order run here (the tensor-core
// attention kernels do: their loops' bounds are the block's); __shfl_xor_sync goes through a
// table and two barriers. A kernel's `extern __shared__` array is an ordinary array the test
// defines in the kernel's namespace and hands to launch(), which fills it with NaN patterns before
// each block and, under AddressSanitizer, poisons it past the bytes the launch asked for.
// fake/mma.h mocks WMMA on top of this. Include before any kernel source; `#pragma unroll` is
// unknown to the host compiler (the target turns that warning off).
#pragma once
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define MIXPREC_EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define MIXPREC_EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define MIXPREC_EMU_POISON(p, n) ((void)(p), (void)(n))
#define MIXPREC_EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define __device__
#define __host__
#define __global__
#define __shared__
#define __forceinline__ inline
#define __align__(n)  // the test's shared array carries the alignment
#define __launch_bounds__(n)
#define __trap() std::abort()

namespace mixprec::emulated {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

constexpr size_t kSharedBytes = size_t(1) << 18;  // the most a test's shared array holds
constexpr unsigned kMaxThreads = 1024;

// The state of the block being run.
struct Block {
  std::barrier<>* barrier = nullptr;
  float shuffle[kMaxThreads] = {};
};
inline Block& block() {
  static Block b;
  return b;
}
inline thread_local Dim3 thread_idx, block_idx;

// Runs kernel() for every thread of a grid of (gx, gy) blocks of `threads` threads with `shared`
// bytes of dynamic shared memory, which is `memory` (the kernel's extern array, kSharedBytes).
template <class Kernel>
void launch(unsigned gx, unsigned gy, unsigned threads, unsigned char* memory, size_t shared, Kernel kernel) {
  if (threads > kMaxThreads || shared > kSharedBytes) std::abort();
  Block& b = block();
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      MIXPREC_EMU_UNPOISON(memory, kSharedBytes);
      std::memset(memory, 0xff, kSharedBytes);  // NaN in f32 and in 16-bit floats
      MIXPREC_EMU_POISON(memory + shared, kSharedBytes - shared);
      std::barrier<> barrier(threads);
      b.barrier = &barrier;
      std::vector<std::thread> pool;
      pool.reserve(threads);
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          thread_idx = {t, 0, 0};
          block_idx = {bx, by, 0};
          kernel();
        });
      for (std::thread& t : pool) t.join();
      b.barrier = nullptr;
    }
  MIXPREC_EMU_UNPOISON(memory, kSharedBytes);
}

inline unsigned lane() { return thread_idx.x % 32; }
inline void barrier() { block().barrier->arrive_and_wait(); }

}  // namespace mixprec::emulated

#define threadIdx ::mixprec::emulated::thread_idx
#define blockIdx ::mixprec::emulated::block_idx
inline void __syncthreads() { ::mixprec::emulated::barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::mixprec::emulated::barrier(); }
inline float __shfl_xor_sync(unsigned, float x, int mask) {
  auto& b = ::mixprec::emulated::block();
  b.shuffle[threadIdx.x] = x;
  ::mixprec::emulated::barrier();
  const float y = b.shuffle[threadIdx.x ^ unsigned(mask)];
  ::mixprec::emulated::barrier();
  return y;
}
