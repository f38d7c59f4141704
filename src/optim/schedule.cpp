// Learning-rate schedules: constant and cosine annealing (SGDR without restarts).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "mixprec/error.h"
#include "mixprec/schedule.h"

namespace mixprec::optim {

LrSchedule::LrSchedule(Optimizer& opt, const std::string& kind, int64_t total_steps, int64_t warmup_steps)
    : opt_(opt), cosine_(kind == "cosine"), total_(total_steps), warmup_(warmup_steps) {
  for (const ParamGroupState& g : opt.param_groups()) base_lrs_.push_back(g.lr);
  MIXPREC_CHECK(kind == "cosine" || kind == "constant", "unknown lr schedule '", kind, "' (constant|cosine)");
  MIXPREC_CHECK(total_steps >= 1, "lr schedule needs at least one step, got ", total_steps);
  MIXPREC_CHECK(warmup_steps >= 0 && warmup_steps < total_steps, "lr warm-up of ", warmup_steps,
                " steps must be shorter than the run of ", total_steps, " steps");
}

double LrSchedule::lr_at(double base, int64_t step) const {
  if (step < warmup_) return base * double(step + 1) / double(warmup_ + 1);
  if (!cosine_) return base;
  // lr_t = base * (1 + cos(pi * t / T)) / 2 over the steps after warm-up.
  const double t = double(step - warmup_), span = double(std::max<int64_t>(1, total_ - warmup_));
  return base * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(t, span) / span));
}

double LrSchedule::apply(int64_t step) {
  for (size_t g = 0; g < base_lrs_.size(); ++g) opt_.set_lr(g, lr_at(base_lrs_[g], step));
  return opt_.lr(0);
}

}  // namespace mixprec::optim
