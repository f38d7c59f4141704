// Helpers shared by the op families: dimension wrapping, un-broadcasting of gradients, the
// backward of a fused ReLU.
#pragma once
#include <string_view>

#include "autocast/autocast_state.h"
#include "kernels/kernels.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"

namespace mixprec::ops {

// cast(x, out.dtype())'s graph node over `out`, which already holds x's values in that dtype
// (ops/shape.cpp; autocast's kept copy of a parameter is one: autocast.cpp). Its backward casts
// the gradient back to x's dtype.
Tensor record_cast(const Tensor& x, const Tensor& out);

// A pooling's geometry over an input of shape x ([N, C, H, W]), its arguments checked for `op`
// (ops/pool.cpp; conv2d_max_pool2d's pool too).
kernels::PoolGeometry pool_geometry(std::string_view op, const Shape& x, IntPair k, const Pool2dOptions& o, bool max);

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

// The gradient through a fused ReLU (conv2d, linear_relu) whose output y the op saved: g
// masked by [y > 0]. In place when the engine's gradient is the op's alone (no other handle,
// no view of its bytes), since a second activation-sized buffer would raise the backward peak;
// else into a new tensor. y is dropped: this is its last use.
inline Tensor relu_masked_grad(const Tensor& g, Tensor& y) {
  // A detached view of g's bytes when g is in y's layout (contiguous, or channels-last), else a copy in it.
  Tensor out = kernels::in_layout_of(g, y);
  const bool exclusive =
      out.storage() == g.storage() && g.impl_ptr().use_count() == 1 && g.storage().use_count() == 2;  // g's and out's
  if (exclusive)
    kernels::relu_mask_inplace(out, y);
  else
    out = kernels::activation_grad(kernels::Activation::relu, out, y);
  y = Tensor();
  return out;
}

}  // namespace mixprec::ops
