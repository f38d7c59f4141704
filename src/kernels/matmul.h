// Kernels of the matmul family (ops/matmul.cpp): dst[m,n] = act(op(a) @ op(b) (+ bias[n]));
// op = transpose when the flag says so, act = relu, gelu (tanh form) or none. a, b are 2-d (any
// strides), dst contiguous [m, n] of its own dtype; or all three 3-d with one batch size, a product
// per batch (op transposes the last two dims). accumulate: dst += result. Reference:
// ref/matmul.cpp; fast (oneDNN): cpu/matmul.cpp over cpu/dnnl_matmul.{h,cpp}; GPU (cuBLASLt):
// cuda/matmul.cpp; dispatch: matmul.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

struct MatmulOpts {
  bool trans_a = false, trans_b = false;
  const Tensor* bias = nullptr;
  bool relu = false;  // applied after the bias, before the accumulation; NaN stays NaN
  // GELU's tanh form (cuBLASLt's GELU epilogue), after the bias, before the accumulation. When
  // gelu_input is set (a contiguous tensor of dst's shape and dtype) it receives GELU's input,
  // op(a) @ op(b) + bias, which its backward needs.
  bool gelu = false;
  Tensor* gelu_input = nullptr;
  bool accumulate = false;
};
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o = {});

// Whether fp32 matmuls on a GPU may use TF32 tensor cores (10-bit mantissa products), as PyTorch's
// torch.backends.cuda.matmul.allow_tf32: off by default, so fp32 is true fp32. Process-wide.
void set_allow_tf32(bool on);
bool allow_tf32();

namespace ref {
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace ref

namespace cpu {
bool matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace cpu

namespace cuda {
// cuBLASLt (src/kernels/cuda/matmul.cpp); the operands on one GPU.
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace cuda

}  // namespace mixprec::kernels
