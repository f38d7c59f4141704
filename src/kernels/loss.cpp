// Dispatch of the loss family (loss.h): O(N) gathers, the reference on the CPU, loss.cu on a GPU;
// cross-entropy's O(N*C) passes: the fast CPU kernels where they take the case.
#include "kernels/loss.h"

namespace mixprec::kernels {

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index) {
  const DeviceScope on({&log_probs, &target});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::nll_loss_forward(log_probs, target, r, ignore_index);
#endif
  return ref::nll_loss_forward(log_probs, target, r, ignore_index);
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype) {
  const DeviceScope on({&grad, &target});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::nll_loss_backward(grad, target, lp_shape, r, ignore_index, dtype);
#endif
  return ref::nll_loss_backward(grad, target, lp_shape, r, ignore_index, dtype);
}

CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index) {
  const DeviceScope on({&logits, &target});
  MIXPREC_ASSERT(logits.dim() >= 1 && target.numel() * logits.size(-1) == logits.numel(), "cross_entropy: logits ",
                 shape_str(logits.shape()), " against target ", shape_str(target.shape()));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::cross_entropy_forward(logits, target, r, ignore_index);
#endif
  if (use_fast()) {
    CrossEntropyResult out;
    if (cpu::cross_entropy_forward(logits, target, r, ignore_index, out)) return out;
  }
  note_reference();
  return ref::cross_entropy_forward(logits, target, r, ignore_index);
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index) {
  const DeviceScope on({&grad, &logits, &lse, &target});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::cross_entropy_backward(grad, logits, lse, target, r, ignore_index);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(logits.shape(), logits.dtype());
    if (cpu::cross_entropy_backward(grad, logits, lse, target, r, ignore_index, dst)) return dst;
  }
  note_reference();
  return ref::cross_entropy_backward(grad, logits, lse, target, r, ignore_index);
}

}  // namespace mixprec::kernels
