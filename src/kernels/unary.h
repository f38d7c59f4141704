// Kernels of the unary family (ops/unary.cpp): neg, affine, exp, log, pow, sqrt and the
// derivatives, computed in f32 (f64 for f64). Reference: ref/unary.cpp; fast: cpu/unary.cpp;
// dispatch: unary.cpp. The activations (relu, gelu, silu, ...) are their own family.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

enum class UnaryOp { neg, affine, exp, log, pow, sqrt };
// Backward of a unary op: dst = grad * f'(x).
enum class UnaryGradOp { exp, log, pow, sqrt };

struct UnaryParams {
  double a = 1.0;  // affine scale / pow exponent
  double b = 0.0;  // affine shift
};

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p = {});
Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p = {});

namespace ref {
Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p);
Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p);
}  // namespace ref

namespace cpu {
bool unary(UnaryOp op, const Tensor& x, UnaryParams p, Tensor& dst);
bool unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p, Tensor& dst);
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/unary.cu
Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p);
Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p);
}  // namespace cuda

}  // namespace mixprec::kernels
