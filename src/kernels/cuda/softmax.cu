// CUDA kernels of the softmax family (softmax.h): softmax and log_softmax over the last dim of a
// contiguous [rows, cols] view, forward and backward, one block per row (a warp for rows of up
// to 32), accumulated in f32 (f64 for f64), in a fixed order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// The CPU's formula (kernels/ref/softmax.cpp): lse = max + log(sum exp(x - max)), then x - lse
// (log) or exp(x - lse).
template <class T>
__global__ void __launch_bounds__(1024) softmax_kernel(const T* src, T* dst, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* s = src + r * cols;
    const A lse = block_row_lse(s, cols, scratch);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A v = to_acc(s[c]) - lse;
      dst[r * cols + c] = from_acc<T>(log ? v : exp(v));
    }
  }
}

// log_softmax: dx = g - softmax * sum(g); softmax: dx = y * (g - sum(g * y)).
template <class T>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(const T* y, const T* g, T* dst, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t o = r * cols;
    A dot = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dot += log ? to_acc(g[o + c]) : to_acc(g[o + c]) * to_acc(y[o + c]);
    dot = block_reduce(dot, SumOp{}, A(0), scratch);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A yv = to_acc(y[o + c]), gv = to_acc(g[o + c]);
      dst[o + c] = from_acc<T>(log ? gv - exp(yv) * dot : yv * (gv - dot));
    }
  }
}

struct Rows {
  int64_t rows, cols;
};
Rows rows_of(const Tensor& x) {
  const int64_t cols = x.dim() ? x.size(-1) : 1;
  return {cols ? x.numel() / cols : 0, cols};
}

}  // namespace

Tensor softmax_lastdim(const Tensor& x, bool log) {
  const Tensor xc = contig(x);
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  const auto [rows, cols] = rows_of(x);
  if (rows == 0) return dst;
  const Launch on(xc);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<unsigned(std::min(rows, kMaxBlocks)), row_threads(cols), 0, on.stream()>>>(
        static_cast<const T*>(xc.data_ptr()), static_cast<T*>(dst.data_ptr()), rows, cols, log);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log) {
  MIXPREC_ASSERT(y.shape() == grad_y.shape() && y.dtype() == grad_y.dtype(), "softmax backward ", shape_str(y.shape()),
                 " vs ", shape_str(grad_y.shape()));
  const Tensor yc = contig(y), gc = contig(grad_y);
  Tensor dst = Tensor::empty(y.shape(), y.dtype());
  const auto [rows, cols] = rows_of(y);
  if (rows == 0) return dst;
  const Launch on(yc);
  dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T><<<unsigned(std::min(rows, kMaxBlocks)), row_threads(cols), 0, on.stream()>>>(
        static_cast<const T*>(yc.data_ptr()), static_cast<const T*>(gc.data_ptr()), static_cast<T*>(dst.data_ptr()),
        rows, cols, log);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

}  // namespace mixprec::kernels::cuda
