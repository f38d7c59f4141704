// Kernels of the activation family (ops/activation.cpp): relu, gelu (exact and tanh form), silu,
// sigmoid, tanh, forward and backward, computed in f32 (f64 for f64); and the in-place ReLU mask
// of the fused conv/linear ReLU. Reference: ref/activation.cpp; fast (AVX-512): cpu/activation.cpp;
// dispatch: activation.cpp. Dropout has no kernel of its own (a mask and a mul).
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

enum class Activation { relu, gelu, gelu_tanh, silu, sigmoid, tanh };

// Which tensor the backward reads, as PyTorch saves it: the output for relu (y > 0 is x > 0),
// sigmoid (y(1-y)) and tanh (1-y^2), so the input can be freed; the input for gelu and silu.
constexpr bool grad_from_output(Activation a) {
  return a == Activation::relu || a == Activation::sigmoid || a == Activation::tanh;
}

Tensor activation(Activation op, const Tensor& x);
// grad * f'(x), with `saved` the output or the input as grad_from_output(op) says.
Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved);
// grad = y > 0 ? grad : 0 in place (grad contiguous; y same shape): a fused ReLU's backward.
void relu_mask_inplace(Tensor& grad, const Tensor& y);

namespace ref {
Tensor activation(Activation op, const Tensor& x);
Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved);
void relu_mask_inplace(Tensor& grad, const Tensor& y);
}  // namespace ref

namespace cpu {
bool activation(Activation op, const Tensor& x, Tensor& dst);
bool activation_grad(Activation op, const Tensor& grad, const Tensor& saved, Tensor& dst);
bool relu_mask_inplace(Tensor& grad, const Tensor& y);
// The same on n raw elements of dtype t (f32, bf16 or f16): out[i] = y[i] > 0 ? gy[i] : +0, one
// thread (a kernel's own plane: the ReLU's mask as a max pool's backward routes its gradient).
void relu_mask(const void* gy, const void* y, DType t, int64_t n, void* out);
// relu (x > 0 or NaN ? x : +0, the reference's bits) in place on n raw elements of dtype t (f32,
// bf16 or f16), in parallel where they are many: a fused ReLU applied after a oneDNN primitive,
// whose own ReLU post-op makes a NaN +0 on AVX-512 hosts (docs/conv.md, "The fused ReLU").
void relu_inplace(void* p, DType t, int64_t n);
// For tests: while one lives, the 16-bit activations on this thread (relu aside) go through their
// tables (on) or their arithmetic (off), whatever the tensor's size and MIXPREC_ACTIVATION_TABLE:
// cpu/activation.cpp's table16, the default on AVX-512 hosts.
class ActivationTable {
 public:
  explicit ActivationTable(bool on);
  ~ActivationTable();
  ActivationTable(const ActivationTable&) = delete;
  ActivationTable& operator=(const ActivationTable&) = delete;

 private:
  int previous_;
};
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/activation.cu
Tensor activation(Activation op, const Tensor& x);
Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved);
void relu_mask_inplace(Tensor& grad, const Tensor& y);
}  // namespace cuda

}  // namespace mixprec::kernels
