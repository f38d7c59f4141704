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

}  // namespace mixprec::kernels
