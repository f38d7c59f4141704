// CUDA kernels of the activation family (activation.h): relu, gelu (exact and tanh), silu,
// sigmoid, tanh and their gradients over kernels/elementwise_math.h (the CPU's formulas), f32
// math for 16-bit and f32 tensors, f64 for f64; and the in-place ReLU mask of a fused ReLU.
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise_math.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

struct ActivationFn {
  Activation op;
  template <class A>
  __device__ A operator()(A x) const {
    return activation_value(op, x);
  }
};

struct ActivationGradFn {
  Activation op;
  template <class A>
  __device__ A operator()(A grad, A saved) const {
    return grad * activation_derivative(op, saved);
  }
};

// grad = y > 0 ? grad : +0, grad and y in one dtype (the map keeps grad's value exactly: a
// 16-bit value survives the trip through f32).
struct ReluMaskFn {
  template <class A>
  __device__ A operator()(A grad, A y) const {
    return y > A(0) ? grad : A(0);
  }
};

// The same with grad and y in different dtypes (a fused ReLU whose output was cast): y is never
// rounded to grad's dtype, where a tiny positive y could become 0.
template <class G, class Y>
__global__ void relu_mask_mixed_kernel(G* grad, const Y* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    if (!(to_acc(y[i]) > 0)) grad[i] = convert_to<G>(0.0f);
}

}  // namespace

Tensor activation(Activation op, const Tensor& x) {
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(),
                    [&](auto tag) { map_elements<decltype(tag), 1>(dst, {&x}, ActivationFn{op}, "activation"); });
  return dst;
}

Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved) {
  MIXPREC_ASSERT(grad.shape() == saved.shape() && grad.dtype() == saved.dtype(), "activation_grad ",
                 shape_str(grad.shape()), " vs ", shape_str(saved.shape()));
  Tensor dst = Tensor::empty(saved.shape(), saved.dtype());
  dispatch_floating(saved.dtype(), [&](auto tag) {
    map_elements<decltype(tag), 2>(dst, {&grad, &saved}, ActivationGradFn{op}, "activation_grad");
  });
  return dst;
}

void relu_mask_inplace(Tensor& grad, const Tensor& y) {
  if (grad.dtype() == y.dtype()) {
    dispatch_floating(grad.dtype(), [&](auto tag) {
      map_elements<decltype(tag), 2>(grad, {&grad, &y}, ReluMaskFn{}, "relu_mask_inplace");
    });
    return;
  }
  const Tensor yc = contig(y);
  const int64_t n = grad.numel();
  if (n == 0) return;
  const Launch on(grad);
  dispatch_floating(grad.dtype(), [&](auto gtag) {
    dispatch_floating(yc.dtype(), [&](auto ytag) {
      using G = decltype(gtag);
      using Y = decltype(ytag);
      relu_mask_mixed_kernel<G, Y><<<blocks_for(n), kThreads, 0, on.stream()>>>(
          static_cast<G*>(grad.data_ptr()), static_cast<const Y*>(yc.data_ptr()), n);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mixprec::kernels::cuda
