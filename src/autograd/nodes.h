// The engine's node types (internal): an op's node with its backward lambda and saved-tensor
// versions, and the gradient sink of a leaf.
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include "mixprec/autograd.h"

namespace mixprec::autograd {

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
  bool is_consumed() const override { return fn == nullptr; }
};

// Sink for a leaf that requires grad: adds into leaf.grad (allocated as MemCategory::gradients).
struct AccumulateGrad final : Node {
  std::weak_ptr<detail::TensorImpl> leaf;
  std::mutex mutex;  // threads' backward passes into one shared leaf take turns writing its .grad
  std::vector<Tensor> apply(const Tensor& grad_out) override;
};

// True when t's bytes are already kept for the backward of the op that made t (its grad_fn
// saved t's storage, at t's version): another backward may read t without holding more memory
// than the graph already holds (max_pool2d after a ReLU reads its input instead of an argmax).
bool kept_by_grad_fn(const Tensor& t);

}  // namespace mixprec::autograd
