// Element access for kernels: dtype dispatch, load to the accumulation type, store with rounding.
#pragma once
#include <type_traits>

#include "kernels/shape.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// f64 computes in f64; every other float type loads to f32, computes, and rounds once on store.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

inline double load(const double* p) { return *p; }
inline float load(const float* p) { return *p; }
inline float load(const bf16_t* p) { return bf16_to_f32(p->bits); }
inline float load(const f16_t* p) { return f16_to_f32(p->bits); }
inline void store(double* p, double v) { *p = v; }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16_t* p, float v) { p->bits = f32_to_bf16(v); }
inline void store(f16_t* p, float v) { p->bits = f32_to_f16(v); }

// Calls f(T{}) with T the C++ storage type of a floating dtype.
template <class F>
decltype(auto) dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(bf16_t{});
    case DType::f16:
      return f(f16_t{});
    default:
      break;
  }
  throw Error(detail::concat("expected a floating dtype, got ", dtype_name(t)));
}

// Iterates the element offsets (in elements) of a strided view in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, F&& f) {
  const size_t nd = shape.size();
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(nd, 0);
  int64_t off = base;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// dst[i] = f(x[i]) in x's dtype, x of any strides; f takes and returns acc_t<T> (the element-wise
// reference kernels of the unary and activation families).
template <class F>
Tensor map_elements(const Tensor& x, F&& f) {
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.storage()->data());
    T* pd = dst.data<T>();
    for_each_offset(x.shape(), x.strides(), x.offset(),
                    [&](int64_t i, int64_t off) { store(pd + i, f(load(px + off))); });
  });
  return dst;
}

// dst[i] = grad[i] * df(s[i]) in s's dtype (grad of the same shape and dtype): the backward of an
// element-wise function, with s its saved input or output.
template <class F>
Tensor map_grad(const Tensor& grad, const Tensor& s, F&& df) {
  MIXPREC_ASSERT(grad.shape() == s.shape() && grad.dtype() == s.dtype(), "element-wise grad ", shape_str(grad.shape()),
                 " vs ", shape_str(s.shape()));
  Tensor gc = contig(grad), sc = contig(s);
  Tensor dst = Tensor::empty(s.shape(), s.dtype());
  dispatch_floating(s.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pg = gc.data<T>();
    const T* ps = sc.data<T>();
    T* pd = dst.data<T>();
    for (int64_t i = 0; i < dst.numel(); ++i) store(pd + i, load(pg + i) * df(load(ps + i)));
  });
  return dst;
}

}  // namespace mixprec::kernels
