// Dispatch of the attention family (attention.h): the device's kernels, the fused CPU kernel where
// it supports the case, else the reference.
#include "kernels/attention.h"

namespace mixprec::kernels {

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const DeviceScope on({&q, &k, &v});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::attention_forward(q, k, v, p);
#endif
  if (use_fast()) {
    AttentionForward dst;
    if (cpu::attention_forward(q, k, v, p, dst)) return dst;
  }
  return ref::attention_forward(q, k, v, p);
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p) {
  const DeviceScope on({&q, &k, &v, &fwd.out, &grad_out});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::attention_backward(q, k, v, fwd, grad_out, p);
#endif
  // The fused backward recomputes the probabilities from the log-sum-exp; a reference forward kept
  // them, and its own backward reads them.
  if (use_fast() && !fwd.probs.defined()) {
    AttentionGrads dst;
    if (cpu::attention_backward(q, k, v, fwd, grad_out, p, dst)) return dst;
  }
  return ref::attention_backward(q, k, v, fwd, grad_out, p);
}

}  // namespace mixprec::kernels
