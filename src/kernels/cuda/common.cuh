// What every CUDA kernel file of mixprec shares: the device element types and their f32/f64
// accumulation, conversions with the CPU's rounding rules, dtype dispatch, strided indexing with
// collapsed dimensions, 16-byte vectors, block reductions and the launch shape. CUDA builds only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_util.h"
#include "mixprec/error.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// ------------------------------------------------------------------ element types and rounding

// f64 computes in f64; every other floating type loads to f32, computes, and rounds once on store
// (as the CPU kernels: kernels/ref/access.h).
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

// Any element type to any other with the CPU's rules (core/convert.cpp): floating targets round
// to nearest even once (f64 -> 16-bit directly, not through f32), floating -> integer truncates
// toward zero and saturates with NaN -> 0, integer -> integer wraps.
template <class Int>
__device__ __forceinline__ Int float_to_int(double d) {
  static_assert(std::is_same_v<Int, int64_t> || std::is_same_v<Int, uint8_t>);
  // The limits written out: std::numeric_limits is host-only constexpr for nvcc.
  constexpr bool i64 = std::is_same_v<Int, int64_t>;
  constexpr double lo = i64 ? -0x1p63 : 0.0, hi_excl = i64 ? 0x1p63 : 256.0;
  constexpr Int min = i64 ? Int(INT64_MIN) : Int(0), max = i64 ? Int(INT64_MAX) : Int(255);
  if (d != d) return 0;
  if (d <= lo) return min;
  if (d >= hi_excl) return max;
  return Int(d);
}

template <class D, class S>
__device__ __forceinline__ D convert_to(S v) {
  constexpr bool s_half = std::is_same_v<S, bf16> || std::is_same_v<S, f16>;
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (s_half) {  // exact in f32
    return convert_to<D>(to_acc(v));
  } else if constexpr (std::is_same_v<D, bf16>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2bfloat16(v);
    else if constexpr (std::is_same_v<S, int64_t>)
      return __ll2bfloat16_rn(static_cast<long long>(v));
    else
      return __float2bfloat16_rn(float(v));  // f32, u8 (exact in f32)
  } else if constexpr (std::is_same_v<D, f16>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2half(v);
    else if constexpr (std::is_same_v<S, int64_t>)
      return __ll2half_rn(static_cast<long long>(v));
    else
      return __float2half_rn(float(v));
  } else if constexpr (std::is_floating_point_v<D>) {
    return D(v);  // one rounding, as the CPU's f64 -> f32 and i64 -> f32
  } else if constexpr (std::is_floating_point_v<S>) {
    return float_to_int<D>(double(v));
  } else {
    return D(v);
  }
}

template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  return convert_to<T>(v);
}

// The device type of each dtype, for dispatch: f(T{}) with T the element type.
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
  throw Error(detail::concat("expected a floating dtype, got ", dtype_name(t)));
}
template <class F>
decltype(auto) dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::i64:
      return f(int64_t{});
    case DType::u8:
      return f(uint8_t{});
    default:
      return dispatch_floating(t, std::forward<F>(f));
  }
}

// ---------------------------------------------------------------------------- strided indexing

constexpr int kMaxDims = 8;

// Element offsets of kOps operands that share one iteration shape (row-major over `sizes`), each
// with its own strides in elements (0 along broadcast dimensions). Built on the host with size-1
// dimensions dropped and dimensions that are contiguous for every operand merged, so a plain
// transpose or a broadcast row costs two or three divisions per element, not one per dimension.
template <int kOps>
struct Strided {
  int nd = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kOps][kMaxDims] = {};

  // i < the product of sizes. The outermost index is what remains of i: no division for it (so
  // none at all for one dimension).
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[kOps]) const {
    for (int k = 0; k < kOps; ++k) off[k] = 0;
    if (nd == 0) return;
    for (int d = nd - 1; d > 0; --d) {
      const int64_t size = sizes[d], q = i / size, idx = i - q * size;
      for (int k = 0; k < kOps; ++k) off[k] += idx * strides[k][d];
      i = q;
    }
    for (int k = 0; k < kOps; ++k) off[k] += i * strides[k][0];
  }
};

