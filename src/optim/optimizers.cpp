// SGD and AdamW: the parameters, groups and state of PyTorch's optimizers; each step is one
// fused kernel over every parameter (kernels/optim.h) that reads the step count, the learning
// rates, and GradScaler's found_inf and scale from tensors on the parameters' device, so a step
// never waits for the host and is skipped on the device.
#include <algorithm>
#include <cmath>
#include <optional>

#include "autocast/autocast_state.h"
#include "kernels/optim.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/optim.h"

namespace mixprec::optim {
namespace {

Tensor zeros_state(const Tensor& p) {
  MemoryScope scope(MemCategory::optimizer_state);
  return Tensor::zeros(p.shape(), p.dtype() == DType::f64 ? DType::f64 : DType::f32, p.device());
}

// The gradient of p as the update reads it: contiguous, in p's dtype or f32 (an unscaled f16
// gradient), f64 for f64.
Tensor checked_grad(const Tensor& p, size_t i) {
  Tensor g = p.grad();
  MIXPREC_CHECK(g.shape() == p.shape(), "optimizer: gradient of parameter ", i, " has shape ", shape_str(g.shape()),
                ", the parameter ", shape_str(p.shape()));
  const bool ok =
      p.dtype() == DType::f64 ? g.dtype() == DType::f64 : (g.dtype() == p.dtype() || g.dtype() == DType::f32);
  MIXPREC_CHECK(ok, "optimizer: gradient of parameter ", i, " is ", dtype_name(g.dtype()), " for a ",
                dtype_name(p.dtype()), " parameter");
  return g.is_contiguous() && g.offset() == 0 ? g : g.clone();
}

}  // namespace

namespace {

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> g(1);
  g[0].params = std::move(params);
  return g;
}

void check_lr(double lr) {
  MIXPREC_CHECK(lr >= 0 && std::isfinite(lr), "learning rate must be a finite number >= 0, got ", lr);
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay, HalfParamOptions half)
    : half_(half) {
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroupState st{{}, groups[g].options.lr.value_or(lr), groups[g].options.weight_decay.value_or(weight_decay)};
    check_lr(st.lr);
    MIXPREC_CHECK(st.weight_decay >= 0, "optimizer: weight_decay of parameter group ", g, " must be >= 0, got ",
                  st.weight_decay);
    for (Tensor& p : groups[g].params) {
      for (size_t j = 0; j < params_.size(); ++j)
        MIXPREC_CHECK(!params_[j].same(p), "optimizer: parameter ", params_.size(), " (in group ", g,
                      ") is also parameter ", j, ": a parameter may appear in one group only");
      st.params.push_back(params_.size());
      group_of_.push_back(g);
      params_.push_back(std::move(p));
    }
    groups_.push_back(std::move(st));
  }
  MIXPREC_CHECK(!params_.empty(), "optimizer got an empty parameter list");
  master_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MIXPREC_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "optimizer parameter ", i,
                  " must be a leaf tensor that requires grad");
    MIXPREC_CHECK(is_floating(p.dtype()), "optimizer parameter ", i, " is ", dtype_name(p.dtype()),
                  ": SGD/AdamW update f64, f32, bf16 or f16 parameters");
    MIXPREC_CHECK(p.is_contiguous() && p.offset() == 0, "optimizer parameter ", i, " ", shape_str(p.shape()),
                  " must be contiguous");
    if (is_half(p.dtype()) && half.master_weights) {
      MemoryScope scope(MemCategory::optimizer_state);
      master_[i] = p.detach().to(DType::f32);  // exact, on p's device
    }
  }
  // Made on the host, then moved where the parameters are (and again if they move later).
  step_ = Tensor::from_vector(std::vector<int64_t>{0}, {}, Device::cpu());
  rounding_ = Tensor::zeros({2}, DType::i64, Device::cpu());
  for (const ParamGroupState& g : groups_) lr_.push_back(Tensor::scalar(g.lr, DType::f64, Device::cpu()));
  to_params_device();
}

