// CUDA kernels of the loss family (loss.h): the negative log-likelihood gather (summed in f64 in
// a fixed order, as the CPU's reference) and its scatter back to log_probs' shape, and
// cross-entropy from the logits (one block per row each way, as softmax.cu); ignored targets
// contribute nothing, and mean's count of the others is taken on the device (the division happens
// in the kernel: no host read). A target out of range is recorded in a device flag
// (bad_index.cuh) and thrown at the host's next wait (report_bad_targets), never by a sync of its own.
#include <type_traits>

#include "kernels/cuda/bad_index.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// One per GPU (a __device__ variable exists once per device): the first bad index seen.
__device__ BadIndex g_bad_index;

// A reduced loss by one block: the f64 sum, in a fixed order, of term(i, t_i) over the targets
// not ignored, times 1/count for mean (count: those targets). Every thread gets it.
template <class Term>
__device__ double reduce_kept(const int64_t* target, int64_t n, LossReduce r, int64_t ignore_index, Term term,
                              double* scratch) {
  double acc = 0, count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = target[i];
    if (t == ignore_index) continue;
    count += 1;
    acc += term(i, t);
  }
  acc = block_reduce(acc, SumOp{}, 0.0, scratch);
  count = block_reduce(count, SumOp{}, 0.0, scratch);
  return acc * (r == LossReduce::mean ? 1.0 / count : 1.0);
}

// reduce: one block sums -lp[i, t_i] over i (f64, fixed order; a bad target's term is NaN, an
// ignored one's 0), times 1/count for mean (count: the targets not ignored). Else one thread per
// sample writes its loss.
template <class T>
__global__ void __launch_bounds__(1024)
    nll_forward_kernel(const T* lp, const int64_t* target, T* dst, int64_t n, int64_t classes, LossReduce r,
                       int64_t ignore_index) {
  __shared__ double scratch[32];
  if (r != LossReduce::none) {
    const double v = reduce_kept(
        target, n, r, ignore_index,
        [&](int64_t i, int64_t t) {
          return check_index(&g_bad_index, kNllTarget, i, t, classes) ? -double(to_acc(lp[i * classes + t]))
                                                                      : double(NAN);
        },
        scratch);
    if (threadIdx.x == 0) dst[0] = convert_to<T>(v);
    return;
  }
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t t = target[i];
    dst[i] = t == ignore_index                                       ? convert_to<T>(0.0)
             : check_index(&g_bad_index, kNllTarget, i, t, classes) ? convert_to<T>(-double(to_acc(lp[i * classes + t])))
                                                                     : convert_to<T>(NAN);
  }
}

// *scale = 1 / (the targets not ignored): mean's factor for the backward (inf when all are).
__global__ void __launch_bounds__(1024)
    mean_scale_kernel(const int64_t* target, int64_t n, int64_t ignore_index, double* scale) {
  __shared__ double scratch[32];
  double count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) count += target[i] != ignore_index ? 1.0 : 0.0;
  count = block_reduce(count, SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) *scale = 1.0 / count;
}

// dst[i, c] = c == t_i ? -(reduced ? grad[0] * scale : grad[i]) : 0 (an ignored or bad target's row: all 0).
template <class G, class D>
__global__ void nll_backward_kernel(const G* grad, const int64_t* target, D* dst, int64_t n, int64_t classes,
                                    LossReduce r, int64_t ignore_index, const double* mean_scale) {
  for (int64_t e = global_thread(); e < n * classes; e += grid_threads()) {
    const int64_t i = e / classes, c = e - i * classes, t = target[i];
    const double scale = r == LossReduce::mean ? *mean_scale : 1.0;
    const double g = r != LossReduce::none ? double(to_acc(grad[0])) * scale : double(to_acc(grad[i]));
    dst[e] = convert_to<D>(c == t && t != ignore_index ? -g : 0.0);
  }
}

