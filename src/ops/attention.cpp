// scaled_dot_product_attention (autocast class lower): softmax(q k^T * scale + causal mask) v with
// dropout on the probabilities, forward and backward (kernels: kernels/attention.h).
#include <array>
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
  MIXPREC_CHECK(v.size(2) == k.size(2), kOp, ": v must have k's sequence length, got k ", shape_str(k.shape()), ", v ",
                shape_str(v.shape()));
  MIXPREC_CHECK(k.size(2) > 0 && q.size(3) > 0, kOp, ": needs at least one key and a head dim > 0, got k ",
                shape_str(k.shape()));
  MIXPREC_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, kOp, ": dropout must be in [0, 1), got ", o.dropout);
  MIXPREC_CHECK(!o.scale || std::isfinite(*o.scale), kOp, ": scale must be finite, got ", o.scale.value_or(0));
}

// The kernel's parameters; the dropout's one use of the generator.
kernels::AttentionParams params(const Tensor& q, const Tensor& k, const AttentionOptions& o) {
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
  return p;
}

// Part i (q, k, v) of a packed [B, T, 3 C] tensor as [B, H, T, E]: a view.
Tensor packed_part(const Tensor& qkv, int64_t heads, int64_t i) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  return qkv.slice(2, i * c, (i + 1) * c).reshape({b, t, heads, c / heads}).transpose(1, 2);
}

// The attention of the detached views qd, kd, vd, recorded as the op on `inputs`; at backward,
// `grads` is called with the kernels' backward (a function of where dq, dk, dv go: null, or views
// to write them into) and returns the inputs' gradients. `saved`: the tensors the views read
// (undefined ones are skipped), checked unchanged at backward with the output.
template <class Grads>
Tensor attention(const Tensor& qd, const Tensor& kd, const Tensor& vd, const AttentionOptions& o,
                 const std::vector<Tensor>& inputs, const std::array<Tensor, 3>& saved, Grads grads) {
  check_inputs(qd, kd, vd, o);
  const kernels::AttentionParams p = params(qd, kd, o);
  kernels::AttentionForward fwd = kernels::attention_forward(qd, kd, vd, p);
  Tensor out = fwd.out;
  fwd.out = out.detach();  // the lambda must not hold out with its grad_fn (a cycle)
  const Tensor saved_out = fwd.out;
  return autograd::record(out, kOp, inputs,
                          [qd, kd, vd, fwd, p, grads](const Tensor& g, const autograd::Node&) {
                            return grads([&](const kernels::AttentionGrads* into) {
                              return kernels::attention_backward(qd, kd, vd, fwd, g, p, into);
                            });
                          },
                          {saved[0], saved[1], saved[2], saved_out});
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const AttentionOptions& o) {
  Tensor q = q_in, k = k_in, v = v_in;
  amp::autocast(OpId::scaled_dot_product_attention, {&q, &k, &v});
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
  return attention(qd, kd, vd, o, {q, k, v}, {qd, kd, vd}, [](const auto& backward) {
    const kernels::AttentionGrads d = backward(nullptr);
    return std::vector<Tensor>{d.dq, d.dk, d.dv};
  });
}

Tensor packed_qkv_attention(const Tensor& qkv_in, int64_t heads, const AttentionOptions& o) {
  Tensor qkv = qkv_in;
  amp::autocast(OpId::scaled_dot_product_attention, {&qkv});
  check_floating(qkv, kOp, "qkv");
  MIXPREC_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && heads > 0 && (qkv.size(2) / 3) % heads == 0 &&
                    qkv.size(2) > 0 && qkv.size(1) > 0,
                kOp, ": packed qkv must be [B, T, 3 C] with C a multiple of the ", heads, " heads, got ",
                shape_str(qkv.shape()));
  const Tensor base = qkv.detach();
  const Shape shape = qkv.shape();
  const DType dtype = base.dtype();
  const Device device = base.device();
  return attention(packed_part(base, heads, 0), packed_part(base, heads, 1), packed_part(base, heads, 2), o, {qkv},
                   {base, Tensor(), Tensor()}, [heads, shape, dtype, device](const auto& backward) {
                     // The three parts cover the gradient: each written once into its view (by the
                     // kernel itself where it can), no zero fill and no sum of three qkv-sized
                     // gradients.
                     const Tensor dqkv = Tensor::empty(shape, dtype, device);
                     const kernels::AttentionGrads into{packed_part(dqkv, heads, 0), packed_part(dqkv, heads, 1),
                                                        packed_part(dqkv, heads, 2)};
                     for (const Tensor* part : {&into.dq, &into.dk, &into.dv})
                       MIXPREC_ASSERT(part->storage() == dqkv.storage(), "packed qkv: a part is not a view");
                     (void)backward(&into);
                     return std::vector<Tensor>{dqkv};
                   });
}

}  // namespace mixprec::ops
