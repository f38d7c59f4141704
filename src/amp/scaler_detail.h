// GradScaler's internals, private to the library (tests include them from src/): the
// unscale-and-check pass over an optimizer's gradients and the options as the update kernel takes them.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/optim_rules.h"
#include "mixprec/grad_scaler.h"

namespace mixprec::amp::detail {

// One multi-tensor pass over the gradients of all `params` (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_): sets found_inf (0-d f32 on their device) to 1 if
// any value is inf or NaN and, unless check_only, multiplies every gradient by 1/scale (an f16
// gradient is replaced by an f32 one). With check_only the gradients are only read. Returns how
// many parameters had a gradient.
int64_t unscale_and_check(const std::vector<Tensor>& params, const Tensor& scale, Tensor& found_inf, bool check_only);

kernels::rule::ScaleRule scale_rule(const GradScalerOptions& o);

}  // namespace mixprec::amp::detail
