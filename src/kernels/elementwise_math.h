// The scalar math of the binary, unary and activation families and their derivatives, shared by
// the reference kernels (f32 or f64), the fast ones (f32) and the CUDA ones (kernels/cuda/, the
// same templates compiled for the GPU), so all compute the same formula.
#pragma once
#include <cmath>
#include <numbers>

#include "core/host_device.h"
#include "kernels/activation.h"
#include "kernels/binary.h"
#include "kernels/unary.h"

namespace mixprec::kernels {

template <class A>
MIXPREC_HOST_DEVICE inline A binary_value(BinaryOp op, A x, A y) {
  switch (op) {
    case BinaryOp::add:
      return x + y;
    case BinaryOp::sub:
      return x - y;
    case BinaryOp::mul:
      return x * y;
    case BinaryOp::div:
      return x / y;
  }
  return 0;
}

// x^y. On the GPU an f32 power goes through f64: CUDA's powf may be off by 4 ulp where the
// host's is correctly rounded; f64 then one rounding agrees with the host almost always.
template <class A>
MIXPREC_HOST_DEVICE inline A pow_acc(A x, A y) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(A) == 4) return A(::pow(double(x), double(y)));
#endif
  return std::pow(x, y);
}

template <class A>
MIXPREC_HOST_DEVICE inline A unary_value(UnaryOp op, A x, UnaryParams p) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::affine:
      return x * A(p.a) + A(p.b);
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return std::log(x);
    case UnaryOp::pow:
      return pow_acc(x, A(p.a));
    case UnaryOp::sqrt:
      return std::sqrt(x);
  }
  return 0;
}

template <class A>
MIXPREC_HOST_DEVICE inline A unary_derivative(UnaryGradOp op, A x, UnaryParams p) {
  switch (op) {
    case UnaryGradOp::exp:
      return std::exp(x);
    case UnaryGradOp::log:
      return A(1) / x;
    case UnaryGradOp::pow:
      return A(p.a) * pow_acc(x, A(p.a - 1));
    case UnaryGradOp::sqrt:
      return A(0.5) / std::sqrt(x);
  }
  return 0;
}

template <class A>
MIXPREC_HOST_DEVICE inline A gelu_exact(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(std::numbers::sqrt2 / 2)));
}
template <class A>
MIXPREC_HOST_DEVICE inline A gelu_tanh(A x) {
  const A c = A(0.7978845608028654);  // sqrt(2/pi)
  return A(0.5) * x * (A(1) + std::tanh(c * (x + A(0.044715) * x * x * x)));
}
// 1 / (1 + e^-x): e^-x overflows to inf for x < -88 (f32) and the quotient is then 0, as it should.
template <class A>
MIXPREC_HOST_DEVICE inline A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}

template <class A>
MIXPREC_HOST_DEVICE inline A activation_value(Activation op, A x) {
  switch (op) {
    case Activation::relu:
      return x > A(0) ? x : (x != x ? x : A(0));  // NaN stays NaN
    case Activation::gelu:
      return gelu_exact(x);
    case Activation::gelu_tanh:
      return gelu_tanh(x);
    case Activation::silu:
      return x / (A(1) + std::exp(-x));  // PyTorch's form
    case Activation::sigmoid:
      return sigmoid(x);
    case Activation::tanh:
      return std::tanh(x);
  }
  return 0;
}

// f'(.) from `s`, the output or the input as grad_from_output(op) says.
template <class A>
MIXPREC_HOST_DEVICE inline A activation_derivative(Activation op, A s) {
  switch (op) {
    case Activation::relu:
      return s > A(0) ? A(1) : A(0);
    case Activation::gelu: {
      const A cdf = A(0.5) * (A(1) + std::erf(s * A(std::numbers::sqrt2 / 2)));
      const A pdf = std::exp(A(-0.5) * s * s) * A(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
      return cdf + s * pdf;
    }
    case Activation::gelu_tanh: {
      const A c = A(0.7978845608028654);
      const A inner = c * (s + A(0.044715) * s * s * s);
      const A t = std::tanh(inner);
      return A(0.5) * (A(1) + t) + A(0.5) * s * (A(1) - t * t) * c * (A(1) + A(3 * 0.044715) * s * s);
    }
    case Activation::silu: {  // sigma(x) * (1 + x * (1 - sigma(x))), PyTorch's form
      const A sg = sigmoid(s);
      return sg * (A(1) + s * (A(1) - sg));
    }
    case Activation::sigmoid:
      return s * (A(1) - s);  // from y
    case Activation::tanh:
      return A(1) - s * s;  // from y
  }
  return 0;
}

}  // namespace mixprec::kernels