// The compute dtype's storage for cross-entropy's lse and losses: f32, f64 for f64 logits.
template <class T>
using ce_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Cross-entropy's forward (loss.h): one block per row, its lse as the softmax kernel's
// (block_row_lse), then the row's lse and loss (0 for an ignored target; NaN for a bad one,
// recorded in the flag as nll_loss's).
template <class T>
__global__ void __launch_bounds__(1024)
    ce_forward_kernel(const T* x, const int64_t* target, ce_t<T>* lse, ce_t<T>* losses, int64_t rows, int64_t cols,
                      int64_t ignore_index) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    const A l = block_row_lse(row, cols, scratch);
    if (threadIdx.x == 0) {
      const int64_t t = target[r];
      lse[r] = ce_t<T>(l);
      losses[r] = t == ignore_index                                   ? ce_t<T>(0)
                  : check_index(&g_bad_index, kNllTarget, r, t, cols) ? ce_t<T>(l - to_acc(row[t]))
                                                                      : ce_t<T>(NAN);
    }
  }
}

// The per-row losses reduced as nll_forward_kernel reduces them (reduce_kept).
template <class L>
__global__ void __launch_bounds__(1024)
    ce_reduce_kernel(const L* losses, const int64_t* target, L* dst, int64_t n, LossReduce r, int64_t ignore_index) {
  __shared__ double scratch[32];
  const double v =
      reduce_kept(target, n, r, ignore_index, [&](int64_t i, int64_t) { return double(losses[i]); }, scratch);
  if (threadIdx.x == 0) dst[0] = L(v);
}

// dx[r, c] = e^(x - lse_r) * s_r - (c == t_r ? s_r : 0), one block per row; s_r = 0 on the rows of
// ignored and bad targets (nll_loss's zero rows).
template <class T>
__global__ void __launch_bounds__(1024)
    ce_backward_kernel(const ce_t<T>* grad, const T* x, const ce_t<T>* lse, const int64_t* target, T* dst, int64_t rows,
                       int64_t cols, LossReduce r, int64_t ignore_index, const double* mean_scale) {
  using A = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = target[row];
    const bool none = t == ignore_index || t < 0 || t >= cols;
    const double scale = r == LossReduce::mean ? *mean_scale : 1.0;
    const A s = none ? A(0) : r != LossReduce::none ? A(ce_t<T>(double(grad[0]) * scale)) : A(grad[row]);
    const A l = A(lse[row]);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const A e = exp(to_acc(x[row * cols + c]) - l) * s;
      dst[row * cols + c] = from_acc<T>(c == t ? e - s : e);
    }
  }
}

}  // namespace