void Optimizer::to_params_device() {
  const Device d = params_[0].device();
  if (step_.device() == d) return;
  step_ = step_.to(d);
  rounding_ = rounding_.to(d);
  for (Tensor& t : lr_) t = t.to(d);
  moved_to(d);
}

int64_t Optimizer::steps() const { return state_to_i64(step_); }

void Optimizer::set_lr(size_t group, double lr) {
  MIXPREC_CHECK(group < groups_.size(), name(), ".set_lr: no parameter group ", group, " (", groups_.size(),
                " groups)");
  check_lr(lr);
  groups_[group].lr = lr;
  lr_[group].fill_(lr);  // in place: a captured step keeps reading the same tensor
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      p.grad().zero_();
  }
}

void Optimizer::step_scaled(const Tensor& found_inf, const Tensor& scale) {
  MIXPREC_CHECK(!handed_over_, name(),
                ".step: this optimizer handed its state to a ZeRO-1 shard optimizer; step through "
                "dist::DataParallel::step (or its optimizer())");
  to_params_device();
  update(found_inf, scale);
}

void Optimizer::hand_over_to_shard() {
  for (Tensor& m : master_) m = Tensor();
  clear_named_state();
  handed_over_ = true;
}

std::vector<kernels::OptimParam> Optimizer::with_grads(const std::function<void(size_t, kernels::OptimParam&)>& state) {
  std::vector<kernels::OptimParam> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    kernels::OptimParam op{
        p, checked_grad(p, i), master_[i], {}, {}, lr_[group_of_[i]], groups_[group_of_[i]].weight_decay, uint64_t(i)};
    // Cast-ahead (autocast_state.h): an f32 parameter whose autocast copy holds its values is
    // stepped as that copy's master, the kernels' path for a 16-bit parameter with an f32 master:
    // the update writes the f32 weights and their 16-bit copy in one pass, so the next forward
    // casts nothing. Not while rounding is tracked (it counts 16-bit parameters' rounding).
    const Tensor shadow =
        !master_[i].defined() && !track_ && p.dtype() == DType::f32 ? amp::ahead::current_shadow(p) : Tensor();
    if (shadow.defined()) {
      op.param = shadow;
      op.master = p;
    }
    p.bump_version();  // an in-place write: caches keyed by version (reordered conv weights) must see it
    if (shadow.defined()) {
      shadow.bump_version();
      amp::ahead::shadow_written(p);
    }
    state(i, op);
    out.push_back(std::move(op));
  }
  return out;
}

kernels::OptimStep Optimizer::step_args(const Tensor& found_inf, const Tensor& scale) const {
  return {step_, found_inf, scale, half_.stochastic_rounding, half_.seed, track_ ? rounding_ : Tensor()};
}

Optimizer::RoundingStats Optimizer::take_rounding_stats() {
  const std::vector<int64_t> r = rounding_.to_vector_i64();  // a copy to the host: asked for
  rounding_.fill_(0);
  return {r[0], r[1]};
}

StateDict Optimizer::state_dict() const {
  MIXPREC_CHECK(!handed_over_, name(),
                ".state_dict: the state is sharded across ranks (ZeRO-1): each rank's shard optimizer holds "
                "its part (dist::DataParallel::optimizer())");
  StateDict sd;
  sd.emplace_back("step", state_i64(steps()));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    const ParamGroupState& pg = groups_[g];
    sd.emplace_back(prefix + "lr", Tensor::scalar(pg.lr, DType::f64));
    sd.emplace_back(prefix + "weight_decay", Tensor::scalar(pg.weight_decay, DType::f64));
    std::vector<int64_t> idx(pg.params.begin(), pg.params.end());
    sd.emplace_back(prefix + "params", Tensor::from_vector(idx, {int64_t(idx.size())}));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (master_[i].defined()) sd.emplace_back(prefix + "master", master_[i]);
    for (auto& [k, t] : named_state(i)) sd.emplace_back(prefix + k, t);
  }
  return sd;
}

