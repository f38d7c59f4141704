// Optimizers: SGD (momentum, nesterov, weight decay) and AdamW, PyTorch's update rules, one
// fused pass over all parameters; parameter groups with their own lr and weight decay (as
// PyTorch's param_groups); state allocated as MemCategory::optimizer_state. 16-bit parameters
// get an f32 master copy (or stochastic rounding without one), and the pass can unscale
// gradients on the fly for GradScaler. The step count and the learning rates live in tensors on
// the parameters' device, so GradScaler can skip a step there without the host.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixprec/state_dict.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {
struct OptimParam;
struct OptimStep;
}  // namespace mixprec::kernels

namespace mixprec::optim {

// What a parameter group may set for itself (PyTorch's per-group keys); an unset field takes
// the optimizer's option. E.g. no weight decay on norms and biases:
//   optim::AdamW opt({{decay_params, {.weight_decay = 0.1}}, {no_decay_params, {.weight_decay = 0.0}}},
//                    {.lr = 1e-3});
struct GroupOptions {
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
};
struct ParamGroup {
  std::vector<Tensor> params;
  GroupOptions options{};
};

// A group as the optimizer holds it: its parameters (indices into Optimizer::params(), which
// lists the groups' parameters in order) and its settings.
struct ParamGroupState {
  std::vector<size_t> params;
  double lr;
  double weight_decay;
};

// How an optimizer updates 16-bit (bf16/f16) parameters; f32 and f64 parameters ignore it.
// The optimizer state (momentum, Adam moments) is f32 for every 16-bit parameter.
struct HalfParamOptions {
  // Keep an f32 master copy of each 16-bit parameter (counted as optimizer state): the update
  // goes to the master and the parameter becomes its round-to-nearest-even copy (Apex O2).
  bool master_weights = true;
  // Without a master: round each updated weight stochastically into 16 bits, so an update
  // below half an ulp still moves the weight on average (llm.c). Ignored with a master.
  bool stochastic_rounding = false;
  uint64_t seed = 0;  // of the stochastic-rounding stream: Generator(seed).split(step).split(parameter)
};

class Optimizer {
 public:
  // lr and weight_decay are the defaults of groups that do not set them.
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay, HalfParamOptions half = {});
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  void step() { step_scaled(Tensor(), Tensor()); }
  // GradScaler's step, decided on the device: nothing changes (not even the step count) when
  // found_inf (0-d f32 on the parameters' device; undefined: never) is nonzero; with `scale`
  // (0-d f32 loss scale; undefined: gradients already unscaled) each gradient is multiplied by
  // 1/scale as it is read, so unscaling, the master update and the 16-bit write-back are one pass.
  void step_scaled(const Tensor& found_inf, const Tensor& scale);

  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& params() const { return params_; }  // every group's, in group order
  const std::vector<ParamGroupState>& param_groups() const { return groups_; }
  size_t group_of(size_t param) const { return group_of_[param]; }
  double lr(size_t group = 0) const { return groups_[group].lr; }
  void set_lr(size_t group, double lr);
  void set_lr(double lr);  // every group
  double weight_decay(size_t group = 0) const { return groups_[group].weight_decay; }
  // Steps taken (skipped ones not counted): read from the device, so a GPU syncs here.
  int64_t steps() const;
  const HalfParamOptions& half_options() const { return half_; }
  // The f32 master copy of parameter i (undefined when it has none).
  const Tensor& master(size_t i) const { return master_[i]; }

  // Rounding diagnostics for 16-bit parameters: with tracking on, every update counts the
  // weights whose f32 value changed and, of those, the ones whose 16-bit value did not (rounded
  // away without a master copy; held in the master with one). take_ returns and resets them.
  struct RoundingStats {
    int64_t changed = 0;          // weights whose f32 value (master, or the update before rounding) moved
    int64_t unchanged_16bit = 0;  // ... whose stored 16-bit value stayed the same
  };
  void set_track_rounding(bool on) { track_ = on; }
  RoundingStats take_rounding_stats();  // counted on the device, read here

  // "step" (i64 0-d: the optimizer's step count, which PyTorch keeps per parameter as
  // state.<i>.step), per group g "param_groups.<g>.lr", "param_groups.<g>.weight_decay" (f64 0-d)
  // and "param_groups.<g>.params" (i64 [n], the indices), then per parameter i
  // "state.<i>.<name>" (exp_avg, exp_avg_sq, momentum_buffer, master), as PyTorch names the
  // state. load_state_dict checks every key, shape and dtype (and that the groups hold the same
  // parameters), throws naming the first bad key before changing anything, and restores
  // bit-exactly.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

