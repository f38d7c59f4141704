// Kernels of the loss family (ops/loss.cpp): the negative log-likelihood gather and its
// scatter-back, accumulated in f64 (O(N) work: reference only, no fast path needed), and
// cross-entropy from the logits in one pass each way (fast CPU kernels in cpu/softmax.cpp, beside
// the softmax rows they share). mse_loss composes other families' kernels. Reference:
// ref/loss.cpp; dispatch: loss.cpp.
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

// Cross-entropy over the last dim of logits [..., C] (N rows), computed in f32 from logits stored
// in f32, bf16 or f16 (in f64 from f64 ones) without a log-probability tensor: lse_i = max +
// log(sum exp(x - max)) and loss_i = lse_i - x[i, t_i] (0 for an ignored target; the other targets
// checked as nll_loss_forward checks them, naming it), reduced as nll_loss_forward reduces (an f64
// sum in row order, times 1/count for mean). loss (the target's shape for none) and lse ([N], for
// the backward) in the compute dtype.
struct CrossEntropyResult {
  Tensor loss, lse;
};
CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index);
// grad_logits in logits' dtype, each element rounded once from the compute dtype: exp(x - lse_i) *
// s_i, less s_i at [i, t_i], where s_i = grad * 1/count (mean), grad (sum) or grad[i] (none), in
// the compute dtype, and 0 on the rows of ignored targets. On the CPU's fast path the same bits as nll_loss's backward
// through log_softmax's in f32, then rounded to logits' dtype (the composite autocast runs otherwise).
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index);

namespace ref {
// Throws unless every target of a CPU tensor is ignore_index or in [0, classes), naming nll_loss.
void check_class_targets(const std::vector<int64_t>& target, int64_t classes, int64_t ignore_index);
// The reduced losses' factor: 1/count for mean (count: the targets not ignored; inf when all are:
// the sum 0 times it is NaN, PyTorch's 0/0), 1 otherwise. Written as the multiplication the
// [N, C] losses always did, so their bits stay.
double mean_scale(LossReduce r, const std::vector<int64_t>& target, int64_t ignore_index);
CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype);
}  // namespace ref

namespace cpu {  // src/kernels/cpu/softmax.cpp
bool cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r, int64_t ignore_index,
                           CrossEntropyResult& out);
bool cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                            LossReduce r, int64_t ignore_index, Tensor& dst);
}  // namespace cpu

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
CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index);
void report_bad_targets(int device_index);
}  // namespace cuda

}  // namespace mixprec::kernels