BadIndex* bad_index_flag() {
  void* p = nullptr;
  MIXPREC_CUDA_CHECK(cudaGetSymbolAddress(&p, g_bad_index));
  return static_cast<BadIndex*>(p);
}

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index) {
  const int64_t classes = log_probs.size(-1), n = target.numel();
  const Tensor lp = contig(log_probs), t = contig(target);
  Tensor dst = r != LossReduce::none ? Tensor::empty({}, lp.dtype()) : Tensor::empty(t.shape(), lp.dtype());
  const Launch on(lp);
  dispatch_floating(lp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const bool reduce = r != LossReduce::none;
    const unsigned blocks = reduce ? 1 : blocks_for(n);
    const int threads = reduce ? std::min(row_threads(n), 1024) : kThreads;
    nll_forward_kernel<T><<<blocks, threads, 0, on.stream()>>>(
        static_cast<const T*>(lp.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
        static_cast<T*>(dst.data_ptr()), n, classes, r, ignore_index);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype) {
  const Tensor g = contig(grad), t = contig(target);
  const int64_t n = t.numel(), classes = lp_shape.empty() ? 1 : lp_shape.back();
  Tensor dst = Tensor::empty(lp_shape, dtype);
  if (n * classes == 0) return dst;
  const Launch on(g);
  Tensor scale;  // mean's 1/count, computed on the device
  if (r == LossReduce::mean) {
    scale = Tensor::empty({}, DType::f64);
    mean_scale_kernel<<<1, std::min(row_threads(n), 1024), 0, on.stream()>>>(
        static_cast<const int64_t*>(t.data_ptr()), n, ignore_index, static_cast<double*>(scale.data_ptr()));
    MIXPREC_CUDA_CHECK_LAUNCH();
  }
  dispatch_floating(g.dtype(), [&](auto gtag) {
    dispatch_floating(dtype, [&](auto dtag) {
      using G = decltype(gtag);
      using D = decltype(dtag);
      nll_backward_kernel<G, D><<<blocks_for(n * classes), kThreads, 0, on.stream()>>>(
          static_cast<const G*>(g.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
          static_cast<D*>(dst.data_ptr()), n, classes, r, ignore_index,
          scale.defined() ? static_cast<const double*>(scale.data_ptr()) : nullptr);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
  return dst;
}

CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index) {
  const Tensor x = contig(logits), t = contig(target);
  const int64_t cols = x.size(-1), rows = t.numel();
  const DType od = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  CrossEntropyResult out;
  out.lse = Tensor::empty({rows}, od);
  Tensor losses = Tensor::empty(t.shape(), od);
  out.loss = r == LossReduce::none ? losses : Tensor::empty({}, od);
  const Launch on(x);
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using L = ce_t<T>;
    if (rows > 0) {
      ce_forward_kernel<T><<<unsigned(std::min(rows, kMaxBlocks)), row_threads(cols), 0, on.stream()>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
          static_cast<L*>(out.lse.data_ptr()), static_cast<L*>(losses.data_ptr()), rows, cols, ignore_index);
      MIXPREC_CUDA_CHECK_LAUNCH();
    }
    if (r != LossReduce::none) {
      ce_reduce_kernel<L><<<1, std::min(row_threads(rows), 1024), 0, on.stream()>>>(
          static_cast<const L*>(losses.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
          static_cast<L*>(out.loss.data_ptr()), rows, r, ignore_index);
      MIXPREC_CUDA_CHECK_LAUNCH();
    }
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index) {
  const Tensor x = contig(logits), l = contig(lse), t = contig(target);
  const Tensor g = contig(grad.dtype() == l.dtype() ? grad : grad.to(l.dtype()));
  const int64_t cols = x.size(-1), rows = t.numel();
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  if (rows * cols == 0) return dst;
  const Launch on(x);
  Tensor scale;  // mean's 1/count, computed on the device
  if (r == LossReduce::mean) {
    scale = Tensor::empty({}, DType::f64);
    mean_scale_kernel<<<1, std::min(row_threads(rows), 1024), 0, on.stream()>>>(
        static_cast<const int64_t*>(t.data_ptr()), rows, ignore_index, static_cast<double*>(scale.data_ptr()));
    MIXPREC_CUDA_CHECK_LAUNCH();
  }
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using L = ce_t<T>;
    ce_backward_kernel<T><<<unsigned(std::min(rows, kMaxBlocks)), row_threads(cols), 0, on.stream()>>>(
        static_cast<const L*>(g.data_ptr()), static_cast<const T*>(x.data_ptr()), static_cast<const L*>(l.data_ptr()),
        static_cast<const int64_t*>(t.data_ptr()), static_cast<T*>(dst.data_ptr()), rows, cols, r, ignore_index,
        scale.defined() ? static_cast<const double*>(scale.data_ptr()) : nullptr);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

void report_bad_targets(int device_index) {
  const Launch on(device_index);
  BadIndex bad{};
  // The callers have just waited for this stream, so the copy reads the flag of every launch so far.
  MIXPREC_CUDA_CHECK(
      cudaMemcpyFromSymbolAsync(&bad, g_bad_index, sizeof(bad), 0, cudaMemcpyDeviceToHost, on.stream()));
  MIXPREC_CUDA_CHECK(cudaStreamSynchronize(on.stream()));
  if (!bad.flag) return;
  const BadIndex clear{};
  MIXPREC_CUDA_CHECK(
      cudaMemcpyToSymbolAsync(g_bad_index, &clear, sizeof(clear), 0, cudaMemcpyHostToDevice, on.stream()));
  MIXPREC_CUDA_CHECK(cudaStreamSynchronize(on.stream()));
  const std::string where = detail::concat(" (found on cuda:", device_index, ", reported at this wait for the GPU)");
  if (bad.of == kEmbeddingIndex) throw Error(bad_embedding_index(bad.index, bad.value, bad.limit) + where);
  throw Error(detail::concat("nll_loss: target[", bad.index, "] = ", bad.value, " is not a class index in [0, ",
                             bad.limit, ")", where));
}

}  // namespace mixprec::kernels::cuda
