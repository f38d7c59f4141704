// Reference unary kernels and their gradients, computed in f32 (f64 for f64), any strides.
#include "kernels/unary.h"
#include "kernels/elementwise_math.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  return map_elements(x, [&](auto v) { return unary_value(op, v, p); });
}

Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p) {
  return map_grad(grad, x, [&](auto v) { return unary_derivative(op, v, p); });
}

}  // namespace mixprec::kernels::ref
