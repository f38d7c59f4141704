// Dispatch of the binary family (binary.h): the fast CPU kernel where it supports the case, else the reference.
#include "kernels/binary.h"

#include <cstring>

#include "kernels/ref/access.h"
#include "kernels/shape.h"

namespace mixprec::kernels {

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }

void add_inplace(Tensor& acc, const Tensor& g) {
  const DeviceScope on({&acc, &g});
  MIXPREC_ASSERT(acc.shape() == g.shape() && acc.is_contiguous(), "add_inplace ", shape_str(acc.shape()),
                 " += ", shape_str(g.shape()));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::add_inplace(acc, g);
#endif
  Tensor gg = g.dtype() == acc.dtype() ? g : cast(g, acc.dtype());
  if (use_fast() && cpu::binary(BinaryOp::add, acc, gg, acc)) return;
  note_reference();
  Tensor s = ref::binary(BinaryOp::add, acc, gg);
  std::memcpy(acc.data_ptr(), s.data_ptr(), s.nbytes());
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const DeviceScope on({&a, &b});
  MIXPREC_ASSERT(is_floating(a.dtype()) && is_floating(b.dtype()), "binary op on ", dtype_name(a.dtype()), " and ",
                 dtype_name(b.dtype()));
  // Mixed dtypes compute in the promoted one. The fast CPU kernel reads each operand in its own
  // dtype; the others take the narrower operand cast first (exact), which is the definition.
  const DType t = promote_floating(a.dtype(), b.dtype());
  auto widened = [t](const Tensor& x) { return x.dtype() == t ? x : cast(x, t); };
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::binary(op, widened(a), widened(b));
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(broadcast_shapes(a.shape(), b.shape(), "binary op"), t);
    if (cpu::binary(op, a, b, dst)) return dst;
  }
  note_reference();
  return ref::binary(op, widened(a), widened(b));
}

}  // namespace mixprec::kernels
