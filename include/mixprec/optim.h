// Optimizers: SGD (momentum, nesterov, weight decay) and AdamW, PyTorch's update rules, one
// fused pass over each parameter; state allocated as MemCategory::optimizer_state.
#pragma once
#include <cstdint>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& params() const { return params_; }
  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t steps() const { return steps_; }

 protected:
  std::vector<Tensor> params_;
  double lr_;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o = {});
  void step() override;
  const SGDOptions& options() const { return o_; }

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;  // per parameter, allocated at the first step that needs it
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // PyTorch's AdamW default; 0 makes it Adam
};
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o = {});
  void step() override;
  const AdamWOptions& options() const { return o_; }

 private:
  AdamWOptions o_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace mixprec::optim
