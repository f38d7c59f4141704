// Reference shape kernels: element-by-element copy with conversion between any strides, and fill.
#include <cstring>

#include "kernels/ref/access.h"
#include "kernels/shape.h"

namespace mixprec::kernels::ref {

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  const size_t in_size = dtype_size(src.dtype()), out_size = dtype_size(dst.dtype());
  const char* s = static_cast<const char*>(src.storage()->data());
  char* d = static_cast<char*>(dst.storage()->data());
  std::vector<int64_t> src_offsets(size_t(src.numel()));
  for_each_offset(src.shape(), src.strides(), src.offset(),
                  [&](int64_t i, int64_t off) { src_offsets[size_t(i)] = off; });
  for_each_offset(dst.shape(), dst.strides(), dst.offset(), [&](int64_t i, int64_t off) {
    convert(s + src_offsets[size_t(i)] * int64_t(in_size), src.dtype(), d + off * int64_t(out_size), dst.dtype(), 1);
  });
}

void fill(Tensor& dst, double value) {
  // One converted element, replicated: the dtype rounding is the scalar conversion's.
  alignas(8) unsigned char one[8];
  convert(&value, DType::f64, one, dst.dtype(), 1);
  const size_t es = dtype_size(dst.dtype());
  if (dst.is_contiguous()) {
    char* p = static_cast<char*>(dst.data_ptr());
    const int64_t n = dst.numel();
    bool zero = true;
    for (size_t i = 0; i < es; ++i) zero = zero && one[i] == 0;
    if (zero) {
      std::memset(p, 0, size_t(n) * es);
      return;
    }
    for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * int64_t(es), one, es);
    return;
  }
  char* base = static_cast<char*>(dst.storage()->data());
  for_each_offset(dst.shape(), dst.strides(), dst.offset(),
                  [&](int64_t, int64_t off) { std::memcpy(base + off * int64_t(es), one, es); });
}

}  // namespace mixprec::kernels::ref
