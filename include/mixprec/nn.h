// Modules with PyTorch's parameter names and default initialisation: Linear, Embedding, activations,
// Dropout, Flatten, Sequential. Parameters are allocated as MemCategory::parameters.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixprec/ops.h"
#include "mixprec/state_dict.h"
#include "mixprec/tensor.h"

namespace mixprec::nn {

using NamedTensors = StateDict;  // named_parameters() and named_buffers() are name -> tensor lists too

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string name() const = 0;

  NamedTensors named_parameters() const;  // "0.weight", "fc1.bias", ... (recursive)
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;  // running statistics etc.
  StateDict state_dict() const;        // parameters then buffers, PyTorch order
  // Copies values into this module's tensors; every key must match in name and shape, and no
  // key may be missing or extra (strict, as PyTorch's default). Dtypes must match too, except
  // that a floating value loads into a floating tensor of another width, converted as
  // PyTorch's copy_ does (an f32 checkpoint into a bf16 model). Throws one line naming the
  // first bad key, before changing anything.
  void load_state_dict(const StateDict& sd);
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  int64_t num_parameters() const;

  // Converts in place, keeping every handle valid (the tensor itself gets new storage and dtype),
  // the floating parameters and buffers of this module and its descendants for which
  // `select(module)` is true (every module when no predicate). Gradients are dropped. Used by
  // the half/pure precision presets, which keep normalization layers in f32.
  void to(DType dtype, const std::function<bool(const Module&)>& select = nullptr);
  // Moves every parameter and buffer of this module and its descendants to `device`, in place as
  // above (PyTorch's module.to(device)): build the model, initialise it on the CPU, then move it.
  // Gradients are dropped. Throws one line when the device is not there.
  void to(const Device& device);
  // Weight tying, PyTorch's `model.lm_head.weight = model.transformer.wte.weight`: makes the
  // parameter registered as `name` (dotted for a descendant's: "lm_head.weight") the tensor t, in
  // the same place of the order; shapes must agree. The same tensor may then sit under two names:
  // named_parameters()/parameters()/num_parameters() count it once, under its first name
  // (PyTorch's remove_duplicate), state_dict() lists both names (as PyTorch's), load_state_dict
  // wants both and loads each, and to() converts it once. Calls bind_parameter on the module that
  // owns the name, so a layer's member handle (Linear::weight) follows.
  void set_parameter(const std::string& name, const Tensor& t);
  // True for normalization layers (BatchNorm*, LayerNorm, GroupNorm, ...), which 16-bit presets
  // keep in f32; by default decided from name().
  virtual bool is_normalization() const;

 protected:
  // set_parameter's hook: a layer that keeps a member handle of its own parameter `name` points
  // it at t (the layers below that hold parameters override it).
  virtual void bind_parameter(const std::string& name, const Tensor& t) { (void)name, (void)t; }
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  void register_module(const std::string& name, std::shared_ptr<Module> m);

 private:
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

struct LinearOptions {
  bool bias = true;
};
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions o = {});
  Tensor forward(const Tensor& x) override;
  Tensor forward_relu(const Tensor& x);  // relu(forward(x)) in one matmul (Sequential uses it)
  std::string name() const override;
  Tensor weight, bias;  // weight [out, in] as PyTorch stores it
  int64_t in_features, out_features;

 protected:
  void bind_parameter(const std::string& name, const Tensor& t) override;
};

// weight [num_embeddings, embedding_dim], PyTorch's init N(0, 1); forward(indices i64 of any shape)
// = ops::embedding(weight, indices), shape [..., embedding_dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override { return ops::embedding(weight, indices); }
  std::string name() const override;  // "Embedding(65, 128)", PyTorch's repr
  Tensor weight;
  int64_t num_embeddings, embedding_dim;

 protected:
  void bind_parameter(const std::string& name, const Tensor& t) override;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::relu(x); }
  std::string name() const override { return "ReLU()"; }
};

class GELU : public Module {
 public:
  explicit GELU(bool tanh_approx = false) : tanh_(tanh_approx) {}
  Tensor forward(const Tensor& x) override { return ops::gelu(x, tanh_); }
  std::string name() const override { return tanh_ ? "GELU(approximate='tanh')" : "GELU()"; }

