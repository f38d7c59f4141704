// Learning-rate schedules, stepped once per optimizer step (as torch.optim.lr_scheduler is
// stepped per iteration): constant, and cosine annealing to zero with optional linear warm-up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mixprec/optim.h"

namespace mixprec::optim {

class LrSchedule {
 public:
  // kind: "constant" or "cosine". total_steps: the whole run; warmup_steps ramp linearly from 0.
  // Each parameter group's lr at construction is its base lr (PyTorch's initial_lr).
  LrSchedule(Optimizer& opt, const std::string& kind, int64_t total_steps, int64_t warmup_steps = 0);
  // Sets every group's lr for step `step` (0-based) and returns the first group's.
  double apply(int64_t step);
  double base_lr(size_t group = 0) const { return base_lrs_[group]; }

 private:
  double lr_at(double base, int64_t step) const;

  Optimizer& opt_;
  bool cosine_;
  int64_t total_, warmup_;
  std::vector<double> base_lrs_;
};

}  // namespace mixprec::optim