namespace {

// "<prefix><n>.<rest>" with n < count: n and rest; nullopt for any other key.
std::optional<std::pair<size_t, std::string>> indexed_key(const std::string& key, const std::string& prefix,
                                                          size_t count) {
  if (key.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return std::nullopt;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return std::nullopt;
  const size_t n = size_t(std::stoul(digits));
  if (n >= count) return std::nullopt;
  return std::make_pair(n, key.substr(dot + 1));
}

}  // namespace

void Optimizer::load_state_dict(const StateDict& sd) {
  // Check every entry first: a bad state dict leaves the optimizer as it was.
  const std::string who = name();
  for (const auto& [key, t] : sd) {
    if (key == "step") {
      check_state(who, key, t, DType::i64, {});
    } else if (auto g = indexed_key(key, "param_groups.", groups_.size())) {
      const ParamGroupState& pg = groups_[g->first];
      if (g->second == "lr" || g->second == "weight_decay") {
        check_state(who, key, t, DType::f64, {});
        const double v = t.item();
        MIXPREC_CHECK(v >= 0 && std::isfinite(v), who, ".load_state_dict: '", key, "' is ", v,
                      ", expected a finite number >= 0");
      } else {
        MIXPREC_CHECK(g->second == "params", who, ".load_state_dict: unexpected key '", key, "'");
        check_state(who, key, t, DType::i64, {int64_t(pg.params.size())});
        const std::vector<int64_t> idx = t.to_vector_i64();
        MIXPREC_CHECK(std::equal(idx.begin(), idx.end(), pg.params.begin(),
                                 [](int64_t a, size_t b) { return a >= 0 && size_t(a) == b; }),
                      who, ".load_state_dict: '", key, "' lists other parameters than this optimizer's group ",
                      g->first);
      }
    } else if (auto s = indexed_key(key, "state.", params_.size())) {
      const size_t i = s->first;
      const Tensor& p = params_[i];
      check_state(who, key, t, p.dtype() == DType::f64 ? DType::f64 : DType::f32, p.shape());
      if (s->second == "master")
        MIXPREC_CHECK(master_[i].defined(), who, ".load_state_dict: '", key, "' but parameter ", i,
                      " keeps no master copy");
      else
        check_named_state(i, s->second);
    } else {
      MIXPREC_CHECK(false, who, ".load_state_dict: unexpected key '", key, "' (", groups_.size(), " groups, ",
                    params_.size(), " parameters)");
    }
  }
  MIXPREC_CHECK(find_state(sd, "step"), who, ".load_state_dict: missing key 'step'");
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const char* k : {"lr", "weight_decay", "params"}) {
      const std::string key = "param_groups." + std::to_string(g) + "." + k;
      MIXPREC_CHECK(find_state(sd, key), who, ".load_state_dict: missing key '", key, "'");
    }
  for (const auto& [key, t] : sd) {
    if (key == "step") {
      step_ = t.detach().to(step_.device()).clone();
    } else if (auto g = indexed_key(key, "param_groups.", groups_.size())) {
      if (g->second == "lr") set_lr(g->first, t.item());
      if (g->second == "weight_decay") groups_[g->first].weight_decay = t.item();
    } else if (auto s = indexed_key(key, "state.", params_.size())) {
      MemoryScope scope(MemCategory::optimizer_state);
      Tensor copy = t.detach().to(params_[s->first].device()).clone();
      if (s->second == "master")
        master_[s->first].copy_(copy);
      else
        set_named_state(s->first, s->second, copy);
    }
  }
}

// ---------------------------------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : SGD(one_group(std::move(params)), o) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(std::move(groups), o.lr, o.weight_decay, o.half), o_(o) {
  MIXPREC_CHECK(o.momentum >= 0, "SGD: momentum must be >= 0, got ", o.momentum);
  MIXPREC_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got ", o.weight_decay);
  MIXPREC_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                "SGD: nesterov needs momentum > 0 and dampening 0");
  momentum_.resize(params_.size());
  momentum_ready_ = Tensor::zeros({int64_t(params_.size())}, DType::u8, params_[0].device());
}

std::unique_ptr<Optimizer> SGD::make_like(std::vector<ParamGroup> groups) const {
  return std::make_unique<SGD>(std::move(groups), o_);
}

