// Autograd: graph nodes holding a backward lambda beside their saved tensors, an iterative
// (never recursive) backward engine, and the no-grad guard.
#pragma once
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::autograd {

struct InputMeta {
  Shape shape;
  DType dtype;
};

// One node per recorded op output. backward() maps the gradient of the output to one gradient
// per input (an undefined Tensor where that input needs none).
struct Node {
  virtual ~Node() = default;
  std::string_view name;
  std::vector<std::shared_ptr<Node>> next;  // per input: its grad_fn / accumulator, or null
  std::vector<InputMeta> inputs;
  bool needs_grad(size_t i) const { return i < next.size() && next[i] != nullptr; }
  virtual std::vector<Tensor> apply(const Tensor& grad_out) = 0;
  virtual void release() {}  // drop saved tensors once run
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out, const Node& node)>;

// A tensor an op's backward reads, and the version of its bytes when the op ran. Backward
// refuses bytes written in place since (PyTorch's "modified by an inplace operation" error)
// rather than compute a wrong gradient from them.
struct SavedVersion {
  std::shared_ptr<Storage> storage;
  uint64_t version = 0;
  Shape shape;
  DType dtype = DType::f32;
};

struct FunctionNode final : Node {
  BackwardFn fn;
  std::vector<SavedVersion> saved;
  std::vector<Tensor> apply(const Tensor& grad_out) override;
  void release() override {
    fn = nullptr;
    saved.clear();
  }
};

// Sink for a leaf that requires grad: adds into leaf.grad (allocated as MemCategory::gradients).
struct AccumulateGrad final : Node {
  std::weak_ptr<TensorImpl> leaf;
  std::vector<Tensor> apply(const Tensor& grad_out) override;
};

bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {  // re-enables grad inside a NoGradGuard (used by tests)
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// Record `out` as produced by an op over `inputs` when grad mode is on and any input requires
// grad. The lambda must not capture `out` itself with its grad_fn (that would be a cycle): capture
// out.detach() if the backward needs the result. `saved` lists the tensors the lambda captured
// that a user could write in place (inputs, the output, views of them; not buffers private to
// the op): backward checks that their bytes are unchanged.
Tensor record(Tensor out, std::string_view name, std::initializer_list<Tensor> inputs, BackwardFn fn,
              std::initializer_list<Tensor> saved = {});
Tensor record(Tensor out, std::string_view name, const std::vector<Tensor>& inputs, BackwardFn fn,
              std::initializer_list<Tensor> saved = {});
bool any_requires_grad(std::initializer_list<Tensor> inputs);

// Run backward from roots with the given output gradients.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

// Anomaly mode: every op output is checked for NaN/inf and the producing op is named.
bool anomaly_enabled();
void set_anomaly_enabled(bool on);

}  // namespace mixprec::autograd
