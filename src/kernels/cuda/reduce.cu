// CUDA kernels of the reduce family (reduce.h): sums over any dims of any strides into any dtype,
// accumulated in f32 (f64 for f64), in a fixed order (no atomics: the same bits on every run);
// and the finiteness check of anomaly mode.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/loss.h"
#include "kernels/reduce.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// The sum's two index spaces: outputs (the kept dims, row-major) and the reduced elements of one
// output (the reduced dims, row-major), each with x's strides.
struct SumLayout {
  Strided<1> out, red;
  int64_t n_out = 1, len = 1;
};

SumLayout sum_layout(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape out_sizes, out_strides, red_sizes, red_strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    (reduced ? red_sizes : out_sizes).push_back(x.size(d));
    (reduced ? red_strides : out_strides).push_back(x.strides()[size_t(d)]);
  }
  SumLayout l;
  l.out = make_strided<1>(out_sizes, {out_strides}, "sum");
  l.red = make_strided<1>(red_sizes, {red_strides}, "sum");
  l.n_out = shape_numel(out_sizes);
  l.len = shape_numel(red_sizes);
  return l;
}

__device__ __forceinline__ int64_t offset1(const Strided<1>& s, int64_t i) {
  int64_t off[1];
  s.offsets(i, off);
  return off[0];
}

// Outputs adjacent in memory (the innermost kept dim has stride 1, e.g. a bias gradient summed
// over the batch): threadIdx.x walks 32 adjacent outputs (coalesced reads), threadIdx.y splits
// each output's reduction 8 ways; the 8 partial sums are added in a fixed order. blockIdx.y takes
// the reduced elements [y chunk, (y + 1) chunk) and writes its sums to dst + y n_out (partial
// sums, when gridDim.y > 1, that a second launch adds in y's order).
template <class T, class Out>
__global__ void sum_columns_kernel(const T* src, Out* dst, SumLayout l, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A part[8][33];
  const int64_t begin = int64_t(blockIdx.y) * chunk, end = begin + chunk < l.len ? begin + chunk : l.len;
  Out* out = dst + int64_t(blockIdx.y) * l.n_out;
  for (int64_t base = int64_t(blockIdx.x) * 32; base < l.n_out; base += int64_t(gridDim.x) * 32) {
    const int64_t o = base + threadIdx.x;
    A acc = 0;
    if (o < l.n_out) {
      const T* p = src + offset1(l.out, o);
      for (int64_t r = begin + threadIdx.y; r < end; r += 8) acc += to_acc(p[offset1(l.red, r)]);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < l.n_out) {
      A total = part[0][threadIdx.x];
      for (int y = 1; y < 8; ++y) total += part[y][threadIdx.x];
      out[o] = convert_to<Out>(total);
    }
    __syncthreads();
  }
}

// One block per (output, split): the block's threads stride over the split's chunk of the
// reduction and meet in a block reduction. With splits > 1 the partial sums (acc type) go to
// `dst` laid out [n_out, splits], and a second launch sums them.
template <class T, class Out>
__global__ void __launch_bounds__(512) sum_rows_kernel(const T* src, Out* dst, SumLayout l, int64_t splits) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t chunk = (l.len + splits - 1) / splits;
  for (int64_t task = blockIdx.x; task < l.n_out * splits; task += gridDim.x) {
    const int64_t o = task / splits, s = task - o * splits;
    const int64_t begin = s * chunk, end = begin + chunk < l.len ? begin + chunk : l.len;
    const T* p = src + offset1(l.out, o);
    A acc = 0;
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc += to_acc(p[offset1(l.red, r)]);
    acc = block_reduce(acc, SumOp{}, A(0), scratch);
    if (threadIdx.x == 0) dst[task] = convert_to<Out>(acc);
  }
}

