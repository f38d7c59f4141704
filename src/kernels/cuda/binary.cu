// CUDA kernels of the binary family (binary.h): add, sub, mul, div with numpy broadcasting over
// any strides (16-byte vectors where both operands are contiguous, same-shape and aligned), and
// the gradient accumulation acc += g; f32 math for 16-bit and f32 tensors, f64 for f64.
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise_math.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

struct BinaryFn {
  BinaryOp op;
  template <class A>
  __device__ A operator()(A a, A b) const {
    return binary_value(op, a, b);
  }
};

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor dst = Tensor::empty(broadcast_shapes(a.shape(), b.shape(), "binary op"), a.dtype());
  dispatch_floating(a.dtype(), [&](auto tag) {
    map_elements<decltype(tag), 2>(dst, {&a, &b}, BinaryFn{op}, "binary op");
  });
  return dst;
}

// acc is contiguous and each element is read before it is written by the same thread, so acc can
// be a source and the destination at once.
void add_inplace(Tensor& acc, const Tensor& g) {
  const Tensor gg = g.dtype() == acc.dtype() ? g : kernels::cast(g, acc.dtype());
  dispatch_floating(acc.dtype(), [&](auto tag) {
    map_elements<decltype(tag), 2>(acc, {&acc, &gg}, BinaryFn{BinaryOp::add}, "add_inplace");
  });
}

}  // namespace mixprec::kernels::cuda
