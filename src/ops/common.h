// Helpers shared by the op families: dimension wrapping, un-broadcasting of gradients.
#pragma once
#include <string_view>

#include "amp/autocast_state.h"
#include "kernels/kernels.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"

namespace mixprec::ops {

inline int64_t wrap_dim(int64_t d, int64_t nd, std::string_view op) {
  const int64_t w = d < 0 ? d + nd : d;
  MIXPREC_CHECK(w >= 0 && w < std::max<int64_t>(nd, 1), op, ": dimension ", d, " out of range for ", nd, "-d input");
  return w;
}

inline void check_floating(const Tensor& x, std::string_view op, std::string_view what = "input") {
  MIXPREC_CHECK(x.defined(), op, ": ", what, " is undefined");
  MIXPREC_CHECK(is_floating(x.dtype()), op, ": ", what, " must be floating, got ", dtype_name(x.dtype()));
}

// Sums a broadcast gradient back down to `shape` (the input's shape before broadcasting).
inline Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t lead = g.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < g.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(int64_t(i));
  Tensor s = kernels::sum(g, dims, /*keepdim=*/true, g.dtype());
  return s.detach().reshape(shape);
}

}  // namespace mixprec::ops
