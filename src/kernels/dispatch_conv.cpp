// Dispatch for convolution, pooling and normalisation: the fast CPU path where it supports the
// case, the reference otherwise (see kernels.h).
#include <algorithm>

#include "kernels/kernels.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels {
namespace {
bool fast() { return backend() == Backend::cpu; }
}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu) {
  if (fast()) {
    Tensor dst = Tensor::empty(g.y_shape(), x.dtype());
    if (cpu::conv2d_forward(x, weight, bias, g, relu, dst)) return dst;
  }
  return ref::conv2d_forward(x, weight, bias, g, relu);
}

ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype) {
  if (fast()) {
    ConvGrads out;
    if (need_x) out.x = Tensor::empty(g.x_shape(), grad_y.dtype());
    if (need_weight) out.weight = Tensor::empty(g.w_shape(), weight_dtype);
    if (need_bias) out.bias = Tensor::empty({g.oc}, bias_dtype);
    if (cpu::conv2d_backward(grad_y, x, weight, g, out)) return out;
  }
  return ref::conv2d_backward(grad_y, x, weight, g, need_x, need_weight, need_bias, bias_dtype, weight_dtype);
}

void relu_mask_inplace(Tensor& grad, const Tensor& y) {
  MIXPREC_ASSERT(grad.is_contiguous() && grad.shape() == y.shape(), "relu_mask_inplace ", shape_str(grad.shape()), " vs ",
                 shape_str(y.shape()));
  const Tensor yc = contig(y);
  if (backend() == Backend::cpu && cpu::relu_mask_inplace(grad, yc)) return;
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

MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  if (fast()) {
    MaxPoolResult r;
    r.dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype());
    r.argmax = Tensor::empty({g.n, g.c, g.oh, g.ow}, g.argmax_dtype());
    if (cpu::max_pool2d_forward(x, g, r)) return r;
  }
  return ref::max_pool2d_forward(x, g);
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g) {
  if (fast()) {
    Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, grad_y.dtype());
    if (cpu::max_pool2d_backward(grad_y, argmax, g, gx)) return gx;
  }
  return ref::max_pool2d_backward(grad_y, argmax, g);
}

Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  if (fast()) {
    Tensor dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype());
    if (cpu::avg_pool2d_forward(x, g, dst)) return dst;
  }
  return ref::avg_pool2d_forward(x, g);
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g) {
  if (fast()) {
    Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, grad_y.dtype());
    if (cpu::avg_pool2d_backward(grad_y, g, gx)) return gx;
  }
  return ref::avg_pool2d_backward(grad_y, g);
}

void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var) {
  if (fast() && cpu::batch_norm_stats(x, channels, mean, var)) return;
  ref::batch_norm_stats(x, channels, mean, var);
}

Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias) {
  if (fast()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::batch_norm_forward(x, mean, invstd, weight, bias, dst)) return dst;
  }
  return ref::batch_norm_forward(x, mean, invstd, weight, bias);
}

NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias) {
  NormGrads out;
  if (fast() && cpu::batch_norm_backward(grad_y, x, mean, invstd, weight, training, need_x, need_weight, need_bias, out))
    return out;
  return ref::batch_norm_backward(grad_y, x, mean, invstd, weight, training, need_x, need_weight, need_bias);
}

Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd) {
  if (fast()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::layer_norm_forward(x, weight, bias, eps, mean, rstd, dst)) return dst;
  }
  return ref::layer_norm_forward(x, weight, bias, eps, mean, rstd);
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias) {
  NormGrads out;
  if (fast() && cpu::layer_norm_backward(grad_y, x, mean, rstd, weight, need_x, need_weight, need_bias, out)) return out;
  return ref::layer_norm_backward(grad_y, x, mean, rstd, weight, need_x, need_weight, need_bias);
}

}  // namespace mixprec::kernels
