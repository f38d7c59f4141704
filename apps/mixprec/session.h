// What train and bench share: model/optimizer/precision/loss-scale flags, and one training step
// (micro-batches, GradScaler, clipping).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "args.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"
#include "models.h"

namespace mixprec::cli {

struct Precision : amp::Precision {
  std::string why;  // for auto: what was detected
};

struct SessionOptions {
  ModelSpec model;
  Precision precision;
  std::string optimizer = "adamw";
  double lr = 1e-3, weight_decay = 0.0, momentum = 0.9;
  int64_t batch_size = 512;
  uint64_t seed = 0;
  int threads = 1;
  // ---- mixed precision ----
  std::string loss_scale = "none";  // dynamic | static:N | none (resolved from the preset)
  amp::GradScalerOptions scaler;    // enabled unless loss_scale is none
  int64_t accumulate = 1;           // micro-batches per optimizer step (each batch is split)
  double clip_grad_norm = 0;        // 0: off
  double clip_grad_value = 0;       // 0: off
  double loss_weight = 1;           // the loss is multiplied by this before backward (gradients shrink with it)
};

// Reads the flags train and bench share (model, precision, loss scale, optimizer, batch size,
// accumulation, clipping, seed, threads).
SessionOptions parse_session(Args& args);
ModelSpec parse_model(Args& args);                              // --model, --hidden, --channels
Precision parse_precision(Args& args, const std::string& def);  // --precision
Precision resolve_precision(const std::string& name);
int available_cores();
std::string describe_loss_scale(const SessionOptions& opt);  // "dynamic (init 65536, growth every 2000)", "none"

struct Session {
  SessionOptions opt;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<amp::GradScaler> scaler;  // always present; disabled for --loss-scale none
  // Called after the backward pass of a step, before unscale/clip/step (the gradients still
  // carry the scale): the diagnostics hook.
  std::function<void()> after_backward;
  bool measure_grad_norm = false;  // compute StepResult::grad_norm even without clipping
};
// Seeds the generator, builds the model, converts it to the preset's parameter dtype, then
// builds the optimizer (which takes its f32 master copies) and the GradScaler.
Session make_session(const SessionOptions& opt);

struct StepResult {
  double loss = 0;        // mean over the batch (micro-batch losses weighted by their size)
  double scale = 1;       // the factor this step's loss was multiplied by (before update())
  bool skipped = false;   // the optimizer step was skipped for inf/NaN gradients
  double grad_norm = -1;  // L2 norm of the unscaled gradients (before clipping); -1 if not measured
};
// zero_grad; per micro-batch forward under the precision's autocast, cross-entropy and
// scaler.scale(loss).backward(); then unscale + clip (if asked), scaler.step, scaler.update.
StepResult train_step(Session& s, const Tensor& x, const Tensor& y);

}  // namespace mixprec::cli
