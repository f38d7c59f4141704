// Reference binary kernels: numpy broadcasting over any strides, computed in f32 (f64 for f64).
#include "kernels/binary.h"

#include "kernels/elementwise_math.h"
#include "kernels/ref/access.h"

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
  for (size_t i = 0; i < t.shape().size(); ++i) st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

namespace ref {

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

}  // namespace ref
}  // namespace mixprec::kernels
