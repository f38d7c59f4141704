// The scalar math of the element-wise ops and the unary derivatives, shared by reference and fast kernels.
#pragma once
#include <cmath>
#include <numbers>

#include "kernels/kernels.h"

namespace mixprec::kernels {

template <class A>
inline A binary_value(BinaryOp op, A x, A y) {
  switch (op) {
    case BinaryOp::add: return x + y;
    case BinaryOp::sub: return x - y;
    case BinaryOp::mul: return x * y;
    case BinaryOp::div: return x / y;
  }
  return 0;
}

template <class A>
inline A gelu_exact(A x) { return A(0.5) * x * (A(1) + std::erf(x * A(std::numbers::sqrt2 / 2))); }
template <class A>
inline A gelu_tanh(A x) {
  const A c = A(0.7978845608028654);  // sqrt(2/pi)
  return A(0.5) * x * (A(1) + std::tanh(c * (x + A(0.044715) * x * x * x)));
}

template <class A>
inline A unary_value(UnaryOp op, A x, UnaryParams p) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::affine: return x * A(p.a) + A(p.b);
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::pow: return std::pow(x, A(p.a));
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::relu: return x > A(0) ? x : (x != x ? x : A(0));  // NaN stays NaN
    case UnaryOp::gelu: return gelu_exact(x);
    case UnaryOp::gelu_tanh: return gelu_tanh(x);
  }
  return 0;
}

template <class A>
inline A unary_derivative(UnaryGradOp op, A x, UnaryParams p) {
  switch (op) {
    case UnaryGradOp::relu: return x > A(0) ? A(1) : A(0);
    case UnaryGradOp::gelu: {
      const A cdf = A(0.5) * (A(1) + std::erf(x * A(std::numbers::sqrt2 / 2)));
      const A pdf = std::exp(A(-0.5) * x * x) * A(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
      return cdf + x * pdf;
    }
    case UnaryGradOp::gelu_tanh: {
      const A c = A(0.7978845608028654);
      const A inner = c * (x + A(0.044715) * x * x * x);
      const A t = std::tanh(inner);
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * c * (A(1) + A(3 * 0.044715) * x * x);
    }
    case UnaryGradOp::exp: return std::exp(x);
    case UnaryGradOp::log: return A(1) / x;
    case UnaryGradOp::pow: return A(p.a) * std::pow(x, A(p.a - 1));
    case UnaryGradOp::sqrt: return A(0.5) / std::sqrt(x);
  }
  return 0;
}

}  // namespace mixprec::kernels
