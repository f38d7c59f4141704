// Autograd: the graph node interface, recording an op's backward lambda, the iterative (never
// recursive) backward engine, and the grad-mode guards. The engine's own node types (an op's
// node, a leaf's gradient sink) are internal.
#pragma once
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
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
  // True once a backward pass has run through this node and released what it saved: a tensor
  // whose grad_fn is consumed can no longer pass a gradient to its inputs.
  virtual bool is_consumed() const { return false; }
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out, const Node& node)>;

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
class EnableGradGuard {  // re-enables grad inside a NoGradGuard (PyTorch's torch.enable_grad)
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
// True on this thread while backward() runs: ops then compute in the dtypes the forward chose
// (autocast does not apply to them).
bool in_backward();

// PyTorch's register_post_accumulate_grad_hook: after a backward pass has accumulated a
// gradient into leaf.grad(), hook(leaf) runs (once per pass, on the thread running backward, in
// the order the pass reaches the leaves: roughly the reverse of the forward's use). Data
// parallelism starts a gradient's all-reduce there while backward goes on. Returns an id for
// remove_post_accumulate_grad_hook; throws when `leaf` is not a leaf that requires grad.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
struct LeafHooks {
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate;
};
uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);
void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id);  // an unknown id: nothing

// Anomaly mode: every op output is checked for NaN/inf and the producing op is named.
bool anomaly_enabled();
void set_anomaly_enabled(bool on);

}  // namespace mixprec::autograd
