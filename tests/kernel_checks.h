// What the fast-vs-reference kernel tests (test_kernels.cpp, test_kernels_products.cpp) share: the
// dtypes and sizes they sweep, inputs rounded to the dtype, and the element-wise comparison with a
// per-element tolerance (NaN matches NaN, inf the same inf).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "mixprec/random.h"
#include "mixprec/tensor.h"
#include "ulp.h"

namespace mixprec::testutil {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

inline constexpr double kU32 = 0x1p-24;  // f32 unit roundoff
inline const std::vector<DType> kDTypes = {DType::f32, DType::bf16, DType::f16};
inline const std::vector<int64_t> kSizes = {1, 7, 4095, 4097, 100000};

inline std::vector<float> uniform(Generator& g, int64_t n, double lo, double hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(lo + (hi - lo) * g.uniform());
  return v;
}
inline std::vector<float> away_from_zero(Generator& g, int64_t n, double lo, double hi) {
  std::vector<float> v = uniform(g, n, lo, hi);
  for (float& x : v) x = g.uniform() < 0.5 ? -x : x;
  return v;
}
inline Tensor make(const std::vector<float>& v, const Shape& s, DType t) { return Tensor::from_vector(v, s, t); }

// Element i may differ by tol(i); NaN must match NaN, inf must match inf of the same sign.
template <class Tol>
inline ::testing::AssertionResult close(const Tensor& fast, const Tensor& ref, Tol tol) {
  if (fast.shape() != ref.shape() || fast.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << "fast " << shape_str(fast.shape()) << " " << dtype_name(fast.dtype())
                                         << " vs ref " << shape_str(ref.shape()) << " " << dtype_name(ref.dtype());
  const std::vector<double> f = fast.to_vector_f64(), r = ref.to_vector_f64();
  int64_t bad = 0;
  std::ostringstream msg;
  msg.precision(10);
  for (size_t i = 0; i < f.size(); ++i) {
    bool ok;
    if (std::isnan(r[i]) || std::isnan(f[i]))
      ok = std::isnan(r[i]) && std::isnan(f[i]);
    else if (std::isinf(r[i]) || std::isinf(f[i]))
      ok = f[i] == r[i];
    else
      ok = std::fabs(f[i] - r[i]) <= tol(i);
    if (!ok && bad++ < 5) msg << "\n  element " << i << ": fast " << f[i] << " ref " << r[i] << " tol " << tol(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << f.size() << " elements differ (" << dtype_name(ref.dtype())
                                       << " " << shape_str(ref.shape()) << ")" << msg.str();
}
inline ::testing::AssertionResult within_ulp(const Tensor& fast, const Tensor& ref) {
  const std::vector<double> r = ref.to_vector_f64();
  const DType t = ref.dtype();
  return close(fast, ref, [&](size_t i) { return ulp_of(t, r[i]); });
}
inline ::testing::AssertionResult bit_equal(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes() || a.dtype() != b.dtype()) return ::testing::AssertionFailure() << "size/dtype differ";
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
  for (size_t i = 0; i < a.nbytes(); ++i)
    if (pa[i] != pb[i]) return ::testing::AssertionFailure() << "byte " << i << " differs";
  return ::testing::AssertionSuccess();
}

inline std::string tag(DType t, const Shape& s) { return std::string(dtype_name(t)) + " " + shape_str(s); }

}  // namespace mixprec::testutil
