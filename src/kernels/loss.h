// Kernels of the loss family (ops/loss.cpp): the negative log-likelihood gather and its
// scatter-back, accumulated in f64 (O(N) work: reference only, no fast path needed).
// cross_entropy and mse_loss compose other families' kernels. Reference: ref/loss.cpp;
// dispatch: loss.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// log_probs [N, C], target i64 [N] (checked to be class indices; throws naming nll_loss).
// reduce: the scalar sum_i -log_probs[i, target_i] * scale; else the [N] losses. In lp's dtype.
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale);
// grad_lp [N, C] of `dtype`: -grad[i] (or -grad * scale when reduced) at [i, target_i], else 0.
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype);

namespace ref {
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype);
}  // namespace ref

namespace cuda {  // src/kernels/cuda/loss.cu
// A target out of [0, C) cannot be thrown at the launch without waiting for the GPU: the kernel
// gives that sample a NaN loss and a zero gradient row and records the first such (index, value)
// in a flag on the device; report_bad_targets throws it (naming nll_loss, as the CPU's check)
// and clears it. It runs wherever the host waits for the GPU anyway: every copy to the host
// (item(), to_vector(), .to(cpu)) and all_finite.
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype);
void report_bad_targets(int device_index);
}  // namespace cuda

}  // namespace mixprec::kernels
