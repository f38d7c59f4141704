// Checkpoint: a model, its optimizer, its GradScaler and the dropout generator in one safetensors
// file that PyTorch reads (model tensors under their state_dict names), gathered and restored
// bit-exactly so that a stopped run continues with the same numbers. Not the file format itself:
// that is mixprec/io.h.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "mixprec/grad_scaler.h"
#include "mixprec/io.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"
#include "mixprec/random.h"
#include "mixprec/state_dict.h"

namespace mixprec {

// The names in the file (docs/design.md, "Checkpoints"):
//   <model name>                           the model's state_dict, its own dtypes ("0.weight", "1.running_mean")
//   optimizer.step                         i64: the optimizer's step count
//   optimizer.param_groups.<g>.<key>       lr, weight_decay (f64), params (i64 indices)
//   optimizer.<param name>.<state>         exp_avg, exp_avg_sq, momentum_buffer, master (f32)
//   scaler.<key>                           GradScaler::state_dict (absent when it is disabled)
//   rng.<key>                              the generator: seed, stream, offset
//   run.<key>                              the caller's own (the training loop's epoch, step, ...)
// The model's tensors are every entry outside those prefixes, so a model whose own names start
// with one of them cannot be checkpointed (the constructor refuses it).
class Checkpoint {
 public:
  // What a checkpoint holds besides the model; a null part is neither saved nor restored. The
  // generator is the one dropout draws from (the calling thread's default_generator()).
  Checkpoint(nn::Module& model, optim::Optimizer* optimizer = nullptr, amp::GradScaler* scaler = nullptr,
             Generator* generator = &default_generator());

  // Every part's state under the names above, plus `run` (whose names must start with "run.").
  StateDict state_dict(const StateDict& run = {}) const;
  // Restores every part. The model's names and shapes are checked first, and the error lists
  // every name that does not match; each part then checks its own entries before it changes
  // anything (a part that fails leaves the parts before it loaded: restore into a fresh run).
  // "run." entries are left to the caller. `source` names the state dict in errors (its file).
  void load_state_dict(const StateDict& sd, const std::string& source = "the checkpoint");

  // Writes state_dict(run) and the metadata atomically (io::save_safetensors).
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {},
            const StateDict& run = {}) const;
  // Reads path and restores every part; returns the file (its metadata and tensors, for the
  // caller's "run." entries). Errors name the file.
  io::SafetensorsFile load(const std::string& path);

  // The model's entries of a checkpoint (or of a PyTorch state_dict file): every name outside
  // the prefixes above, in file order.
  static StateDict model_tensors(const StateDict& sd);
  // Loads a model's entries into `model` (floating values convert to the model's widths, as
  // PyTorch's load_state_dict does). `source` names the file in the error, which lists every
  // missing, unexpected and misshapen name: "<source> does not hold this model: missing ...".
  static void load_model(nn::Module& model, const StateDict& tensors, const std::string& source);

 private:
  nn::Module& model_;
  optim::Optimizer* optimizer_;
  amp::GradScaler* scaler_;
  Generator* generator_;
  std::vector<std::string> param_names_;  // per optimizer parameter: its name in the model
};

}  // namespace mixprec
