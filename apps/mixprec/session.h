// What train and bench share: model/optimizer/precision flags, and one training step.
#pragma once
#include <memory>
#include <string>

#include "args.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"
#include "models.h"

namespace mixprec::cli {

struct Precision {
  std::string name = "fp32";  // resolved preset name (never "auto")
  bool autocast = false;
  DType autocast_dtype = DType::bf16;
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
};

// Reads the flags train and bench share (model, precision, optimizer, batch size, seed, threads).
SessionOptions parse_session(Args& args);
Precision resolve_precision(const std::string& name);
int available_cores();

struct Session {
  SessionOptions opt;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
};
Session make_session(const SessionOptions& opt);  // seeds the generator, builds model and optimizer

// zero_grad, forward under the precision's autocast, cross-entropy, backward, optimizer step.
// Returns the loss as a double (this syncs nothing: the CPU is synchronous).
double train_step(Session& s, const Tensor& x, const Tensor& y);

// Peak bytes by category as a JSON-able map ("total" first), at the moment of the total peak.
std::string peak_memory_json();
std::string peak_memory_table();

}  // namespace mixprec::cli
