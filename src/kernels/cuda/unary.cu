// CUDA kernels of the unary family (unary.h): neg, affine, exp, log, pow, sqrt and their
// gradients, element-wise over kernels/elementwise_math.h (the CPU's formulas), f32 math for
// 16-bit and f32 tensors, f64 for f64.
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise_math.h"

namespace mixprec::kernels::cuda {
namespace {

struct UnaryFn {
  UnaryOp op;
  UnaryParams p;
  template <class A>
  __device__ A operator()(A x) const {
    return unary_value(op, x, p);
  }
};

struct UnaryGradFn {
  UnaryGradOp op;
  UnaryParams p;
  template <class A>
  __device__ A operator()(A grad, A x) const {
    return grad * unary_derivative(op, x, p);
  }
};

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) { map_elements<decltype(tag), 1>(dst, {&x}, UnaryFn{op, p}, "unary"); });
  return dst;
}

Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p) {
  MIXPREC_ASSERT(grad.shape() == x.shape() && grad.dtype() == x.dtype(), "unary_grad ", shape_str(grad.shape()), " vs ",
                 shape_str(x.shape()));
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) {
    map_elements<decltype(tag), 2>(dst, {&grad, &x}, UnaryGradFn{op, p}, "unary_grad");
  });
  return dst;
}

}  // namespace mixprec::kernels::cuda
