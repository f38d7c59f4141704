// Dispatch of the attention family (attention.h): the device's kernels, the fused CPU kernel where
// it supports the case, else the reference.
#include "kernels/attention.h"

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
                                  const Tensor& grad_out, const AttentionParams& p) {
  const DeviceScope on({&q, &k, &v, &fwd.out, &grad_out});
  // dP = dO V^T, dV = P^T dO, dS -> dQ = dS K, dK = dS^T Q: twice the forward's products, and the
  // fused kernel recomputes S = Q K^T (not counted: the FLOPs are the op's, not the kernel's).
  if (profile::detail::on()) profile::detail::add_flops(2.0 * attention_flops(q, v, p));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::attention_backward(q, k, v, fwd, grad_out, p);
#endif
  // The fused backward recomputes the probabilities from the log-sum-exp; a reference forward kept
  // them, and its own backward reads them.
  if (use_fast() && !fwd.probs.defined()) {
    AttentionGrads dst;
    if (cpu::attention_backward(q, k, v, fwd, grad_out, p, dst)) return dst;
  }
  note_reference();
  return ref::attention_backward(q, k, v, fwd, grad_out, p);
}

}  // namespace mixprec::kernels
