// Learning-rate schedules: constant and cosine annealing (SGDR without restarts) to a minimum lr.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "mixprec/error.h"
#include "mixprec/schedule.h"

namespace mixprec::optim {

LrSchedule::LrSchedule(Optimizer& opt, const std::string& kind, int64_t total_steps, int64_t warmup_steps,
                       double min_lr)
    : opt_(opt), cosine_(kind == "cosine"), total_(total_steps), warmup_(warmup_steps), min_lr_(min_lr) {
  for (const ParamGroupState& g : opt.param_groups()) base_lrs_.push_back(g.lr);
  MIXPREC_CHECK(kind == "cosine" || kind == "constant", "unknown lr schedule '", kind, "' (constant|cosine)");
  MIXPREC_CHECK(total_steps >= 1, "lr schedule needs at least one step, got ", total_steps);
  MIXPREC_CHECK(warmup_steps >= 0 && warmup_steps < total_steps, "lr warm-up of ", warmup_steps,
                " steps must be shorter than the run of ", total_steps, " steps");
  MIXPREC_CHECK(min_lr >= 0, "lr schedule: the minimum lr must be >= 0, got ", min_lr);
  for (const double base : base_lrs_)
    MIXPREC_CHECK(!cosine_ || min_lr <= base, "lr schedule: the minimum lr ", min_lr, " exceeds the base lr ", base);
}

double LrSchedule::lr_at(double base, int64_t step) const {
  if (step < warmup_) return base * double(step + 1) / double(warmup_ + 1);
  if (!cosine_) return base;
  // lr_t = min + (base - min) * (1 + cos(pi * t / T)) / 2 over the steps after warm-up. With
  // min = 0 this rounds exactly as base * 0.5 * (1 + cos) did before the minimum existed.
  const double t = double(step - warmup_), span = double(std::max<int64_t>(1, total_ - warmup_));
  return min_lr_ + (base - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(t, span) / span));
}

double LrSchedule::apply(int64_t step) {
  for (size_t g = 0; g < base_lrs_.size(); ++g) opt_.set_lr(g, lr_at(base_lrs_[g], step));
  return opt_.lr(0);
}

}  // namespace mixprec::optim