// `what` names the kernel in the error thrown when more than kMaxDims dimensions remain.
template <int kOps>
Strided<kOps> make_strided(const Shape& shape, const std::array<Shape, kOps>& strides, const char* what) {
  Strided<kOps> s;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = s.nd > 0;
    for (int k = 0; k < kOps && merge; ++k) merge = s.strides[k][s.nd - 1] == strides[k][d] * shape[d];
    if (merge) {
      s.sizes[s.nd - 1] *= shape[d];
      for (int k = 0; k < kOps; ++k) s.strides[k][s.nd - 1] = strides[k][d];
      continue;
    }
    MIXPREC_CHECK(s.nd < kMaxDims, what, " on CUDA: more than ", kMaxDims, " non-mergeable dimensions in ",
                  shape_str(shape));
    s.sizes[s.nd] = shape[d];
    for (int k = 0; k < kOps; ++k) s.strides[k][s.nd] = strides[k][d];
    ++s.nd;
  }
  return s;
}

// Strides of `t` seen with the broadcast shape `out` (0 along broadcast dimensions).
inline Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t lead = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

// ---------------------------------------------------------------------------------- 16-byte vectors

// kVec elements of T in one aligned load or store (16 bytes for the source type of a kernel).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};
template <class T>
constexpr int kVec16 = int(16 / sizeof(T));

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ------------------------------------------------------------------------------------ launches

constexpr int kThreads = 256;
// Grid-stride loops cover any n; more blocks than this only adds scheduling (132 SMs on an H100,
// 2048 threads each: about 1000 blocks of 256 fill it).
constexpr int64_t kMaxBlocks = 4096;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}

__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

// The device a dispatch function's tensors sit on, made current, and its stream (never the
// legacy default stream: see core/cuda/cuda_util.h).
class Launch {
 public:
  explicit Launch(const Tensor& t) : Launch(t.device().index) {}
  explicit Launch(int index) : guard_(index), stream_(mixprec::cuda::detail::current_stream(index)) {}
  cudaStream_t stream() const { return stream_; }

 private:
  mixprec::cuda::detail::DeviceGuard guard_;
  cudaStream_t stream_;
};

// The streaming multiprocessors of the current device, asked once per device index: for launches
// sized to fill the GPU (a reduction's row splits, layer norm's blocks).
inline int sm_count() {
  static std::atomic<int> cached[64] = {};
  int device = 0;
  MIXPREC_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& c = cached[device < 64 ? device : 63];
  if (c.load() == 0) {
    int n = 0;
    MIXPREC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    c.store(n > 0 ? n : 1);
  }
  return c.load();
}

// Dynamic shared memory above the default 48 KiB must be asked for, kernel by kernel.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MIXPREC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ----------------------------------------------------------------------------- block reductions

struct SumOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a != a || a > b ? a : b;  // a NaN on either side wins
  }
};

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order, so the
// result is the same on every run; every thread gets it. `identity`: op's neutral value;
// `scratch` holds 32 values.
template <class A, class Op>
__device__ A block_reduce(A v, Op op, A identity, A* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : identity;
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

// A row's log of the sum of its exponentials, max + log(sum e^(x - max)), by the block in a fixed
// order (the CPU's formula: kernels/ref/softmax.cpp); every thread gets it. softmax.cu, loss.cu.
template <class T>
__device__ acc_t<T> block_row_lse(const T* row, int64_t cols, acc_t<T>* scratch) {
  using A = acc_t<T>;
  A mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = MaxOp{}(mx, to_acc(row[c]));
  mx = block_reduce(mx, MaxOp{}, A(-INFINITY), scratch);
  A total = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) total += exp(to_acc(row[c]) - mx);
  total = block_reduce(total, SumOp{}, A(0), scratch);
  return mx + ::log(total);
}

// Threads for a block that walks one row of `cols` elements: a multiple of 32, at most 1024.
inline int row_threads(int64_t cols) {
  int t = 32;
  while (t < 1024 && t < cols) t *= 2;
  return t;
}

