// Dispatch of the activation family (activation.h): the fast CPU kernel where it supports the case, else the reference.
#include "kernels/activation.h"

#include "kernels/shape.h"
#include "mixprec/error.h"

namespace mixprec::kernels {

// A channels-last tensor (shape.h) goes through the kernels as its contiguous NHWC view, and the
// result is viewed back: element-wise, so the same values, in the input's layout.

Tensor activation(Activation op, const Tensor& x) {
  if (is_channels_last(x)) return nchw_view(activation(op, nhwc_view(x)));
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::activation(op, x);
#endif
  if (use_fast() && x.is_contiguous()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::activation(op, x, dst)) return dst;
  }
  note_reference();
  return ref::activation(op, x);
}

Tensor activation_grad(Activation op, const Tensor& grad, const Tensor& saved) {
  if (is_channels_last(saved)) return nchw_view(activation_grad(op, nhwc_view(channels_last(grad)), nhwc_view(saved)));
  const DeviceScope on({&grad, &saved});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::activation_grad(op, grad, saved);
#endif
  if (use_fast() && grad.is_contiguous() && saved.is_contiguous()) {
    Tensor dst = Tensor::empty(saved.shape(), saved.dtype());
    if (cpu::activation_grad(op, grad, saved, dst)) return dst;
  }
  note_reference();
  return ref::activation_grad(op, grad, saved);
}

void relu_mask_inplace(Tensor& grad, const Tensor& y) {
  if (is_channels_last(y) && nhwc_dense(grad)) {
    Tensor g = nhwc_view(grad);
    return relu_mask_inplace(g, nhwc_view(y));
  }
  const DeviceScope on({&grad, &y});
  MIXPREC_ASSERT(grad.is_contiguous() && grad.shape() == y.shape(), "relu_mask_inplace ", shape_str(grad.shape()),
                 " vs ", shape_str(y.shape()));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::relu_mask_inplace(grad, y);
#endif
  const Tensor yc = contig(y);
  if (use_fast() && cpu::relu_mask_inplace(grad, yc)) return;
  note_reference();
  ref::relu_mask_inplace(grad, yc);
}

}  // namespace mixprec::kernels
