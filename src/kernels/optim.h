// Kernels of the optimizer family (optim/, amp/, nn/clip.cpp, amp/diagnostics.cpp): the
// multi-tensor unscale-and-check, the fused SGD and AdamW updates that skip on a device flag, the
// loss-scale update, gradient norms and clipping, the f16-range counts, and a device counter.
// Every input that changes from step to step (the scale, found_inf, the step count, the learning
// rate, the norm) is a tensor on the computation's device, read by the kernel itself: nothing here
// copies device memory to the host, so a training step never waits for it (issue 17).
// Reference: ref/optim.cpp; fast: cpu/optim.cpp; CUDA: cuda/optim.cu; dispatch: optim.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/optim_rules.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// ------------------------------------------------------------------- unscale and inf check

// For each i: records in found_inf (0-d f32, set to 1, never cleared here) whether src[i] holds
// an inf or NaN, and, where dst[i] is defined, writes src[i] * inv_scale(scale) into it (dst may
// be src itself, or a new f32 tensor for an f16 src). f64 values are checked as f64. Contiguous
// tensors; scale is 0-d f32 (PyTorch's _amp_foreach_non_finite_check_and_unscale_).
void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf);

// -------------------------------------------------------------------------- fused updates

// One parameter of a fused update. param: f64/f32/bf16/f16, contiguous, updated in place; grad:
// contiguous, param's dtype or f32; master: the f32 master of a 16-bit param (undefined: none);
// state1/state2: SGD's momentum buffer (undefined without momentum) / AdamW's exp_avg, exp_avg_sq
// (f32, f64 for f64); lr: the group's 0-d f64 learning rate.
struct OptimParam {
  Tensor param, grad, master, state1, state2, lr;
  double weight_decay = 0;
  uint64_t index = 0;  // the parameter's index in its optimizer (its stochastic-rounding stream)
};
// What every parameter of one step shares.
struct OptimStep {
  Tensor step;              // 0-d i64: steps taken; the update uses step + 1 and stores it, unless skipped
  Tensor found_inf;         // 0-d f32 or undefined: nonzero skips the whole step (nothing is written)
  Tensor scale;             // 0-d f32 or undefined: gradients are read multiplied by inv_scale(scale)
  bool stochastic = false;  // 16-bit params without a master round stochastically
  uint64_t seed = 0;        // ... with Generator(seed).split(step + 1).split(index)
  Tensor rounding;          // i64 [2] or undefined: += (f32 weights changed, of those 16-bit unchanged)
};
struct SgdOptions {
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  Tensor momentum_ready;  // u8 [parameters]: 1 once a momentum buffer holds a step (set by the kernel)
};
void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s);
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s);

// ------------------------------------------------------------------------------ loss scale

// The scaler's counters, one i64 tensor [kScaleCounters] on its device.
enum ScaleCounter : int64_t {
  kGrowthTracker,
  kHysteresisLeft,
  kSkippedSteps,
  kOverflows,
  kUpdates,
  kMinScaleError,  // 1 after an overflow at min_scale with error_at_min_scale (until read)
  kScaleCounters
};
// One update of scale (0-d f32) and counters from the found_inf flags (0-d f32 each) of the
// optimizers checked since the last update (rule::next_scale).
void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r);
// counters[kSkippedSteps] += found_inf != 0.
void count_skipped(Tensor& counters, const Tensor& found_inf);
// A 0-d i64 counter += 1 (BatchNorm's num_batches_tracked).
void increment(Tensor& counter);

// ------------------------------------------------------------------------- norms, clipping

// The p-norm (p >= 1, or inf) of all grads together as a 0-d f64 tensor on their device: each
// value read exactly into f64, sums per block of kNormBlock values (in rule::kNormLanes lanes,
// lane_tree_sum), blocks added in order (inf: max, NaN propagating).
constexpr int64_t kNormBlock = 4096;
Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type);
// grads *= rule::clip_coef(total, max_norm), computed in f64, rounded once; nothing is written
// where the factor is 1. total: 0-d f64 on the grads' device.
void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm);
// Clamps every value to [-clip_value, clip_value] (NaN stays).
void clip_by_value(const std::vector<Tensor>& grads, double clip_value);

// ----------------------------------------------------------------------------- diagnostics

// What amp::gradient_stats counts of one gradient g carrying the factor `scale` (bounds in
// diagnostics.h): f64 [kRangeCounts] on g's device.
enum RangeCount : int64_t {
  kZero,
  kUnderflow,
  kUnderflowUnscaled,
  kSubnormal,
  kOverflow,
  kOverflowUnscaled,
  kMaxAbs,  // scaled: divide by scale
  kSumSq,   // of the unscaled finite values
  kFinite,
  kRangeCounts
};
Tensor grad_range_counts(const Tensor& g, double scale);

namespace ref {
void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf);
void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s);
void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s);
void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r);
void count_skipped(Tensor& counters, const Tensor& found_inf);
void increment(Tensor& counter);
Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type);
void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm);
void clip_by_value(const std::vector<Tensor>& grads, double clip_value);
Tensor grad_range_counts(const Tensor& g, double scale);
}  // namespace ref

namespace cpu {
void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf);
void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s);
void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s);
// The reference's results bit for bit where every gradient is contiguous (and, for the norm, of
// norm 2 or inf); false: not handled, nothing written.
bool grad_norm(const std::vector<Tensor>& grads, double norm_type, Tensor& out);
bool clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm);
}  // namespace cpu

namespace cuda {
void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf);
void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s);
void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s);
void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r);
void count_skipped(Tensor& counters, const Tensor& found_inf);
void increment(Tensor& counter);
Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type);
void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm);
void clip_by_value(const std::vector<Tensor>& grads, double clip_value);
Tensor grad_range_counts(const Tensor& g, double scale);
}  // namespace cuda

}  // namespace mixprec::kernels