// -------------------------------------------------------------- element-wise maps (one dtype T)

// dst = f(src_0, ..., src_{kIn-1}) element by element, with f taking and returning acc_t<T> (the
// functors of unary.cu, binary.cu, activation.cu over kernels/elementwise_math.h). dst and the
// sources share dst's shape (sources broadcast with stride 0); a source may be dst itself.
template <class T, int kIn>
struct Sources {
  const T* p[kIn];
};

template <class T, int kIn, class F>
__device__ __forceinline__ T apply_map(const F& f, const T (&v)[kIn]) {
  if constexpr (kIn == 1)
    return from_acc<T>(f(to_acc(v[0])));
  else
    return from_acc<T>(f(to_acc(v[0]), to_acc(v[1])));
}

// Every operand contiguous: kVec elements per load and store (16 bytes when kVec = kVec16<T> and
// every pointer is 16-byte aligned; kVec = 1 otherwise), the last n % kVec elements one by one.
template <class T, int kIn, int kVec, class F>
__global__ void map_contiguous_kernel(T* dst, Sources<T, kIn> src, int64_t n, F f) {
  using V = Vec<T, kVec>;
  const int64_t nv = n / kVec;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) {
    V in[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k) in[k] = reinterpret_cast<const V*>(src.p[k])[i];
    V out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      T v[kIn];
#pragma unroll
      for (int k = 0; k < kIn; ++k) v[k] = in[k].v[j];
      out.v[j] = apply_map<T, kIn>(f, v);
    }
    reinterpret_cast<V*>(dst)[i] = out;
  }
  for (int64_t i = nv * kVec + global_thread(); i < n; i += grid_threads()) {
    T v[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k) v[k] = src.p[k][i];
    dst[i] = apply_map<T, kIn>(f, v);
  }
}

// Any strides (operand 0 is dst, 1.. the sources).
template <class T, int kIn, class F>
__global__ void map_strided_kernel(T* dst, Sources<T, kIn> src, Strided<kIn + 1> ix, int64_t n, F f) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[kIn + 1];
    ix.offsets(i, off);
    T v[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k) v[k] = src.p[k][off[k + 1]];
    dst[off[0]] = apply_map<T, kIn>(f, v);
  }
}

template <class T, int kIn, class F>
void map_elements(Tensor& dst, const std::array<const Tensor*, kIn>& srcs, const F& f, const char* what) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Launch on(dst);
  Sources<T, kIn> src{};
  bool contiguous = dst.is_contiguous(), aligned = aligned_to(dst.data_ptr(), 16);
  for (int k = 0; k < kIn; ++k) {
    src.p[k] = static_cast<const T*>(srcs[size_t(k)]->data_ptr());
    contiguous = contiguous && srcs[size_t(k)]->is_contiguous() && srcs[size_t(k)]->shape() == dst.shape();
    aligned = aligned && aligned_to(src.p[k], 16);
  }
  T* d = static_cast<T*>(dst.data_ptr());
  if (contiguous && aligned) {
    constexpr int kV = kVec16<T>;
    map_contiguous_kernel<T, kIn, kV><<<blocks_for(n / kV), kThreads, 0, on.stream()>>>(d, src, n, f);
  } else if (contiguous) {
    map_contiguous_kernel<T, kIn, 1><<<blocks_for(n), kThreads, 0, on.stream()>>>(d, src, n, f);
  } else {
    std::array<Shape, kIn + 1> strides;
    strides[0] = dst.strides();
    for (int k = 0; k < kIn; ++k) strides[size_t(k) + 1] = broadcast_strides(*srcs[size_t(k)], dst.shape());
    const auto ix = make_strided<kIn + 1>(dst.shape(), strides, what);
    map_strided_kernel<T, kIn><<<blocks_for(n), kThreads, 0, on.stream()>>>(d, src, ix, n, f);
  }
  MIXPREC_CUDA_CHECK_LAUNCH();
}

}  // namespace mixprec::kernels::cuda
