// GradScaler's internals, private to the library (tests include them from src/): the scale
// update rule alone and the fused unscale-and-check pass over an optimizer's gradients.
#pragma once
#include <cstdint>
#include <vector>

#include "mixprec/grad_scaler.h"

namespace mixprec::amp::detail {

// The next (scale, growth tracker, hysteresis left) after one update() that saw `found_inf`.
struct ScaleState {
  float scale;
  int64_t growth_tracker;
  int64_t hysteresis_left;
};
ScaleState next_scale_state(const ScaleState& s, bool found_inf, const GradScalerOptions& o);

// One parallel pass over the gradients of all `params` (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_): records whether any value is inf or NaN and,
// unless check_only, multiplies every gradient by inv_scale (an f16 gradient is replaced by an
// f32 one). With check_only the gradients are only read.
struct InfCheck {
  bool found_inf = false;
  int64_t num_grads = 0;  // parameters that had a gradient
};
InfCheck unscale_and_check(const std::vector<Tensor>& params, float inv_scale, bool check_only);

}  // namespace mixprec::amp::detail
