// Module bookkeeping (names, state_dict, train/eval) and the basic layers.
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "mixprec/autograd.h"
#include "mixprec/convert.h"
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

// A tensor registered under several names (tied weights) is listed once, under its first name:
// PyTorch's remove_duplicate, so an optimizer steps it once and counts see it once.
static NamedTensors first_names(const NamedTensors& all) {
  std::set<const detail::TensorImpl*> seen;
  NamedTensors out;
  for (const auto& [n, t] : all)
    if (seen.insert(t.impl()).second) out.emplace_back(n, t);
  return out;
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect(*this, "", false, out, params_);
  return first_names(out);
}
NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect(*this, "", true, out, buffers_);
  return first_names(out);
}
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}
StateDict Module::state_dict() const {
  // PyTorch orders a module's own parameters, then own buffers, then each child's; keep that.
  StateDict out;
  for (const auto& [n, t] : params_) out.emplace_back(n, t);
  for (const auto& [n, t] : buffers_) out.emplace_back(n, t);
  for (const auto& [cn, c] : children_)
    for (const auto& [n, t] : c->state_dict()) out.emplace_back(cn + "." + n, t);
  return out;
}

void Module::load_state_dict(const StateDict& sd) {
  // Check every key, shape and dtype before copying anything: a bad state dict leaves the model as it was.
  std::map<std::string, Tensor> mine;
  for (const auto& [name, t] : state_dict()) mine.emplace(name, t);
  std::set<std::string> seen;
  for (const auto& [name, t] : sd) {
    const auto it = mine.find(name);
    MIXPREC_CHECK(it != mine.end(), "Module.load_state_dict: unexpected key '", name, "'");
    MIXPREC_CHECK(seen.insert(name).second, "Module.load_state_dict: key '", name, "' appears twice");
    const Tensor& want = it->second;
    // A floating value converts into a floating tensor of another width (PyTorch's copy_).
    const DType dtype = t.defined() && is_floating(t.dtype()) && is_floating(want.dtype()) ? t.dtype() : want.dtype();
    check_state("Module", name, t, dtype, want.shape());
  }
  for (const auto& entry : mine)
    MIXPREC_CHECK(seen.count(entry.first), "Module.load_state_dict: missing key '", entry.first, "'");
  for (const auto& [name, t] : sd) mine.at(name).copy_(t);
}

