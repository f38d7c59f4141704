// CUDA kernels of the loss family (loss.h): the negative log-likelihood gather (summed in f64 in
// a fixed order, as the CPU's reference) and its scatter back to log_probs' shape; ignored targets
// contribute nothing, and mean's count of the others is taken on the device (the division happens
// in the kernel: no host read). A target out of range is recorded in a device flag
// (bad_index.cuh) and thrown at the host's next wait (report_bad_targets), never by a sync of its own.
#include "kernels/cuda/bad_index.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// One per GPU (a __device__ variable exists once per device): the first bad index seen.
__device__ BadIndex g_bad_index;

// reduce: one block sums -lp[i, t_i] over i (f64, fixed order; a bad target's term is NaN, an
// ignored one's 0), times 1/count for mean (count: the targets not ignored). Else one thread per
// sample writes its loss.
template <class T>
__global__ void __launch_bounds__(1024)
    nll_forward_kernel(const T* lp, const int64_t* target, T* dst, int64_t n, int64_t classes, LossReduce r,
                       int64_t ignore_index) {
  __shared__ double scratch[32];
  if (r != LossReduce::none) {
    double acc = 0, count = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t t = target[i];
      if (t == ignore_index) continue;
      count += 1;
      acc += check_index(&g_bad_index, kNllTarget, i, t, classes) ? -double(to_acc(lp[i * classes + t])) : double(NAN);
    }
    acc = block_reduce(acc, SumOp{}, 0.0, scratch);
    count = block_reduce(count, SumOp{}, 0.0, scratch);
    if (threadIdx.x == 0) dst[0] = convert_to<T>(acc * (r == LossReduce::mean ? 1.0 / count : 1.0));
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
