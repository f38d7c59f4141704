// The precision presets (see include/mixprec/precision.h for the table).
#include "mixprec/precision.h"

#include "mixprec/error.h"

namespace mixprec::amp {

const std::vector<std::string>& precision_preset_names() {
  static const std::vector<std::string> names = {"fp32",      "amp-bf16",  "amp-fp16", "half-bf16",
                                                 "half-fp16", "pure-bf16", "pure-fp16"};
  return names;
}

Precision precision_preset(std::string_view name) {
  Precision p;
  p.name = std::string(name);
  if (name == "fp32") {
    p.summary = "f32 everywhere";
  } else if (name == "amp-bf16" || name == "amp-fp16") {
    p.autocast = true;
    p.autocast_dtype = name == "amp-bf16" ? DType::bf16 : DType::f16;
    p.loss_scaling = name == "amp-fp16";
    p.summary = std::string("autocast ") + (name == "amp-bf16" ? "bf16" : "f16") + ", f32 parameters" +
                (p.loss_scaling ? ", dynamic loss scaling" : "");
  } else if (name == "half-bf16" || name == "half-fp16" || name == "pure-bf16" || name == "pure-fp16") {
    const DType t = name.ends_with("bf16") ? DType::bf16 : DType::f16;
    p.autocast = true;
    p.autocast_dtype = t;
    p.param_dtype = t;
    p.master_weights = name.starts_with("half");
    p.stochastic_rounding = name == "pure-bf16";
    p.loss_scaling = t == DType::f16;
    p.summary = std::string(dtype_name(t)) + " parameters and activations (norm layers f32), " +
                (p.master_weights        ? "f32 master weights"
                 : p.stochastic_rounding ? "no master copy, stochastic rounding"
                                         : "no master copy, round to nearest") +
                ", f32 optimizer state" + (p.loss_scaling ? ", dynamic loss scaling" : "");
  } else {
    std::string all;
    for (const auto& n : precision_preset_names()) all += (all.empty() ? "" : "|") + n;
    throw Error(detail::concat("unknown precision '", name, "' (expected ", all, ")"));
  }
  return p;
}

void apply_precision(nn::Module& model, const Precision& p) {
  if (p.param_dtype == DType::f32) return;
  // Normalization layers keep f32 parameters and statistics (Apex O2's keep_batchnorm_fp32).
  model.to(p.param_dtype, [](const nn::Module& m) { return !m.is_normalization(); });
}

optim::HalfParamOptions half_param_options(const Precision& p, uint64_t seed) {
  optim::HalfParamOptions h;
  h.master_weights = p.master_weights;
  h.stochastic_rounding = p.stochastic_rounding;
  h.seed = seed;
  return h;
}

GradScalerOptions grad_scaler_options(const Precision& p) {
  GradScalerOptions o;
  o.enabled = p.loss_scaling;
  return o;
}

}  // namespace mixprec::amp
