// cat: concatenation along one dimension (autocast class promote: mixed floating dtypes go to
// the widest, inside autocast or not, as in PyTorch).
#include "ops/common.h"

namespace mixprec::ops {

Tensor cat(const std::vector<Tensor>& xs_in, int64_t dim) {
  MIXPREC_CHECK(!xs_in.empty(), "cat: needs at least one tensor");
  std::vector<Tensor> xs = xs_in;
  // Promotion is cat's whole autocast policy (OpId::cat is `promote`) and applies outside autocast
  // too, so it is done here for any number of inputs (amp::autocast takes a fixed list).
  DType t = xs[0].defined() ? xs[0].dtype() : DType::f32;
  for (size_t i = 0; i < xs.size(); ++i) {
    MIXPREC_CHECK(xs[i].defined(), "cat: tensor ", i, " is undefined");
    if (is_floating(xs[i].dtype()) && is_floating(t)) t = promote_floating(t, xs[i].dtype());
    else MIXPREC_CHECK(xs[i].dtype() == t, "cat: tensor ", i, " is ", dtype_name(xs[i].dtype()), " but tensor 0 is ",
                       dtype_name(xs[0].dtype()));
  }
  for (Tensor& x : xs)
    if (x.dtype() != t) x = x.to(t);
  const Tensor& first = xs[0];
  const int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[size_t(d)] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    bool fits = xs[i].dim() == first.dim();
    for (int64_t k = 0; fits && k < first.dim(); ++k) fits = k == d || xs[i].size(k) == first.size(k);
    MIXPREC_CHECK(fits, "cat: tensor ", i, " has shape ", shape_str(xs[i].shape()), " but tensor 0 has ",
                  shape_str(first.shape()), "; all dims but ", d, " must match");
    out_shape[size_t(d)] += xs[i].size(d);
  }
  Tensor out = Tensor::empty(out_shape, t);
  std::vector<int64_t> offsets;
  int64_t off = 0;
  for (const Tensor& x : xs) {
    Tensor part = out.slice(d, off, off + x.size(d));  // a view: out requires no grad yet
    kernels::copy(x.detach(), part);
    offsets.push_back(off);
    off += x.size(d);
  }
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.size(d));
  return autograd::record(out, "cat", xs, [d, offsets, sizes](const Tensor& g, const autograd::Node& n) {
    std::vector<Tensor> grads(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i)
      if (n.needs_grad(i)) grads[i] = kernels::contig(g.slice(d, offsets[i], offsets[i] + sizes[i]));
    return grads;
  });
}

}  // namespace mixprec::ops
