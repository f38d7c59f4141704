// Reference element-wise kernels: copy, broadcasting binary ops, unary ops and their gradients.
#include <cmath>
#include <numbers>

#include "kernels/kernels.h"
#include "kernels/ref/access.h"
#include "kernels/unary_math.h"

namespace mixprec::kernels {

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    MIXPREC_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                  " do not broadcast (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Strides of `t` viewed with the broadcast shape `out` (0 along broadcast dimensions).
static Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t lead = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i)
    st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

namespace ref {

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  const size_t in_size = dtype_size(src.dtype()), out_size = dtype_size(dst.dtype());
  const char* s = static_cast<const char*>(src.storage()->data());
  char* d = static_cast<char*>(dst.storage()->data());
  std::vector<int64_t> src_offsets(size_t(src.numel()));
  for_each_offset(src.shape(), src.strides(), src.offset(), [&](int64_t i, int64_t off) { src_offsets[size_t(i)] = off; });
  for_each_offset(dst.shape(), dst.strides(), dst.offset(), [&](int64_t i, int64_t off) {
    convert(s + src_offsets[size_t(i)] * int64_t(in_size), src.dtype(), d + off * int64_t(out_size), dst.dtype(), 1);
  });
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  MIXPREC_ASSERT(a.dtype() == b.dtype(), "binary op on ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), "binary op");
  Tensor dst = Tensor::empty(out_shape, a.dtype());
  const Shape sa = broadcast_strides(a, out_shape), sb = broadcast_strides(b, out_shape);
  dispatch_floating(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.storage()->data());
    const T* pb = static_cast<const T*>(b.storage()->data());
    T* pd = dst.data<T>();
    std::vector<int64_t> ob(size_t(dst.numel()));
    for_each_offset(out_shape, sb, b.offset(), [&](int64_t i, int64_t off) { ob[size_t(i)] = off; });
    for_each_offset(out_shape, sa, a.offset(), [&](int64_t i, int64_t off) {
      store(pd + i, binary_value<acc_t<T>>(op, load(pa + off), load(pb + ob[size_t(i)])));
    });
  });
  return dst;
}

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.storage()->data());
    T* pd = dst.data<T>();
    for_each_offset(x.shape(), x.strides(), x.offset(),
                    [&](int64_t i, int64_t off) { store(pd + i, unary_value<acc_t<T>>(op, load(px + off), p)); });
  });
  return dst;
}

Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p) {
  MIXPREC_ASSERT(grad.shape() == x.shape() && grad.dtype() == x.dtype(), "unary_grad ", shape_str(grad.shape()),
                 " vs ", shape_str(x.shape()));
  Tensor gc = contig(grad), xc = contig(x);
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pg = gc.data<T>();
    const T* px = xc.data<T>();
    T* pd = dst.data<T>();
    for (int64_t i = 0; i < dst.numel(); ++i)
      store(pd + i, load(pg + i) * unary_derivative<acc_t<T>>(op, load(px + i), p));
  });
  return dst;
}

}  // namespace ref
}  // namespace mixprec::kernels
