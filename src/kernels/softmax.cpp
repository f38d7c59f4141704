// Dispatch of the softmax family (softmax.h): the fast CPU kernel where it supports the case, else the reference.
#include "kernels/softmax.h"

namespace mixprec::kernels {

Tensor softmax_lastdim(const Tensor& x, bool log) {
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::softmax_lastdim(x, log);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::softmax_lastdim(x, log, dst)) return dst;
  }
  note_reference();
  return ref::softmax_lastdim(x, log);
}

Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log) {
  const DeviceScope on({&y, &grad_y});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::softmax_lastdim_backward(y, grad_y, log);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(y.shape(), y.dtype());
    if (cpu::softmax_lastdim_backward(y, grad_y, log, dst)) return dst;
  }
  note_reference();
  return ref::softmax_lastdim_backward(y, grad_y, log);
}

}  // namespace mixprec::kernels
