// The backward engine: topological order by an explicit stack (a 10,000-op chain cannot
// overflow the C++ stack), gradients summed per node, saved tensors released as nodes run.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/nodes.h"
#include "kernels/kernels.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"

namespace mixprec::autograd {
namespace {
thread_local bool tl_grad_enabled = true;
thread_local bool tl_in_backward = false;
bool g_anomaly = false;
}  // namespace

bool grad_enabled() { return tl_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tl_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { tl_grad_enabled = prev_; }
bool in_backward() { return tl_in_backward; }
bool anomaly_enabled() { return g_anomaly; }
void set_anomaly_enabled(bool on) { g_anomaly = on; }

std::vector<Tensor> FunctionNode::apply(const Tensor& grad_out) {
  MIXPREC_CHECK(fn != nullptr, "trying to backward through the graph a second time (at ", name,
                "): saved tensors were freed after the first backward");
  for (const SavedVersion& s : saved)
    MIXPREC_CHECK(s.storage->version() == s.version, "backward of ", name, ": a tensor it saved (", shape_str(s.shape),
                  " ", dtype_name(s.dtype),
                  ") was modified in place after the forward, so its gradient would be wrong; clone the tensor "
                  "before writing to it, or write after backward (an optimizer step between a forward and its "
                  "backward does this)");
  saved.clear();  // checked; the lambda holds what it needs and may free some of it early
  return fn(grad_out, *this);
}

bool kept_by_grad_fn(const Tensor& t) {
  if (!t.defined() || !t.storage()) return false;
  const auto* node = dynamic_cast<const FunctionNode*>(t.grad_fn().get());
  if (node == nullptr) return false;
  return std::any_of(node->saved.begin(), node->saved.end(),
                     [&](const SavedVersion& s) { return s.storage == t.storage() && s.version == t.version(); });
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_out) {
  auto impl = leaf.lock();
  if (!impl) return {};
  Tensor var(impl);
  const Tensor& g = grad_out;
  if (g.dtype() != var.dtype() || g.shape() != var.shape())
    MIXPREC_ASSERT(false, "gradient ", shape_str(g.shape()), " ", dtype_name(g.dtype()), " for leaf ",
                   shape_str(var.shape()), " ", dtype_name(var.dtype()));
  std::unique_lock lock(mutex);
  if (!impl->grad) {
    // Steal the incoming buffer when nobody else holds it; otherwise copy. Either way the
    // bytes now count as gradients.
    // use_count 1: only the engine holds this handle, and no other view shares the bytes.
    if (g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
        g.storage()->bytes() == g.nbytes()) {
      g.storage()->set_category(MemCategory::gradients);
      impl->grad = g.detach().impl_ptr();
    } else {
      MemoryScope scope(MemCategory::gradients);
      impl->grad = g.clone().impl_ptr();
    }
  } else {
    Tensor acc(impl->grad);
    kernels::add_inplace(acc, g);
  }
  lock.unlock();  // a hook may start work that accumulates again (a bucket's reduction, say)
  if (impl->hooks)
    for (const auto& [id, hook] : impl->hooks->post_accumulate) hook(var);
  return {};
}

uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  MIXPREC_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
                "register_post_accumulate_grad_hook: the tensor must be a leaf that requires grad");
  MIXPREC_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: empty hook");
  static std::atomic<uint64_t> next_id{1};
  detail::TensorImpl* impl = leaf.impl();
  if (!impl->hooks) impl->hooks = std::make_shared<LeafHooks>();
  const uint64_t id = next_id++;
  impl->hooks->post_accumulate.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id) {
  if (!leaf.defined() || !leaf.impl()->hooks) return;
  auto& hooks = leaf.impl()->hooks->post_accumulate;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

static std::shared_ptr<Node> edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  detail::TensorImpl* impl = t.impl();
  if (impl->grad_fn) return impl->grad_fn;
  // Threads that record ops on the same leaf (shared parameters, each thread its own forward) find
  // or make its one AccumulateGrad under a lock, as PyTorch's AutogradMeta mutex does: the weak_ptr
  // is read and written here only.
  static std::mutex accumulator_mutex;
  const std::lock_guard lock(accumulator_mutex);
  auto acc = impl->grad_accumulator.lock();
  if (!acc) {
    auto a = std::make_shared<AccumulateGrad>();
    a->name = "AccumulateGrad";
    a->leaf = t.impl_ptr();
    impl->grad_accumulator = a;
    acc = a;
  }
  return acc;
}