template <class T, class Out>
void launch_sum(const Tensor& x, const std::vector<int64_t>& dims, Tensor& dst, cudaStream_t stream) {
  using A = acc_t<T>;
  const SumLayout l = sum_layout(x, dims);
  const T* src = static_cast<const T*>(x.data_ptr());
  Out* out = static_cast<Out*>(dst.data_ptr());
  const bool columns = l.out.nd > 0 && l.out.strides[0][l.out.nd - 1] == 1 && l.n_out >= 32;
  if (columns) {
    const int64_t column_blocks = (l.n_out + 31) / 32;
    const unsigned blocks = unsigned(std::min<int64_t>(column_blocks, kMaxBlocks));
    // Few columns over many rows (GPT-2's bias gradients: 768 columns of 8192 rows, 24 blocks of 32
    // columns for 132 SMs) split the rows too, at least 256 rows a block, for about four blocks an SM.
    const int64_t most = std::clamp<int64_t>(l.len / 256, 1, 1024);
    const int64_t splits = std::clamp<int64_t>(4 * sm_count() / column_blocks, 1, most);
    if (splits <= 1) {
      sum_columns_kernel<T, Out><<<blocks, dim3(32, 8), 0, stream>>>(src, out, l, l.len);
      MIXPREC_CUDA_CHECK_LAUNCH();
      return;
    }
    const int64_t chunk = (l.len + splits - 1) / splits;
    Tensor partial = Tensor::empty({splits, l.n_out}, std::is_same_v<A, double> ? DType::f64 : DType::f32);
    A* part = static_cast<A*>(partial.data_ptr());
    sum_columns_kernel<T, A><<<dim3(blocks, unsigned(splits)), dim3(32, 8), 0, stream>>>(src, part, l, chunk);
    MIXPREC_CUDA_CHECK_LAUNCH();
    SumLayout second;
    second.out = make_strided<1>({l.n_out}, {Shape{1}}, "sum");
    second.red = make_strided<1>({splits}, {Shape{l.n_out}}, "sum");
    second.n_out = l.n_out;
    second.len = splits;
    sum_columns_kernel<A, Out><<<blocks, dim3(32, 8), 0, stream>>>(part, out, second, splits);
    MIXPREC_CUDA_CHECK_LAUNCH();
    return;
  }
  // Few outputs with long reductions (a loss's mean, a whole-tensor sum): split each output over
  // several blocks so the GPU fills, at least 4096 elements per split.
  const int64_t splits =
      l.n_out >= 512 ? 1 : std::clamp<int64_t>(std::min((l.len + 4095) / 4096, 1024 / l.n_out), 1, 1024);
  const int threads = std::min(row_threads((l.len + splits - 1) / splits), 512);
  const unsigned blocks = unsigned(std::min(l.n_out * splits, kMaxBlocks));
  if (splits == 1) {
    sum_rows_kernel<T, Out><<<blocks, threads, 0, stream>>>(src, out, l, 1);
    MIXPREC_CUDA_CHECK_LAUNCH();
    return;
  }
  Tensor partial = Tensor::empty({l.n_out, splits}, std::is_same_v<A, double> ? DType::f64 : DType::f32);
  A* part = static_cast<A*>(partial.data_ptr());
  sum_rows_kernel<T, A><<<blocks, threads, 0, stream>>>(src, part, l, splits);
  MIXPREC_CUDA_CHECK_LAUNCH();
  SumLayout second;
  second.out = make_strided<1>({l.n_out}, {Shape{splits}}, "sum");
  second.red = make_strided<1>({splits}, {Shape{1}}, "sum");
  second.n_out = l.n_out;
  second.len = splits;
  sum_rows_kernel<A, Out><<<unsigned(std::min(l.n_out, kMaxBlocks)), std::min(row_threads(splits), 512), 0, stream>>>(
      part, out, second, 1);
  MIXPREC_CUDA_CHECK_LAUNCH();
}

template <class Out>
__global__ void fill_zero_kernel(Out* dst, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = convert_to<Out>(0.0f);
}

// Sets *flag when an element of the (contiguous) x is NaN or inf.
template <class T, int kVec>
__global__ void non_finite_kernel(const T* src, int64_t n, int* flag) {
  using V = Vec<T, kVec>;
  bool bad = false;
  const int64_t nv = n / kVec;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) {
    const V v = reinterpret_cast<const V*>(src)[i];
#pragma unroll
    for (int j = 0; j < kVec; ++j) bad = bad || !isfinite(double(to_acc(v.v[j])));
  }
  for (int64_t i = nv * kVec + global_thread(); i < n; i += grid_threads())
    bad = bad || !isfinite(double(to_acc(src[i])));
  if (bad) *flag = 1;  // every writer writes the same value: no atomic needed
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  Tensor dst = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), out_dtype);
  if (dst.numel() == 0) return dst;
  const Launch on(x);
  dispatch_floating(x.dtype(), [&](auto xtag) {
    dispatch_any(out_dtype, [&](auto otag) {
      using T = decltype(xtag);
      using Out = decltype(otag);
      if (x.numel() == 0) {  // empty reductions: zeros
        fill_zero_kernel<Out>
            <<<blocks_for(dst.numel()), kThreads, 0, on.stream()>>>(static_cast<Out*>(dst.data_ptr()), dst.numel());
        MIXPREC_CUDA_CHECK_LAUNCH();
        return;
      }
      launch_sum<T, Out>(x, dims, dst, on.stream());
    });
  });
  return dst;
}

bool all_finite(const Tensor& x) {
  const Tensor xc = contig(x);
  const int64_t n = xc.numel();
  if (n == 0) return true;
  const Launch on(xc);
  Tensor flag = Tensor::empty({1}, DType::i64);  // the first 4 bytes serve as an int
  int* f = static_cast<int*>(flag.data_ptr());
  MIXPREC_CUDA_CHECK(cudaMemsetAsync(f, 0, sizeof(int), on.stream()));
  dispatch_floating(xc.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(xc.data_ptr());
    if (aligned_to(src, 16)) {
      constexpr int kV = kVec16<T>;
      non_finite_kernel<T, kV><<<blocks_for(n / kV), kThreads, 0, on.stream()>>>(src, n, f);
    } else {
      non_finite_kernel<T, 1><<<blocks_for(n), kThreads, 0, on.stream()>>>(src, n, f);
    }
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  int host = 0;
  MIXPREC_CUDA_CHECK(cudaMemcpyAsync(&host, f, sizeof(int), cudaMemcpyDeviceToHost, on.stream()));
  MIXPREC_CUDA_CHECK(cudaStreamSynchronize(on.stream()));  // the one sync: the answer is a host bool
  report_bad_targets(xc.device().index);
  return host == 0;
}

}  // namespace mixprec::kernels::cuda
