// The few device helpers norm.cu and pool.cu share (element types, f32/f64 accumulation, dtype
// dispatch, 16-byte vectors, a deterministic block sum, the launch guard). The names follow the
// cudaew branch's common.cuh, written at the same time: once both are merged, these files include
// that one instead and this header goes (namespace `lib` keeps the two apart until then).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_util.h"
#include "mixprec/error.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cuda::lib {

using bf16 = __nv_bfloat16;
using f16 = __half;

// f64 computes in f64; every other floating type in f32, rounded once on store.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__device__ __forceinline__ acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, f16>)
    return __half2float(v);
  else
    return v;
}
template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, f16>)
    return __float2half_rn(v);
  else
    return v;
}

template <class F>
decltype(auto) dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    default:
      break;
  }
  throw Error(mixprec::detail::concat("expected a floating dtype, got ", dtype_name(t)));
}

template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};
template <class T>
constexpr int kVec16 = int(16 / sizeof(T));
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops: about 1000 blocks of 256 fill an H100
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}
__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

// The tensors' GPU made current, and its stream.
class Launch {
 public:
  explicit Launch(const Tensor& t) : guard_(t.device().index), stream_(mixprec::cuda::detail::stream_of(t)) {}
  cudaStream_t stream() const { return stream_; }

 private:
  mixprec::cuda::detail::DeviceGuard guard_;
  cudaStream_t stream_;
};

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order: the same
// bits on every run. Every thread gets it; `scratch` holds 32 values.
template <class A>
__device__ A block_sum(A v, A* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : A(0);
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

}  // namespace mixprec::kernels::cuda::lib