  virtual std::string name() const = 0;       // "SGD", "AdamW"
  virtual double eps() const { return 0.0; }  // AdamW's eps (0 where there is none)

  // A new optimizer of the same kind and options over other parameters (each group's lr and
  // weight decay as given there). ZeRO-1 (dist::DataParallel) makes this rank's shard optimizer so.
  virtual std::unique_ptr<Optimizer> make_like(std::vector<ParamGroup> groups) const = 0;
  // ZeRO-1: a shard optimizer made by make_like takes over the updates (and, sliced, this one's
  // state: dist::DataParallel copies it first); this one frees its master copies and moments and
  // refuses step() and state_dict() from now on.
  void hand_over_to_shard();
  bool handed_over() const { return handed_over_; }

 protected:
  // One update of every parameter that has a gradient: step_scaled's work.
  virtual void update(const Tensor& found_inf, const Tensor& scale) = 0;
  virtual void moved_to(const Device&) {}  // the subclass moves its device state to the parameters'
  // The parameters that have a gradient as the kernels take them; state(i, op) sets op's state.
  std::vector<kernels::OptimParam> with_grads(const std::function<void(size_t, kernels::OptimParam&)>& state);
  kernels::OptimStep step_args(const Tensor& found_inf, const Tensor& scale) const;
  virtual StateDict named_state(size_t i) const = 0;  // the tensors the subclass holds
  // Checks (before anything is loaded) that the subclass accepts state `key` of parameter i.
  virtual void check_named_state(size_t i, const std::string& key) const = 0;
  virtual void set_named_state(size_t i, const std::string& key, const Tensor& t) = 0;
  virtual void clear_named_state() = 0;  // frees the subclass's state tensors (hand_over_to_shard)

  std::vector<Tensor> params_;
  std::vector<Tensor> master_;  // per parameter: f32 master of a 16-bit parameter, or undefined
  std::vector<ParamGroupState> groups_;
  std::vector<size_t> group_of_;  // per parameter: its group
  Tensor step_;                   // i64 0-d on the parameters' device: steps taken
  std::vector<Tensor> lr_;        // per group: f64 0-d on the parameters' device (groups_[g].lr's copy)
  HalfParamOptions half_;
  bool track_ = false;
  bool handed_over_ = false;
  Tensor rounding_;  // i64 [2] on the parameters' device: RoundingStats since the last take

 private:
  void to_params_device();  // moves step_, lr_, rounding_ (and the subclass's) where params_[0] is
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  HalfParamOptions half{};
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o = {});
  SGD(std::vector<ParamGroup> groups, SGDOptions o = {});
  const SGDOptions& options() const { return o_; }
  std::string name() const override { return "SGD"; }
  std::unique_ptr<Optimizer> make_like(std::vector<ParamGroup> groups) const override;

 protected:
  void update(const Tensor& found_inf, const Tensor& scale) override;
  void moved_to(const Device& d) override;
  StateDict named_state(size_t i) const override;
  void check_named_state(size_t i, const std::string& key) const override;
  void set_named_state(size_t i, const std::string& key, const Tensor& t) override;
  void clear_named_state() override;

 private:
  SGDOptions o_;
  std::vector<Tensor> momentum_;  // per parameter, allocated at the first step that needs it
  Tensor momentum_ready_;         // u8 [parameters] on their device: 1 once momentum_[i] holds a step
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // PyTorch's AdamW default; 0 makes it Adam
  HalfParamOptions half{};
};
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions o = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions o = {});
  const AdamWOptions& options() const { return o_; }
  std::string name() const override { return "AdamW"; }
  std::unique_ptr<Optimizer> make_like(std::vector<ParamGroup> groups) const override;
  double eps() const override { return o_.eps; }

 protected:
  void update(const Tensor& found_inf, const Tensor& scale) override;
  StateDict named_state(size_t i) const override;
  void check_named_state(size_t i, const std::string& key) const override;
  void set_named_state(size_t i, const std::string& key, const Tensor& t) override;
  void clear_named_state() override;

 private:
  AdamWOptions o_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace mixprec::optim
