// Dispatch of the unary family (unary.h): the fast CPU kernel where it supports the case, else the reference.
#include "kernels/unary.h"

namespace mixprec::kernels {

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::unary(op, x, p);
#endif
  if (use_fast() && x.is_contiguous()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::unary(op, x, p, dst)) return dst;
  }
  note_reference();
  return ref::unary(op, x, p);
}

Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p) {
  const DeviceScope on({&grad, &x});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::unary_grad(op, grad, x, p);
#endif
  if (use_fast() && grad.is_contiguous() && x.is_contiguous()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::unary_grad(op, grad, x, p, dst)) return dst;
  }
  note_reference();
  return ref::unary_grad(op, grad, x, p);
}

}  // namespace mixprec::kernels
