// Fast CPU unary kernels (neg, affine, exp, log, pow, sqrt) and their gradients: contiguous
// tensors in f32 blocks (16-bit converted in and rounded once out); else the reference.
#include "kernels/unary.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/elementwise_math.h"

namespace mixprec::kernels::cpu {

bool unary(UnaryOp op, const Tensor& x, UnaryParams p, Tensor& dst) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous() || !dst.is_contiguous()) return false;
  const float a = float(p.a), b = float(p.b);
  map_f32_blocks(x, dst, [&](const float* v, float* o, int64_t len) {
    switch (op) {
      case UnaryOp::neg:
        for (int64_t i = 0; i < len; ++i) o[i] = -v[i];
        break;
      case UnaryOp::affine:
        for (int64_t i = 0; i < len; ++i) o[i] = v[i] * a + b;
        break;
      default:
        for (int64_t i = 0; i < len; ++i) o[i] = unary_value<float>(op, v[i], p);
        break;
    }
  });
  return true;
}

bool unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p, Tensor& dst) {
  if (!f32_compute(x.dtype()) || grad.dtype() != x.dtype()) return false;
  map_grad_f32_blocks(grad, x, dst, [&](const float* g, const float* v, float* o, int64_t len) {
    for (int64_t i = 0; i < len; ++i) o[i] = g[i] * unary_derivative<float>(op, v[i], p);
  });
  return true;
}

}  // namespace mixprec::kernels::cpu
