// scaled_dot_product_attention (autocast class lower): softmax(q k^T * scale + causal mask) v with
// dropout on the probabilities, forward and backward (kernels: kernels/attention.h).
#include <cmath>

#include "ops/common.h"

namespace mixprec::ops {
namespace {

constexpr std::string_view kOp = "scaled_dot_product_attention";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  check_floating(q, kOp, "q");
  check_floating(k, kOp, "k");
  check_floating(v, kOp, "v");
  MIXPREC_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kOp, ": q, k, v must be [B, H, T, E], got q ",
                shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  MIXPREC_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp, ": q, k, v must share a dtype, got ",
                dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  MIXPREC_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1),
                kOp, ": q, k, v must share batch and heads [B, H, ...], got q ", shape_str(q.shape()), ", k ",
                shape_str(k.shape()), ", v ", shape_str(v.shape()));
  MIXPREC_CHECK(k.size(3) == q.size(3), kOp, ": k's head dim must be q's, got q ", shape_str(q.shape()), ", k ",
                shape_str(k.shape()));
  MIXPREC_CHECK(v.size(2) == k.size(2), kOp, ": v must have k's sequence length, got k ", shape_str(k.shape()),
                ", v ", shape_str(v.shape()));
  MIXPREC_CHECK(k.size(2) > 0 && q.size(3) > 0, kOp, ": needs at least one key and a head dim > 0, got k ",
                shape_str(k.shape()));
  MIXPREC_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, kOp, ": dropout must be in [0, 1), got ", o.dropout);
  MIXPREC_CHECK(!o.scale || std::isfinite(*o.scale), kOp, ": scale must be finite, got ", o.scale.value_or(0));
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const AttentionOptions& o) {
  Tensor q = q_in, k = k_in, v = v_in;
  amp::autocast(OpId::scaled_dot_product_attention, {&q, &k, &v});
  check_inputs(q, k, v, o);
  kernels::AttentionParams p;
  p.causal = o.causal;
  p.scale = o.scale.value_or(1.0 / std::sqrt(double(q.size(3))));
  p.dropout = o.dropout;
  if (o.dropout > 0.0) {
    // One use of the generator: element (b, h, i, j) of the mask is word ((b H + h) Tq + i) Tk + j,
    // recomputed by the backward (and by every backend alike) instead of stored.
    Generator& gen = o.gen ? *o.gen : default_generator();
    p.first_block = gen.reserve(uint64_t(q.size(0) * q.size(1) * q.size(2) * k.size(2)));
    p.seed = gen.seed();
    p.stream = gen.stream();
  }
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
  kernels::AttentionForward fwd = kernels::attention_forward(qd, kd, vd, p);
  Tensor out = fwd.out;
  fwd.out = out.detach();  // the lambda must not hold out with its grad_fn (a cycle)
  const Tensor saved_out = fwd.out;
  return autograd::record(out, kOp, {q, k, v},
                          [qd, kd, vd, fwd, p](const Tensor& g, const autograd::Node&) {
                            kernels::AttentionGrads d = kernels::attention_backward(qd, kd, vd, fwd, g, p);
                            return std::vector<Tensor>{d.dq, d.dk, d.dv};
                          },
                          {qd, kd, vd, saved_out});
}

}  // namespace mixprec::ops