void Module::set_parameter(const std::string& name, const Tensor& t) {
  MIXPREC_CHECK(t.defined(), "Module.set_parameter: the tensor for '", name, "' is undefined");
  const size_t dot = name.find('.');
  if (dot != std::string::npos) {
    const std::string child = name.substr(0, dot);
    for (auto& [cn, c] : children_)
      if (cn == child) return c->set_parameter(name.substr(dot + 1), t);
    throw Error(detail::concat("Module.set_parameter: no submodule '", child, "' in ", this->name()));
  }
  for (auto& [n, p] : params_) {
    if (n != name) continue;
    MIXPREC_CHECK(p.shape() == t.shape(), "Module.set_parameter: '", name, "' is ", shape_str(p.shape()),
                  ", the new tensor ", shape_str(t.shape()));
    p = t;
    bind_parameter(name, t);
    return;
  }
  throw Error(detail::concat("Module.set_parameter: ", this->name(), " has no parameter '", name, "'"));
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

// The in-place conversion of Module::to: the impl keeps its identity (so Linear::weight, the
// optimizer and any other handle see the new dtype or device) and gets a fresh contiguous storage
// of the same memory category. A tied tensor is met once per name: the second meeting finds it
// converted already and returns.
static void replace_in_place(const Tensor& t, DType dtype, const Device& device) {
  detail::TensorImpl* impl = t.impl();
  if (impl->dtype == dtype && t.device() == device) return;
  const MemoryScope scope(impl->storage->category());
  const autograd::NoGradGuard no_grad;
  const Tensor moved = t.detach().to(dtype).to(device).contiguous();
  impl->storage = moved.storage();
  impl->dtype = dtype;
  impl->strides = contiguous_strides(impl->shape);
  impl->offset = moved.offset();
  impl->grad.reset();    // the new storage has a new version: caches keyed on the old one miss
  impl->shadow.reset();  // cast-ahead's 16-bit copy of the old storage (autocast_state.h) goes with it
}

void Module::to(DType dtype, const std::function<bool(const Module&)>& select) {
  MIXPREC_CHECK(is_floating(dtype), "Module::to: ", dtype_name(dtype), " is not a floating dtype");
  if (!select || select(*this)) {
    for (auto& [n, t] : params_)
      if (is_floating(t.dtype())) replace_in_place(t, dtype, t.device());
    for (auto& [n, t] : buffers_)
      if (is_floating(t.dtype())) replace_in_place(t, dtype, t.device());
  }
  for (auto& [n, c] : children_) c->to(dtype, select);
}

void Module::to(const Device& device) {
  cuda::require(device);
  for (auto& [n, t] : params_) replace_in_place(t, t.dtype(), device);
  for (auto& [n, t] : buffers_) replace_in_place(t, t.dtype(), device);
  for (auto& [n, c] : children_) c->to(device);
}

bool Module::is_normalization() const {
  const std::string n = name();
  for (const char* prefix : {"BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm", "LocalResponseNorm"})
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
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
void Linear::bind_parameter(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }
Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }
Tensor Linear::forward_relu(const Tensor& x) { return ops::linear_relu(x, weight, bias); }
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

void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(children().size()), std::move(m));
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  const auto& ch = children();
  const auto relu_at = [&](size_t i) { return i < ch.size() && dynamic_cast<ReLU*>(ch[i].second.get()); };
  const auto max_pool_at = [&](size_t i) { return i < ch.size() && dynamic_cast<MaxPool2d*>(ch[i].second.get()); };
  for (size_t i = 0; i < ch.size(); ++i) {
    // Conv2d then MaxPool2d, with a ReLU between them, after them or neither, run as one op: the
    // pool reads the convolution's output where oneDNN wrote it, in its own layout, instead of that
    // output being reordered into NCHW first, and the ReLU rides on the convolution
    // (ops::conv2d_max_pool2d; the ReLU commutes with the pool, as below).
    if (auto* conv = dynamic_cast<Conv2d*>(ch[i].second.get())) {
      const bool relu_before = relu_at(i + 1);
      const size_t pool_i = relu_before ? i + 2 : i + 1;
      if (max_pool_at(pool_i)) {
        const bool relu = relu_before || relu_at(pool_i + 1);
        h = conv->forward_max_pool(h, static_cast<const MaxPool2d&>(*ch[pool_i].second), relu);
        i = relu && !relu_before ? pool_i + 1 : pool_i;
        continue;
      }
    }
    // ReLU then MaxPool2d run as MaxPool2d then ReLU: the same values and gradients bit for bit (a
    // ReLU is monotonic and maps every value <= 0 to +0, so it commutes with a window's max, and a
    // window whose max is <= 0 passes no gradient either way), with the ReLU and its mask on the
    // pooled tensor (a quarter of the elements after a 2x2 pool), and the full-size activation
    // before the pool no longer kept for the backward (the pool keeps its argmax instead, one byte
    // per output). A Conv2d or Linear before the ReLU then runs without its fused ReLU.
    if (relu_at(i) && max_pool_at(i + 1)) {
      h = ch[i].second->forward(ch[i + 1].second->forward(h));
      ++i;
      continue;
    }
    // Conv2d or Linear then ReLU run as one oneDNN primitive with a ReLU post-op: the same
    // values and gradients, one pass over the activation fewer (src/ops/conv.cpp, matmul.cpp).
    const bool relu_next = relu_at(i + 1) && !max_pool_at(i + 2);
    if (relu_next) {
      if (auto* conv = dynamic_cast<Conv2d*>(ch[i].second.get())) {
        h = conv->forward_relu(h);
        ++i;
        continue;
      }
      if (auto* lin = dynamic_cast<Linear*>(ch[i].second.get())) {
        h = lin->forward_relu(h);
        ++i;
        continue;
      }
    }
    h = ch[i].second->forward(h);
  }
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