void SGD::update(const Tensor& found_inf, const Tensor& scale) {
  const std::vector<kernels::OptimParam> ps = with_grads([&](size_t i, kernels::OptimParam& op) {
    if (o_.momentum == 0) return;
    if (!momentum_[i].defined()) momentum_[i] = zeros_state(params_[i]);
    op.state1 = momentum_[i];
  });
  kernels::sgd_step(ps, {o_.momentum, o_.dampening, o_.nesterov, momentum_ready_}, step_args(found_inf, scale));
}

void SGD::moved_to(const Device& d) { momentum_ready_ = momentum_ready_.to(d); }

StateDict SGD::named_state(size_t i) const {
  // A buffer allocated for a step that was then skipped holds no step yet (read when saving).
  if (!momentum_[i].defined() || momentum_ready_.slice(0, int64_t(i), int64_t(i) + 1).item() == 0) return {};
  return {{"momentum_buffer", momentum_[i]}};
}

void SGD::check_named_state(size_t i, const std::string& key) const {
  MIXPREC_CHECK(key == "momentum_buffer", "SGD.load_state_dict: unexpected key 'state.", i, ".", key, "'");
  MIXPREC_CHECK(o_.momentum != 0, "SGD.load_state_dict: 'state.", i,
                ".momentum_buffer' for an optimizer without momentum");
}

void SGD::set_named_state(size_t i, const std::string& key, const Tensor& t) {
  momentum_[i] = t;
  momentum_ready_.slice(0, int64_t(i), int64_t(i) + 1).fill_(1);
}

void SGD::clear_named_state() {
  for (Tensor& m : momentum_) m = Tensor();
  momentum_ready_.fill_(0);
}

// -------------------------------------------------------------------------------------- AdamW

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : AdamW(one_group(std::move(params)), o) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o)
    : Optimizer(std::move(groups), o.lr, o.weight_decay, o.half), o_(o) {
  MIXPREC_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got (",
                o.beta1, ", ", o.beta2, ")");
  MIXPREC_CHECK(o.eps >= 0, "AdamW: eps must be >= 0, got ", o.eps);
  MIXPREC_CHECK(o.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", o.weight_decay);
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
}

std::unique_ptr<Optimizer> AdamW::make_like(std::vector<ParamGroup> groups) const {
  return std::make_unique<AdamW>(std::move(groups), o_);
}

void AdamW::update(const Tensor& found_inf, const Tensor& scale) {
  const std::vector<kernels::OptimParam> ps = with_grads([&](size_t i, kernels::OptimParam& op) {
    // Each on its own: a loaded state dict may hold one moment without the other.
    if (!exp_avg_[i].defined()) exp_avg_[i] = zeros_state(params_[i]);
    if (!exp_avg_sq_[i].defined()) exp_avg_sq_[i] = zeros_state(params_[i]);
    op.state1 = exp_avg_[i];
    op.state2 = exp_avg_sq_[i];
  });
  kernels::adamw_step(ps, {o_.beta1, o_.beta2, o_.eps}, step_args(found_inf, scale));
}

StateDict AdamW::named_state(size_t i) const {
  StateDict out;
  if (exp_avg_[i].defined()) out.emplace_back("exp_avg", exp_avg_[i]);
  if (exp_avg_sq_[i].defined()) out.emplace_back("exp_avg_sq", exp_avg_sq_[i]);
  return out;
}

void AdamW::check_named_state(size_t i, const std::string& key) const {
  MIXPREC_CHECK(key == "exp_avg" || key == "exp_avg_sq", "AdamW.load_state_dict: unexpected key 'state.", i, ".", key,
                "'");
}

void AdamW::set_named_state(size_t i, const std::string& key, const Tensor& t) {
  (key == "exp_avg" ? exp_avg_ : exp_avg_sq_)[i] = t;
}

void AdamW::clear_named_state() {
  for (Tensor& m : exp_avg_) m = Tensor();
  for (Tensor& m : exp_avg_sq_) m = Tensor();
}

}  // namespace mixprec::optim
