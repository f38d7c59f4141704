// Kernels of the matmul family (ops/matmul.cpp): dst[m,n] = relu?(op(a) @ op(b) (+ bias[n]));
// op = transpose when the flag says so. a, b are 2-d (any strides), dst contiguous [m, n] of its
// own dtype; or all three 3-d with one batch size, a product per batch (op transposes the last
// two dims). accumulate: dst += result. Reference: ref/matmul.cpp; fast (oneDNN): cpu/matmul.cpp
// over cpu/dnnl_matmul.{h,cpp}; dispatch: matmul.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

struct MatmulOpts {
  bool trans_a = false, trans_b = false;
  const Tensor* bias = nullptr;
  bool relu = false;  // applied after the bias, before the accumulation; NaN stays NaN
  bool accumulate = false;
};
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o = {});

namespace ref {
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace ref

namespace cpu {
bool matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace cpu

}  // namespace mixprec::kernels
