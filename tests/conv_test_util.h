// Helpers for the conv/pool/norm tests: backend switching, random inputs rounded to a dtype, and
// element-wise comparison with a per-element tolerance.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "kernels/kernels.h"
#include "mixprec/tensor.h"
#include "ulp.h"

namespace mixprec::convtest {

using kernels::BackendGuard;

constexpr double kU32 = 0x1p-24;  // f32 unit roundoff

// Spacing of dtype t's values at |v| (the subnormal spacing below the normal range).
using testutil::ulp_of;

// Uniform values in [lo, hi) stored in dtype t (so every backend sees the same rounded inputs).
inline Tensor rand(Generator& g, const Shape& s, DType t, double lo = -1, double hi = 1) {
  return Tensor::uniform(s, g, lo, hi, DType::f64).to(t).detach();
}
inline Tensor abs_of(const Tensor& t) {
  std::vector<double> v = t.to_vector_f64();
  for (double& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape(), DType::f64);
}

// |fast - ref| <= tol(i) element-wise; NaN must meet NaN.
inline ::testing::AssertionResult close(const Tensor& fast, const Tensor& ref, const std::function<double(size_t)>& tol,
                                        const std::string& what = "") {
  if (fast.shape() != ref.shape() || fast.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << what << ": fast " << shape_str(fast.shape()) << " "
                                         << dtype_name(fast.dtype()) << " vs ref " << shape_str(ref.shape()) << " "
                                         << dtype_name(ref.dtype());
  const std::vector<double> f = fast.to_vector_f64(), r = ref.to_vector_f64();
  int64_t bad = 0;
  std::ostringstream msg;
  msg.precision(10);
  for (size_t i = 0; i < f.size(); ++i) {
    const bool ok =
        std::isnan(r[i]) || std::isnan(f[i]) ? std::isnan(r[i]) && std::isnan(f[i]) : std::fabs(f[i] - r[i]) <= tol(i);
    if (!ok && bad++ < 5) msg << "\n  element " << i << ": fast " << f[i] << " ref " << r[i] << " tol " << tol(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << f.size() << " elements differ ("
                                       << dtype_name(ref.dtype()) << " " << shape_str(ref.shape()) << ")" << msg.str();
}

// Rounded once from an f32 accumulation of `terms` products: 1 ulp of the output dtype plus
// the f32 accumulation bound terms * 2^-24 * (sum of |products|), given by `abs_sum`.
inline ::testing::AssertionResult close_accumulated(const Tensor& fast, const Tensor& ref, const Tensor& abs_sum,
                                                    double terms, const std::string& what = "") {
  const std::vector<double> r = ref.to_vector_f64(), a = abs_sum.to_vector_f64();
  const DType t = ref.dtype();
  return close(
      fast, ref, [&](size_t i) { return ulp_of(t, r[i]) + terms * kU32 * a[i] + 1e-30; }, what);
}

// A kernel that rounds an f32 accumulation of `terms` products once, to nearest, against the f64
// truth: half an ulp of the output dtype (at the larger of the two values: a rounding up across a
// binade edge) plus the f32 accumulation's bound, terms * 2^-24 * (sum of |products|). A kernel
// that truncates, or rounds twice, is off by up to a whole ulp and fails.
inline ::testing::AssertionResult close_rounded_once(const Tensor& fast, const Tensor& truth, const Tensor& abs_sum,
                                                     double terms, const std::string& what = "") {
  const std::vector<double> f = fast.to_vector_f64(), r = truth.to_vector_f64(), a = abs_sum.to_vector_f64();
  const DType t = fast.dtype();
  return close(
      fast.to(DType::f64), truth.to(DType::f64),
      [&](size_t i) { return 0.5 * std::max(ulp_of(t, f[i]), ulp_of(t, r[i])) + terms * kU32 * a[i] + 1e-30; }, what);
}

}  // namespace mixprec::convtest
