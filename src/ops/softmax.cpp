// softmax and log_softmax over one dimension (autocast class fp32).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

Tensor softmax_impl(OpId id, Tensor x, int64_t dim, bool log) {
  amp::autocast(id, {&x});
  check_floating(x, op_name(id));
  MIXPREC_CHECK(x.dim() >= 1, op_name(id), ": needs at least 1 dimension, got a scalar");
  const int64_t d = wrap_dim(dim, x.dim(), op_name(id));
  const int64_t last = x.dim() - 1;
  // The kernels work on the last dim: move `dim` there and back.
  Tensor xl = d == last ? x.detach() : kernels::contig(x.detach().transpose(d, last));
  Tensor y = kernels::softmax_lastdim(xl, log);
  Tensor out = d == last ? y : kernels::contig(y.transpose(d, last));
  // When d == last, out *is* y: the lambda holds a detached handle, or out -> node -> out is a cycle.
  Tensor saved = y.detach();
  return autograd::record(out, op_name(id), {x},
                          [y = saved, d, last, log](const Tensor& g, const autograd::Node&) {
                            Tensor gl = d == last ? g : kernels::contig(g.transpose(d, last));
                            Tensor gx = kernels::softmax_lastdim_backward(y, gl, log);
                            return std::vector<Tensor>{d == last ? gx : kernels::contig(gx.transpose(d, last))};
                          },
                          {saved});
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(OpId::softmax, x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(OpId::log_softmax, x, dim, true); }

}  // namespace mixprec::ops