template <class Range>
static Tensor record_impl(Tensor out, std::string_view name, const Range& inputs, BackwardFn fn,
                          std::initializer_list<Tensor> saved) {
  if (g_anomaly) kernels::check_finite_or_throw(out, name);
  if (!tl_grad_enabled) return out;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return out;
  auto node = std::make_shared<FunctionNode>();
  node->name = name;
  node->fn = std::move(fn);
  for (const Tensor& t : saved)
    if (t.defined() && t.storage()) node->saved.push_back(SavedVersion{t.storage(), t.version(), t.shape(), t.dtype()});
  for (const Tensor& t : inputs) {
    node->next.push_back(edge_of(t));
    node->inputs.push_back(t.defined() ? InputMeta{t.shape(), t.dtype()} : InputMeta{{}, DType::f32});
  }
  // `out` may share its impl with nobody yet; give it history.
  detail::TensorImpl* impl = out.impl();
  impl->requires_grad = true;
  impl->is_leaf = false;
  impl->grad_fn = std::move(node);
  return out;
}

Tensor record(Tensor out, std::string_view name, std::initializer_list<Tensor> inputs, BackwardFn fn,
              std::initializer_list<Tensor> saved) {
  return record_impl(std::move(out), name, inputs, std::move(fn), saved);
}
Tensor record(Tensor out, std::string_view name, const std::vector<Tensor>& inputs, BackwardFn fn,
              std::initializer_list<Tensor> saved) {
  return record_impl(std::move(out), name, inputs, std::move(fn), saved);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  MIXPREC_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  NoGradGuard no_grad;
  // Autocast reads this flag: backward runs in the dtypes the forward chose. Restored on exit,
  // also when a node throws.
  struct InBackward {
    bool prev = std::exchange(tl_in_backward, true);
    ~InBackward() { tl_in_backward = prev; }
  } in_backward_scope;
  MemoryScope scope(MemCategory::temporaries);

  // 1. Dependencies: how many edges point at each node among the reachable ones.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  // Held here: a leaf root's AccumulateGrad is otherwise owned by nobody (the leaf keeps a weak_ptr).
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (const Tensor& r : roots) {
    MIXPREC_CHECK(r.requires_grad(), "backward: the tensor does not require grad and has no grad_fn");
    root_nodes.push_back(edge_of(r));
    Node* n = root_nodes.back().get();
    if (seen.insert(n).second) stack.push_back(n);
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e) continue;
      ++deps[e.get()];
      if (seen.insert(e.get()).second) stack.push_back(e.get());
    }
  }

  // 2. Run nodes whose every consumer has delivered its gradient.
  std::unordered_map<Node*, Tensor> pending;
  std::vector<std::shared_ptr<Node>> ready;
  auto deliver = [&](const std::shared_ptr<Node>& n, const Tensor& g) {
    auto it = pending.find(n.get());
    if (it == pending.end()) {
      pending.emplace(n.get(), g);
    } else {
      Tensor& acc = it->second;
      // Never write into a buffer someone else may hold: sum out of place when shared.
      if (acc.impl_ptr().use_count() == 1 && acc.storage().use_count() == 1 && acc.is_contiguous() &&
          acc.dtype() == g.dtype())
        kernels::add_inplace(acc, g);
      else
        acc = kernels::add(acc, g);
    }
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    const auto& n = root_nodes[i];
    MIXPREC_CHECK(grads[i].shape() == roots[i].shape(), "backward: gradient shape ", shape_str(grads[i].shape()),
                  " does not match the tensor's ", shape_str(roots[i].shape()));
    Tensor g = grads[i].dtype() == roots[i].dtype() ? grads[i] : kernels::cast(grads[i], roots[i].dtype());
    deliver(n, g);
  }
  // Once per node: a root given twice has its gradients summed above and must run only once.
  std::unordered_set<Node*> queued;
  for (const auto& n : root_nodes)
    if (deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push_back(n);
  while (!ready.empty()) {
    std::shared_ptr<Node> n = std::move(ready.back());
    ready.pop_back();
    auto it = pending.find(n.get());
    MIXPREC_ASSERT(it != pending.end(), "node ", n->name, " ran without a gradient");
    Tensor g = std::move(it->second);
    pending.erase(it);
    std::vector<Tensor> in_grads = n->apply(g);
    g = Tensor();
    n->release();
    for (size_t i = 0; i < n->next.size(); ++i) {
      const auto& e = n->next[i];
      if (!e) continue;
      if (i < in_grads.size() && in_grads[i].defined()) {
        Tensor gi = in_grads[i];
        const InputMeta& meta = n->inputs[i];
        MIXPREC_ASSERT(gi.shape() == meta.shape, n->name, " returned gradient ", shape_str(gi.shape()), " for input ",
                       i, " of shape ", shape_str(meta.shape));
        if (gi.dtype() != meta.dtype) gi = kernels::cast(gi, meta.dtype);
        if (g_anomaly) kernels::check_finite_or_throw(gi, n->name, /*backward=*/true);
        deliver(e, gi);
      }
      if (--deps[e.get()] == 0) {
        if (pending.count(e.get())) ready.push_back(e);
      }
    }
  }
}

}  // namespace mixprec::autograd
