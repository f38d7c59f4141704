// Learning-rate schedules, stepped once per optimizer step (as torch.optim.lr_scheduler is
// stepped per iteration): constant, and cosine annealing to a minimum lr (zero by default) after
// an optional linear warm-up, in nanoGPT's form (get_lr in its train.py).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mixprec/optim.h"

namespace mixprec::optim {

class LrSchedule {
 public:
  // kind: "constant" or "cosine". total_steps: the whole run. Step s < warmup_steps takes
  // base * (s + 1) / (warmup_steps + 1); after it, cosine takes
  //   min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * (s - warmup_steps) / (total_steps - warmup_steps)))
  // (min_lr is one value for every group, as nanoGPT's). Each parameter group's lr at
  // construction is its base lr (PyTorch's initial_lr).
  LrSchedule(Optimizer& opt, const std::string& kind, int64_t total_steps, int64_t warmup_steps = 0,
             double min_lr = 0.0);
  // Sets every group's lr for step `step` (0-based) and returns the first group's.
  double apply(int64_t step);
  double base_lr(size_t group = 0) const { return base_lrs_[group]; }

 private:
  double lr_at(double base, int64_t step) const;

  Optimizer& opt_;
  bool cosine_;
  int64_t total_, warmup_;
  double min_lr_;
  std::vector<double> base_lrs_;
};

}  // namespace mixprec::optim
