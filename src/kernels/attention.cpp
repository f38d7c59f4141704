// Dispatch of the attention family (attention.h): the device's kernels, the fused CPU kernel where
// it supports the case, else the reference.
#include "kernels/attention.h"

#include <utility>

#include "kernels/shape.h"

namespace mixprec::kernels {
namespace {
// The products of attention: S = Q K^T and O = P V, 2 * E multiply-adds per visible (query, key)
// pair each (E and Ev), over the pairs the causal mask leaves (a causal kernel skips the others).
double attention_flops(const Tensor& q, const Tensor& v, const AttentionParams& p) {
  const int64_t tq = q.size(2), tk = v.size(2);
  double pairs = 0.0;
  for (int64_t i = 0; i < tq; ++i) pairs += double(attention_last_key(p, i, tq, tk) + 1);
  return 2.0 * double(q.size(0) * q.size(1)) * pairs * double(q.size(3) + v.size(3));
}

// The gradients where the caller wants them: copied into `into`'s tensors unless a kernel wrote
// them there.
AttentionGrads written(const AttentionGrads& d, const AttentionGrads* into) {
  if (!into) return d;
  AttentionGrads out = *into;
  for (auto [got, want] : {std::pair{&d.dq, &out.dq}, std::pair{&d.dk, &out.dk}, std::pair{&d.dv, &out.dv}})
    if (got->data_ptr() != want->data_ptr() || got->strides() != want->strides()) copy(*got, *want);
  return out;
}
}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const DeviceScope on({&q, &k, &v});
  if (profile::detail::on()) profile::detail::add_flops(attention_flops(q, v, p));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::attention_forward(q, k, v, p);
#endif
  if (use_fast()) {
    AttentionForward dst;
    if (cpu::attention_forward(q, k, v, p, dst)) return dst;
  }
  note_reference();
  return ref::attention_forward(q, k, v, p);
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p, const AttentionGrads* into) {
  const AttentionGrads none;
  const AttentionGrads& in = into ? *into : none;
  const DeviceScope on({&q, &k, &v, &fwd.out, &grad_out, &in.dq, &in.dk, &in.dv});
  // dP = dO V^T, dV = P^T dO, dS -> dQ = dS K, dK = dS^T Q: twice the forward's products, and the
  // fused kernel recomputes S = Q K^T (not counted: the FLOPs are the op's, not the kernel's).
  if (profile::detail::on()) profile::detail::add_flops(2.0 * attention_flops(q, v, p));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return written(cuda::attention_backward(q, k, v, fwd, grad_out, p), into);
#endif
  // The fused backward recomputes the probabilities from the log-sum-exp; a reference forward kept
  // them, and its own backward reads them. It writes into `into`'s views itself.
  if (use_fast() && !fwd.probs.defined()) {
    AttentionGrads dst = in;
    if (cpu::attention_backward(q, k, v, fwd, grad_out, p, dst)) return written(dst, into);
  }
  note_reference();
  return written(ref::attention_backward(q, k, v, fwd, grad_out, p), into);
}

}  // namespace mixprec::kernels