 private:
  bool tanh_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::silu(x); }
  std::string name() const override { return "SiLU()"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::sigmoid(x); }
  std::string name() const override { return "Sigmoid()"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return ops::tanh(x); }
  std::string name() const override { return "Tanh()"; }
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override { return ops::dropout(x, p_, is_training()); }
  std::string name() const override;

 private:
  double p_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : start_dim_(start_dim) {}
  Tensor forward(const Tensor& x) override { return ops::flatten(x, start_dim_); }
  std::string name() const override { return "Flatten()"; }

 private:
  int64_t start_dim_;
};

// Children named "0", "1", ... as torch.nn.Sequential names them.
class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... Ms>
  explicit Sequential(Ms&&... ms) {
    (push_back(std::make_shared<std::decay_t<Ms>>(std::forward<Ms>(ms))), ...);
  }
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return children().size(); }
  Module& operator[](size_t i) const { return *children()[i].second; }
};

// Multi-line summary, like printing a torch module.
std::string describe(const Module& m);

}  // namespace mixprec::nn

// ---- convolution, pooling and normalisation layers (src/nn/conv.cpp, src/nn/norm.cpp) ----
namespace mixprec::nn {

struct Conv2dOptions {
  ops::IntPair stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  // The output channels-last (ops::Conv2dOptions::channels_last): set on a model's convolutions,
  // its activations stay NHWC through the pools and activations up to the first op that needs
  // NCHW (a Flatten copies).
  bool channels_last = false;
};
// weight [out, in/groups, kH, kW] and bias [out], PyTorch's default init: U(-1/sqrt(fan_in), +)
// with fan_in = in/groups * kH * kW. Shape errors name the layer.
class MaxPool2d;

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, ops::IntPair kernel_size, Conv2dOptions o = {});
  Tensor forward(const Tensor& x) override;
  // The convolution followed by ReLU in one oneDNN primitive (a container calls this instead of
  // forward() then ReLU when it sees the pair; same result and gradients).
  Tensor forward_relu(const Tensor& x);
  // The convolution followed by `pool` in one op, with a ReLU before or after the pool where
  // `relu` (ops::conv2d_max_pool2d: a container calls this when it sees the layers; same result and
  // gradients). An error names the layer it is about.
  Tensor forward_max_pool(const Tensor& x, const MaxPool2d& pool, bool relu = false);
  std::string name() const override;
  Tensor weight, bias;
  int64_t in_channels, out_channels;
  ops::IntPair kernel_size;
  Conv2dOptions options;

 protected:
  void bind_parameter(const std::string& name, const Tensor& t) override;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(ops::IntPair kernel_size, ops::Pool2dOptions o = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  ops::IntPair kernel_size() const { return kernel_size_; }
  const ops::Pool2dOptions& options() const { return o_; }

 private:
  ops::IntPair kernel_size_;
  ops::Pool2dOptions o_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(ops::IntPair kernel_size, ops::Pool2dOptions o = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override;

 private:
  ops::IntPair kernel_size_;
  ops::Pool2dOptions o_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(ops::IntPair output_size) : output_size_(output_size) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override;

 private:
  ops::IntPair output_size_;
};

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative average over num_batches_tracked
  bool affine = true;
  bool track_running_stats = true;
};
// Parameters weight (ones), bias (zeros); buffers running_mean (zeros), running_var (ones),
// num_batches_tracked (i64 scalar), named and ordered as PyTorch's state_dict. Training mode
// normalises with batch statistics and updates the running ones; eval mode uses the running ones.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions o = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  int64_t num_features;
  BatchNormOptions options;

 protected:
  void bind_parameter(const std::string& name, const Tensor& t) override;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
};
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions o = {});
  Tensor forward(const Tensor& x) override;
  // The output rounded once to out_dtype in the norm's own pass (ops::layer_norm's out_dtype).
  Tensor forward(const Tensor& x, std::optional<DType> out_dtype);
  std::string name() const override;
  Tensor weight, bias;
  Shape normalized_shape;
  LayerNormOptions options;

 protected:
  void bind_parameter(const std::string& name, const Tensor& t) override;
};

}  // namespace mixprec::nn
