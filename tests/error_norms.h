// The largest and the root-mean-square absolute difference between two tensors' values (a NaN
// counts as an infinite difference), for the kernel tests that bound both against an f64 truth
// (test_attention.cpp; tests/emulated/).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::testing {

struct Err {
  double max = 0, rms = 0;
};

inline Err error_of(const Tensor& got, const Tensor& truth) {
  const std::vector<double> g = got.to_vector_f64(), w = truth.to_vector_f64();
  Err e;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::fabs(g[i] - w[i]);
    e.max = std::max(e.max, std::isnan(d) ? INFINITY : d);
    e.rms += d * d;
  }
  e.rms = std::sqrt(e.rms / double(std::max<size_t>(g.size(), 1)));
  return e;
}

}  // namespace mixprec::testing
