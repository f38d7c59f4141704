// Kernels of the loss family (ops/loss.cpp): the negative log-likelihood gather and its
// scatter-back, accumulated in f64 (O(N) work: reference only, no fast path needed).
// cross_entropy and mse_loss compose other families' kernels. Reference: ref/loss.cpp;
// dispatch: loss.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// How the per-sample losses are reduced: none (the target's shape), their sum, or their mean over
// the targets not ignored (counted where the targets live: on a GPU in the kernel, no host read).
enum class LossReduce { none, sum, mean };

// log_probs [..., C] (any leading shape, N rows), target i64 of the leading shape. A target equal
// to ignore_index has loss 0 and is not checked; the others must be class indices (throws naming
// nll_loss). sum/mean: the scalar sum_i -log_probs[i, target_i] (times 1/count for mean: NaN when
// every target is ignored, as PyTorch). In lp's dtype.
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index);
// grad_lp of shape lp_shape and `dtype`: -grad[i] (or -grad / count for mean) at [i, target_i], 0
// elsewhere and on the rows of ignored targets.
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype);

namespace ref {
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype);
}  // namespace ref

namespace cuda {  // src/kernels/cuda/loss.cu
// A target out of [0, C) cannot be thrown at the launch without waiting for the GPU: the kernel
// gives that sample a NaN loss and a zero gradient row and records the first such (index, value)
// in a flag on the device; report_bad_targets throws it (naming nll_loss, as the CPU's check)
// and clears it. It runs wherever the host waits for the GPU anyway: every copy to the host
// (item(), to_vector(), .to(cpu)) and all_finite. The embedding kernels (embedding.cu) record their
// out-of-range indices in the same flag (cuda/bad_index.cuh), and it throws those naming embedding.
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype);
void report_bad_targets(int device_index);
}  // namespace cuda

}  // namespace mixprec::kernels
