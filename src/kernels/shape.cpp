// Dispatch of the shape family (shape.h): fast CPU copy where it supports the case, else the reference.
#include "kernels/shape.h"

#include "kernels/ref/access.h"

namespace mixprec::kernels {

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  if (use_fast() && cpu::copy(src, dst)) return;
  ref::copy(src, dst);
}

void fill(Tensor& dst, double value) { ref::fill(dst, value); }  // memset/memcpy already: no fast variant

Tensor cast(const Tensor& src, DType dtype) {
  Tensor dst = Tensor::empty(src.shape(), dtype);
  copy(src, dst);
  return dst;
}

}  // namespace mixprec::kernels
