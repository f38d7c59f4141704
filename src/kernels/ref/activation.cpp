// Reference activation kernels (relu, gelu, silu, sigmoid, tanh) and their gradients, computed in
// f32 (f64 for f64), any strides; and the in-place ReLU mask of the fused conv/linear ReLU.
#include "kernels/activation.h"

#include "kernels/elementwise_math.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {

Tensor activation(Activation op, const Tensor& x) {
  return map_elements(x, [&](auto v) { return activation_value(op, v); });
}

Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved) {
  return map_grad(grad, saved, [&](auto v) { return activation_derivative(op, v); });
}

void relu_mask_inplace(Tensor& grad, const Tensor& y) {
  const Tensor yc = contig(y);
  const int64_t n = grad.numel();
  dispatch_floating(grad.dtype(), [&](auto gtag) {
    dispatch_floating(yc.dtype(), [&](auto ytag) {
      using G = decltype(gtag);
      using Y = decltype(ytag);
      G* g = grad.data<G>();
      const Y* yv = yc.data<Y>();
      const G zero{};  // +0 in every float format
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i)
        if (!(load(yv + i) > 0)) g[i] = zero;
    });
  });
}

}  // namespace mixprec::kernels::ref
