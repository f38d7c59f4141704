// The unit in the last place of v in dtype t (the subnormal spacing at the bottom of the
// range): the base of the dtype-aware tolerances in the fast-vs-reference tests.
#pragma once
#include <algorithm>
#include <cmath>

#include "mixprec/dtype.h"

namespace mixprec::testutil {

inline double ulp_of(DType t, double v) {
  int mant = 23, emin = -126;
  if (t == DType::bf16) mant = 7;
  if (t == DType::f16) mant = 10, emin = -14;
  if (t == DType::f64) mant = 52, emin = -1022;
  v = std::fabs(v);
  if (v == 0 || !std::isfinite(v)) return std::ldexp(1.0, emin - mant);
  int e;
  std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 1, emin) - mant);
}

}  // namespace mixprec::testutil
