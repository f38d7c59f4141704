// Dispatch of the loss family (loss.h): O(N) gathers, the reference on the CPU, loss.cu on a GPU.
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

}  // namespace mixprec::kernels
