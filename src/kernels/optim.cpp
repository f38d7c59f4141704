// Dispatch of the optimizer family (optim.h): the CUDA kernels for a GPU's tensors, the fast CPU
// kernels where they exist, the reference otherwise.
#include "kernels/optim.h"

#include <initializer_list>

namespace mixprec::kernels {
namespace {

// The device every defined tensor of the lists is on (a DeviceScope over many tensors).
Device common_device(std::initializer_list<const std::vector<Tensor>*> lists, std::initializer_list<const Tensor*> xs) {
  const Tensor* first = nullptr;
  auto visit = [&](const Tensor& t) {
    if (!t.defined()) return;
    if (!first) first = &t;
    MIXPREC_CHECK(t.device() == first->device(), "internal: optimizer kernel operands on different devices (",
                  first->device().str(), ", ", t.device().str(), ")");
  };
  for (const auto* l : lists)
    for (const Tensor& t : *l) visit(t);
  for (const Tensor* x : xs) visit(*x);
  return first ? first->device() : Device::cpu();
}

Device params_device(const std::vector<OptimParam>& ps, std::initializer_list<const Tensor*> xs) {
  std::vector<Tensor> all;
  for (const OptimParam& p : ps)
    for (const Tensor* t : {&p.param, &p.grad, &p.master, &p.state1, &p.state2, &p.lr}) all.push_back(*t);
  return common_device({&all}, xs);
}

}  // namespace

void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf) {
  MIXPREC_ASSERT(src.size() == dst.size(), "unscale_and_check");
  const DeviceScope on(common_device({&src, &dst}, {&scale, &found_inf}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::unscale_and_check(src, dst, scale, found_inf);
#endif
  if (use_fast()) return cpu::unscale_and_check(src, dst, scale, found_inf);
  note_reference();
  ref::unscale_and_check(src, dst, scale, found_inf);
}

void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s) {
  const DeviceScope on(params_device(params, {&o.momentum_ready, &s.step, &s.found_inf, &s.scale, &s.rounding}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::sgd_step(params, o, s);
#endif
  if (use_fast()) return cpu::sgd_step(params, o, s);
  note_reference();
  ref::sgd_step(params, o, s);
}

void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s) {
  const DeviceScope on(params_device(params, {&s.step, &s.found_inf, &s.scale, &s.rounding}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::adamw_step(params, o, s);
#endif
  if (use_fast()) return cpu::adamw_step(params, o, s);
  note_reference();
  ref::adamw_step(params, o, s);
}

// The rest has no fast CPU variant: scalar bookkeeping, or reductions whose block order is the
// definition (the reference runs the blocks in parallel already).

void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r) {
  const DeviceScope on(common_device({&found_infs}, {&scale, &counters}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::update_scale(scale, counters, found_infs, r);
#endif
  ref::update_scale(scale, counters, found_infs, r);
}

void count_skipped(Tensor& counters, const Tensor& found_inf) {
  const DeviceScope on({&counters, &found_inf});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::count_skipped(counters, found_inf);
#endif
  ref::count_skipped(counters, found_inf);
}

void increment(Tensor& counter) {
  const DeviceScope on(counter);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::increment(counter);
#endif
  ref::increment(counter);
}

Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  const DeviceScope on(common_device({&grads}, {}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::grad_norm(grads, norm_type);
#endif
  Tensor out;
  if (use_fast() && cpu::grad_norm(grads, norm_type, out)) return out;
  note_reference();
  return ref::grad_norm(grads, norm_type);
}

void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm) {
  const DeviceScope on(common_device({&grads}, {&total}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::clip_by_norm(grads, total, max_norm);
#endif
  if (use_fast() && cpu::clip_by_norm(grads, total, max_norm)) return;
  note_reference();
  ref::clip_by_norm(grads, total, max_norm);
}

void clip_by_value(const std::vector<Tensor>& grads, double clip_value) {
  const DeviceScope on(common_device({&grads}, {}));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::clip_by_value(grads, clip_value);
#endif
  ref::clip_by_value(grads, clip_value);
}

Tensor grad_range_counts(const Tensor& g, double scale) {
  const DeviceScope on(g);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::grad_range_counts(g, scale);
#endif
  return ref::grad_range_counts(g, scale);
}

}  // namespace mixprec::kernels
