// Dispatch of the matmul family (matmul.h): oneDNN where it supports the case, else the reference.
#include "kernels/matmul.h"

namespace mixprec::kernels {

void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const DeviceScope on({&a, &b, &dst});
  if (use_fast() && cpu::matmul(a, b, dst, o)) return;
  ref::matmul(a, b, dst, o);
}

}  // namespace mixprec::kernels
