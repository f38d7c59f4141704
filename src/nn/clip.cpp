// clip_grad_norm_ and clip_grad_value_ (torch.nn.utils), as PyTorch's foreach path: the norm is
// computed (in f64) and applied by kernels on the gradients' device, never read on the host.
#include "mixprec/clip.h"

#include <cmath>

#include "kernels/optim.h"
#include "mixprec/error.h"

namespace mixprec::nn {
namespace {

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& param : params) {
    Tensor p = param;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    MIXPREC_CHECK(is_floating(g.dtype()), "clip: a gradient is ", dtype_name(g.dtype()));
    if (!g.is_contiguous()) {
      MemoryScope scope(MemCategory::gradients);
      g = g.clone();
      p.set_grad(g);
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace

Tensor grad_norm(const std::vector<Tensor>& params, double norm_type) {
  MIXPREC_CHECK(norm_type >= 1.0 || std::isinf(norm_type), "grad_norm: norm_type must be >= 1 or inf, got ", norm_type);
  const std::vector<Tensor> grads = grads_of(params);
  if (grads.empty()) return Tensor::scalar(0.0, DType::f64, params.empty() ? Device::cpu() : params[0].device());
  return kernels::grad_norm(grads, norm_type);
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipNormOptions o) {
  MIXPREC_CHECK(max_norm >= 0 && !std::isnan(max_norm), "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  Tensor total = grad_norm(params, o.norm_type);
  // Asked for: reads the norm on the host (PyTorch syncs here too).
  MIXPREC_CHECK(!o.error_if_nonfinite || std::isfinite(total.item()), "clip_grad_norm_: the total norm of order ",
                o.norm_type,
                " of the gradients is non-finite, so they cannot be clipped (error_if_nonfinite=false scales them "
                "by it anyway)");
  std::vector<Tensor> grads = grads_of(params);
  kernels::clip_by_norm(grads, total, max_norm);  // the factor is computed and applied on the device
  for (const Tensor& g : grads) g.bump_version();
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  MIXPREC_CHECK(clip_value >= 0 && !std::isnan(clip_value), "clip_grad_value_: clip_value must be >= 0, got ",
                clip_value);
  std::vector<Tensor> grads = grads_of(params);
  kernels::clip_by_value(grads, clip_value);
  for (const Tensor& g : grads) g.bump_version();
}

}  // namespace mixprec::nn
