// Reductions: sum and mean over all or some dims (autocast class fp32; accumulate in f32/f64).
#include <algorithm>

#include "ops/common.h"

namespace mixprec::ops {
namespace {

std::vector<int64_t> normalize_dims(std::vector<int64_t> dims, int64_t nd, std::string_view op) {
  for (int64_t& d : dims) d = wrap_dim(d, nd, op);
  std::sort(dims.begin(), dims.end());
  MIXPREC_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op, ": repeated dimension");
  return dims;
}

Tensor reduce(OpId id, Tensor x, std::vector<int64_t> dims, bool keepdim, bool all) {
  amp::autocast(id, {&x});
  check_floating(x, op_name(id));
  if (all) {
    dims.clear();
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  }
  dims = normalize_dims(dims, x.dim(), op_name(id));
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  Tensor out = kernels::sum(x, dims, keepdim, x.dtype());
  const bool is_mean = id == OpId::mean;
  if (is_mean) out = kernels::unary(kernels::UnaryOp::affine, out, {1.0 / double(std::max<int64_t>(count, 1)), 0.0});
  const Shape in_shape = x.shape();
  Shape kept = in_shape;
  for (int64_t d : dims) kept[size_t(d)] = 1;
  return autograd::record(out, op_name(id), {x}, [=](const Tensor& g, const autograd::Node&) {
    // Broadcast the gradient back over the reduced dims.
    Tensor gk = kernels::contig(g).reshape(kept);
    if (is_mean) gk = kernels::unary(kernels::UnaryOp::affine, gk, {1.0 / double(std::max<int64_t>(count, 1)), 0.0});
    Tensor zeros = Tensor::zeros(in_shape, g.dtype(), g.device());
    return std::vector<Tensor>{kernels::binary(kernels::BinaryOp::add, zeros, gk)};
  });
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce(OpId::sum, x, {}, false, true); }
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpId::sum, x, std::move(dims), keepdim, false);
}
Tensor mean(const Tensor& x) { return reduce(OpId::mean, x, {}, false, true); }
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpId::mean, x, std::move(dims), keepdim, false);
}

}  // namespace mixprec::ops
