// Reference reductions: sums accumulated in f32 (f64 for f64 inputs), and the finiteness check.
#include <cmath>

#include "kernels/reduce.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  Shape kept = x.shape();  // shape with reduced dims set to 1
  for (int64_t d : dims) kept[size_t(d)] = 1;
  Tensor acc = Tensor::zeros(kept, DType::f64);
  double* pa = acc.data<double>();
  const Shape acc_strides = [&] {
    Shape st = contiguous_strides(kept);
    for (int64_t d : dims) st[size_t(d)] = 0;
    return st;
  }();
  std::vector<int64_t> acc_off(size_t(x.numel()));
  for_each_offset(x.shape(), acc_strides, 0, [&](int64_t i, int64_t off) { acc_off[size_t(i)] = off; });
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.storage()->data());
    for_each_offset(x.shape(), x.strides(), x.offset(),
                    [&](int64_t i, int64_t off) { pa[acc_off[size_t(i)]] += double(load(px + off)); });
  });
  Tensor dst = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), out_dtype);
  convert(pa, DType::f64, dst.data_ptr(), out_dtype, size_t(acc.numel()));
  return dst;
}

bool all_finite(const Tensor& x) {
  if (!is_floating(x.dtype())) return true;
  const Tensor xc = contig(x);
  return dispatch_floating(x.dtype(), [&](auto tag) {
    const auto* p = xc.data<decltype(tag)>();
    for (int64_t i = 0; i < xc.numel(); ++i)
      if (!std::isfinite(double(load(p + i)))) return false;
    return true;
  });
}

}  // namespace mixprec::kernels::ref
