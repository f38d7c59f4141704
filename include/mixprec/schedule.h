// Learning-rate schedules, stepped once per optimizer step (as torch.optim.lr_scheduler is
// stepped per iteration): constant, and cosine annealing to zero with optional linear warm-up.
#pragma once
#include <cstdint>
#include <string>

#include "mixprec/optim.h"

namespace mixprec::optim {

class LrSchedule {
 public:
  // kind: "constant" or "cosine". total_steps: the whole run; warmup_steps ramp linearly from 0.
  LrSchedule(Optimizer& opt, const std::string& kind, int64_t total_steps, int64_t warmup_steps = 0);
  // Sets the optimizer's lr for step `step` (0-based) and returns it.
  double apply(int64_t step);
  double base_lr() const { return base_lr_; }

 private:
  Optimizer& opt_;
  bool cosine_;
  int64_t total_, warmup_;
  double base_lr_;
};

}  // namespace mixprec::optim
