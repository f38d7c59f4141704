// Numeric diagnostics for mixed precision: how much of each gradient fp16 would flush to zero or
// overflow (at the current loss scale and without one), the scale trace and skipped steps, the
// autocast trace, and optimizer settings a 16-bit parameter cannot represent.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/optim.h"
#include "mixprec/tensor.h"

namespace mixprec::amp {

// f16 limits (IEEE binary16, round to nearest even).
constexpr double kF16ZeroBound = 0x1p-25;      // |x| <= 2^-25 (half the smallest subnormal) rounds to 0
constexpr double kF16MinNormal = 0x1p-14;      // below: subnormal, fewer than 11 significant bits
constexpr double kF16OverflowBound = 65520.0;  // |x| >= 65504 + half an ulp rounds to inf

// Fractions over the elements of one parameter's gradient.
struct GradStats {
  std::string name;
  DType dtype = DType::f32;  // of the gradient
  int64_t numel = 0;
  double zero = 0;                // exactly 0 as stored (true zeros and values already flushed)
  double underflow = 0;           // 0 in f16 at the current scale: |g*s| <= 2^-25 (zeros included)
  double underflow_unscaled = 0;  // 0 in f16 without scaling: |g| <= 2^-25
  double subnormal = 0;           // f16 subnormal at the current scale: 2^-25 < |g*s| < 2^-14
  double overflow = 0;            // inf in f16 at the current scale (|g*s| >= 65520), or inf/NaN
  double overflow_unscaled = 0;   // inf in f16 without scaling
  double max_abs = 0;             // largest finite |g| (unscaled)
  double rms = 0;                 // root mean square of the finite |g| (unscaled): the typical size
};

// Statistics of the gradients of `params` (named as nn::Module::named_parameters gives them),
// which carry the factor `scale`: call between scale(loss).backward() and unscale()/step(), with
// the scaler's get_scale() (1 without a scaler). The last entry, named "(all)", pools every
// parameter. Parameters without a gradient are left out.
std::vector<GradStats> gradient_stats(const std::vector<std::pair<std::string, Tensor>>& params, double scale);
std::string format_gradient_stats(const std::vector<GradStats>& stats, double scale);

// A compact record of the loss scale over training: every step where it changed, and every
// skipped step.
class ScaleTrace {
 public:
  // scale: the factor step `step`'s loss was multiplied by; skipped: its optimizer step was skipped.
  void record(int64_t step, double scale, bool skipped);
  const std::vector<std::pair<int64_t, double>>& changes() const { return changes_; }  // (first step, scale)
  const std::vector<int64_t>& skipped_steps() const { return skipped_; }
  std::string summary() const;  // one line: "scale 65536 (step 1) -> 32768 (step 3) ...; 2 skipped steps: 3, 9"

 private:
  std::vector<std::pair<int64_t, double>> changes_;
  std::vector<int64_t> skipped_;
};

// The autocast trace (amp::start_trace/stop_trace) as a table: op, input dtypes, run dtype.
std::string format_autocast_trace(const std::vector<TraceEntry>& trace);

// Settings of `opt` that its 16-bit parameters cannot represent or that their rounding cancels,
// one sentence each (empty when all is well): e.g. AdamW eps 1e-8 is 0 in f16, or a weight
// decay step below half an ulp, for parameters updated in 16 bits without a master copy.
std::vector<std::string> optimizer_warnings(const optim::Optimizer& opt);

}  // namespace mixprec::amp
