// CUDA kernels of the loss family (loss.h): the negative log-likelihood gather (summed in f64 in
// a fixed order, as the CPU's reference) and its scatter back to [N, C]. A target out of range is
// recorded in a device flag and thrown at the host's next wait (report_bad_targets), never by a
// sync of its own.
#include "kernels/cuda/common.cuh"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// One per GPU (a __device__ variable exists once per device): the first bad target seen.
struct BadTarget {
  int flag;
  long long index, value, classes;
};
__device__ BadTarget g_bad_target;

__device__ bool check_target(int64_t i, int64_t t, int64_t classes) {
  if (t >= 0 && t < classes) return true;
  if (atomicCAS(&g_bad_target.flag, 0, 1) == 0) {
    g_bad_target.index = i;
    g_bad_target.value = t;
    g_bad_target.classes = classes;
  }
  return false;
}

// reduce: one block sums -lp[i, t_i] * scale over i (f64, fixed order); a bad target's term is
// NaN. Else one thread per sample writes its loss.
template <class T>
__global__ void __launch_bounds__(1024) nll_forward_kernel(const T* lp, const int64_t* target, T* dst, int64_t n,
                                                           int64_t classes, bool reduce, double scale) {
  __shared__ double scratch[32];
  if (reduce) {
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t t = target[i];
      acc += check_target(i, t, classes) ? -double(to_acc(lp[i * classes + t])) : double(NAN);
    }
    acc = block_reduce(acc, SumOp{}, 0.0, scratch);
    if (threadIdx.x == 0) dst[0] = convert_to<T>(acc * scale);
    return;
  }
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t t = target[i];
    dst[i] = check_target(i, t, classes) ? convert_to<T>(-double(to_acc(lp[i * classes + t]))) : convert_to<T>(NAN);
  }
}

// dst[i, c] = c == t_i ? -(reduce ? grad[0] * scale : grad[i]) : 0 (a bad target's row: all 0).
template <class G, class D>
__global__ void nll_backward_kernel(const G* grad, const int64_t* target, D* dst, int64_t n, int64_t classes,
                                    bool reduce, double scale) {
  for (int64_t e = global_thread(); e < n * classes; e += grid_threads()) {
    const int64_t i = e / classes, c = e - i * classes;
    const double g = reduce ? double(to_acc(grad[0])) * scale : double(to_acc(grad[i]));
    dst[e] = convert_to<D>(c == target[i] ? -g : 0.0);
  }
}

}  // namespace

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale) {
  const int64_t n = log_probs.size(0), classes = log_probs.size(1);
  const Tensor lp = contig(log_probs), t = contig(target);
  Tensor dst = reduce ? Tensor::empty({}, lp.dtype()) : Tensor::empty({n}, lp.dtype());
  const Launch on(lp);
  dispatch_floating(lp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = reduce ? 1 : blocks_for(n);
    const int threads = reduce ? std::min(row_threads(n), 1024) : kThreads;
    nll_forward_kernel<T><<<blocks, threads, 0, on.stream()>>>(
        static_cast<const T*>(lp.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
        static_cast<T*>(dst.data_ptr()), n, classes, reduce, scale);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype) {
  const Tensor g = contig(grad), t = contig(target);
  const int64_t n = t.numel();
  Tensor dst = Tensor::empty({n, classes}, dtype);
  if (n * classes == 0) return dst;
  const Launch on(g);
  dispatch_floating(g.dtype(), [&](auto gtag) {
    dispatch_floating(dtype, [&](auto dtag) {
      using G = decltype(gtag);
      using D = decltype(dtag);
      nll_backward_kernel<G, D><<<blocks_for(n * classes), kThreads, 0, on.stream()>>>(
          static_cast<const G*>(g.data_ptr()), static_cast<const int64_t*>(t.data_ptr()),
          static_cast<D*>(dst.data_ptr()), n, classes, reduce, scale);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
  return dst;
}

void report_bad_targets(int device_index) {
  const Launch on(device_index);
  BadTarget bad{};
  // The callers have just waited for this stream, so the copy reads the flag of every launch so far.
  MIXPREC_CUDA_CHECK(
      cudaMemcpyFromSymbolAsync(&bad, g_bad_target, sizeof(bad), 0, cudaMemcpyDeviceToHost, on.stream()));
  MIXPREC_CUDA_CHECK(cudaStreamSynchronize(on.stream()));
  if (!bad.flag) return;
  const BadTarget clear{};
  MIXPREC_CUDA_CHECK(
      cudaMemcpyToSymbolAsync(g_bad_target, &clear, sizeof(clear), 0, cudaMemcpyHostToDevice, on.stream()));
  MIXPREC_CUDA_CHECK(cudaStreamSynchronize(on.stream()));
  throw Error(detail::concat("nll_loss: target[", bad.index, "] = ", bad.value, " is not a class index in [0, ",
                             bad.classes, ") (found on cuda:", device_index, ", reported at this wait for the GPU)"));
}

}  // namespace mixprec::kernels::cuda
