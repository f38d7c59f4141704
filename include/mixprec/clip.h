// Gradient clipping, as torch.nn.utils: clip_grad_norm_ (by the total norm over all gradients)
// and clip_grad_value_ (element-wise clamp). With a GradScaler, call scaler.unscale_(opt) first so
// the thresholds apply to the real (unscaled) gradients.
#pragma once
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::nn {

struct ClipNormOptions {
  double norm_type = 2.0;           // p >= 1, or infinity for the max norm
  bool error_if_nonfinite = false;  // throw instead of scaling by a non-finite norm
};

// The p-norm of all gradients of `params` taken together (accumulated in f64), computed in one
// pass; parameters without a gradient are skipped. inf/NaN gradients give an inf/NaN norm. A 0-d
// f64 tensor on the gradients' device, as PyTorch returns it: .item() reads it (a GPU syncs).
Tensor grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

// Scales every gradient by min(1, max_norm / (total_norm + 1e-6)) (PyTorch's coefficient),
// computed and applied on the gradients' device, and returns the total norm before clipping (0-d
// f64 there). Only error_if_nonfinite reads the norm on the host.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipNormOptions o = {});

// Clamps every gradient value to [-clip_value, clip_value].
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace mixprec::nn
