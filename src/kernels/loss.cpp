// Dispatch of the loss family (loss.h): O(N) gathers, the reference on the CPU, loss.cu on a GPU.
#include "kernels/loss.h"

namespace mixprec::kernels {

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale) {
  const DeviceScope on({&log_probs, &target});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::nll_loss_forward(log_probs, target, reduce, scale);
#endif
  return ref::nll_loss_forward(log_probs, target, reduce, scale);
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype) {
  const DeviceScope on({&grad, &target});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::nll_loss_backward(grad, target, classes, reduce, scale, dtype);
#endif
  return ref::nll_loss_backward(grad, target, classes, reduce, scale, dtype);
}

}  // namespace mixprec::kernels
