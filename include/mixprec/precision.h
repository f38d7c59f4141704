// Precision presets: the known mixed-precision recipes as one struct, applied to a model, its
// optimizer and its GradScaler (DESIGN.md decision 8).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"

namespace mixprec::amp {

//  preset     | forward/backward            | parameters, grads | master | optimizer state | GradScaler
//  fp32       | f32                         | f32               | -      | f32             | off
//  amp-bf16   | autocast bf16 (PyTorch O1)  | f32               | -      | f32             | off
//  amp-fp16   | autocast f16                | f32               | -      | f32             | dynamic
//  half-bf16  | bf16 (Apex O2), norms f32   | bf16 (norms f32)  | f32    | f32             | off
//  half-fp16  | f16 (Apex O2), norms f32    | f16 (norms f32)   | f32    | f32             | dynamic
//  pure-bf16  | bf16, norms f32             | bf16 (norms f32)  | none: stochastic rounding (llm.c) | f32 | off
//  pure-fp16  | f16, norms f32              | f16 (norms f32)   | none: round to nearest | f32 | dynamic
// pure-fp16 is not a recipe to train with: it is the naive ".half()" baseline that shows what a
// master copy buys (small updates are swamped).
struct Precision {
  std::string name = "fp32";
  bool autocast = false;
  DType autocast_dtype = DType::bf16;  // lower-class ops (matmul, conv) run in this under autocast
  DType param_dtype = DType::f32;      // storage of the parameters of non-normalization layers
  bool master_weights = false;         // f32 master copies in the optimizer (16-bit parameters)
  bool stochastic_rounding = false;    // rounding of the 16-bit update without a master
  bool loss_scaling = false;           // GradScaler enabled by default (the fp16 presets)
  std::string summary;                 // one line, for logs
};

const std::vector<std::string>& precision_preset_names();  // fp32, amp-bf16, ..., pure-fp16
// Throws mixprec::Error listing the names when `name` is not a preset.
Precision precision_preset(std::string_view name);

// Converts the parameters of every non-normalization layer to p.param_dtype, in place (existing
// handles stay valid). Call before building the optimizer, which takes its master copies then.
void apply_precision(nn::Module& model, const Precision& p);
// What the optimizer needs to know: master weights or stochastic rounding for 16-bit parameters.
optim::HalfParamOptions half_param_options(const Precision& p, uint64_t seed = 0);
// The preset's scaler: PyTorch's defaults, enabled exactly when p.loss_scaling.
GradScalerOptions grad_scaler_options(const Precision& p);

}  // namespace mixprec::amp
