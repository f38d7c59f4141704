// |got - ref| <= 2 ulp_t(ref) + (k + 2) u32 S + rounds * ulp_t(S) element by element (S: the
// largest |ref|, u32 = 2^-24; see test_op_backends.cpp), dtype and shape equal: the bound of the
// fast-vs-reference tests (op_cases.h's drivers, the CUDA suites, tests/emulated/).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "mixprec/tensor.h"
#include "ulp.h"

namespace mixprec::testing {

inline ::testing::AssertionResult agree_within_bound(const Tensor& got, const Tensor& ref, int64_t k, int rounds,
                                                     const std::string& what) {
  constexpr double kU32 = 0x1p-24;
  if (!ref.defined())
    return got.defined() ? ::testing::AssertionFailure() << what << ": result defined, reference not"
                         : ::testing::AssertionSuccess();
  if (!got.defined() || got.dtype() != ref.dtype() || got.shape() != ref.shape())
    return ::testing::AssertionFailure() << what << ": result "
                                         << (got.defined() ? shape_str(got.shape()) : "undefined") << " vs reference "
                                         << shape_str(ref.shape()) << " " << dtype_name(ref.dtype());
  const std::vector<double> f = got.to_vector_f64(), r = ref.to_vector_f64();
  double scale = 0;
  for (double v : r) scale = std::max(scale, std::fabs(v));
  const DType t = ref.dtype();
  std::ostringstream msg;
  msg.precision(10);
  int bad = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double tol =
        2 * testutil::ulp_of(t, r[i]) + double(k + 2) * kU32 * scale + rounds * testutil::ulp_of(t, scale);
    const bool ok =
        std::isfinite(r[i]) ? std::fabs(f[i] - r[i]) <= tol : (std::isnan(r[i]) ? std::isnan(f[i]) : f[i] == r[i]);
    if (!ok && bad++ < 4) msg << "\n  element " << i << ": got " << f[i] << " reference " << r[i] << " tol " << tol;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << r.size() << " elements differ ("
                                       << dtype_name(t) << " " << shape_str(ref.shape()) << ")" << msg.str();
}

}  // namespace mixprec::testing
