// Kernels of the softmax family (ops/softmax.cpp): softmax and log_softmax over the last
// dimension of a contiguous [rows, cols] view, forward and backward, accumulated in f32.
// Reference: ref/softmax.cpp; fast: cpu/softmax.cpp; dispatch: softmax.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

Tensor softmax_lastdim(const Tensor& x, bool log);
// grad wrt input given y = (log)softmax(x) and its grad
Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log);

namespace ref {
Tensor softmax_lastdim(const Tensor& x, bool log);
Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log);
}  // namespace ref

namespace cpu {
bool softmax_lastdim(const Tensor& x, bool log, Tensor& dst);
bool softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log, Tensor& dst);
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/softmax.cu
Tensor softmax_lastdim(const Tensor& x, bool log);
Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log);
}  // namespace cuda

}  // namespace mixprec::kernels
