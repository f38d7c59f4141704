// Module bookkeeping (names, state_dict, train/eval) and the basic layers.
#include <cmath>
#include <set>
#include <sstream>

#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"

namespace mixprec::nn {

static void collect(const Module& m, const std::string& prefix, bool buffers, NamedTensors& out,
                    const NamedTensors& own) {
  for (const auto& [n, t] : own) out.emplace_back(prefix + n, t);
  for (const auto& [cn, c] : m.children()) {
    const NamedTensors sub = buffers ? c->named_buffers() : c->named_parameters();
    for (const auto& [n, t] : sub) out.emplace_back(prefix + cn + "." + n, t);
  }
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect(*this, "", false, out, params_);
  return out;
}
NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect(*this, "", true, out, buffers_);
  return out;
}
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}
NamedTensors Module::state_dict() const {
  // PyTorch orders a module's own parameters, then own buffers, then each child's; keep that.
  NamedTensors out;
  for (const auto& [n, t] : params_) out.emplace_back(n, t);
  for (const auto& [n, t] : buffers_) out.emplace_back(n, t);
  for (const auto& [cn, c] : children_)
    for (const auto& [n, t] : c->state_dict()) out.emplace_back(cn + "." + n, t);
  return out;
}

void Module::load_state_dict(const NamedTensors& sd) {
  const NamedTensors mine = state_dict();
  std::set<std::string> seen;
  for (const auto& [n, t] : sd) {
    auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& p) { return p.first == n; });
    MIXPREC_CHECK(it != mine.end(), "load_state_dict: unexpected key '", n, "'");
    MIXPREC_CHECK(it->second.shape() == t.shape(), "load_state_dict: '", n, "' has shape ", shape_str(t.shape()),
                  ", the model expects ", shape_str(it->second.shape()));
    seen.insert(n);
  }
  for (const auto& [n, t] : mine) MIXPREC_CHECK(seen.count(n), "load_state_dict: missing key '", n, "'");
  for (const auto& [n, t] : sd) {
    auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& p) { return p.first == n; });
    Tensor dst = it->second;
    dst.copy_(t);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}
Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return t;
}
void Module::register_module(const std::string& name, std::shared_ptr<Module> m) {
  children_.emplace_back(name, std::move(m));
}

Linear::Linear(int64_t in, int64_t out, LinearOptions o) : in_features(in), out_features(out) {
  MIXPREC_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): features must be positive");
  MemoryScope scope(MemCategory::parameters);
  // PyTorch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); bias the same bound.
  const double bound = 1.0 / std::sqrt(double(in));
  weight = register_parameter("weight", Tensor::uniform({out, in}, default_generator(), -bound, bound));
  if (o.bias) bias = register_parameter("bias", Tensor::uniform({out}, default_generator(), -bound, bound));
}
Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }
std::string Linear::name() const {
  std::ostringstream os;
  os << "Linear(in_features=" << in_features << ", out_features=" << out_features
     << ", bias=" << (bias.defined() ? "True" : "False") << ")";
  return os.str();
}

Dropout::Dropout(double p) : p_(p) { MIXPREC_CHECK(p >= 0 && p < 1, "Dropout(p=", p, "): p must be in [0, 1)"); }
std::string Dropout::name() const {
  std::ostringstream os;
  os << "Dropout(p=" << p_ << ")";
  return os.str();
}

void Sequential::push_back(std::shared_ptr<Module> m) { register_module(std::to_string(children().size()), std::move(m)); }
Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [n, c] : children()) h = c->forward(h);
  return h;
}

std::string describe(const Module& m) {
  std::ostringstream os;
  os << m.name();
  if (!m.children().empty()) {
    os << "(\n";
    for (const auto& [n, c] : m.children()) os << "  (" << n << "): " << c->name() << "\n";
    os << ")";
  }
  return os.str();
}

}  // namespace mixprec::nn
