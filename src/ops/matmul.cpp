// matmul and linear (autocast class lower): oneDNN on the fast path, reference otherwise.
#include <optional>

#include "ops/common.h"

namespace mixprec::ops {
namespace {

// dst[m,n] = op(a) @ op(b), or [B, m, n] with one product per batch for [B, ., .] operands; in
// the dtype of a (inputs share a dtype after autocast/promotion), or in f32 from 16-bit
// operands (products accumulate in f32 either way). op transposes the last two dims.
Tensor mm(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor* bias = nullptr,
          std::optional<DType> dst_t = std::nullopt, bool relu = false) {
  const int64_t r = a.dim() - 2;  // 1 when batched
  const int64_t m = ta ? a.size(r + 1) : a.size(r), n = tb ? b.size(r) : b.size(r + 1);
  Tensor dst = Tensor::empty(r ? Shape{a.size(0), m, n} : Shape{m, n}, dst_t.value_or(a.dtype()), a.device());
  kernels::MatmulOpts o;
  o.trans_a = ta;
  o.trans_b = tb;
  o.bias = bias;
  o.relu = relu;
  kernels::matmul(a, b, dst, o);
  return dst;
}

// The batched product of matmul: batch dims broadcast as PyTorch's, then one product per batch.
Tensor batched_matmul(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2), b_batch(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = kernels::broadcast_shapes(a_batch, b_batch, "matmul");
  const int64_t nb = shape_numel(batch);
  auto with = [&](Shape s, int64_t r, int64_t c) {
    s.push_back(r);
    s.push_back(c);
    return s;
  };
  // Broadcast (a stride-0 view), then [nb, ., .]: views when nothing repeats and the operand is
  // dense, a copy otherwise. All recorded ops, so gradients find their way back through them.
  const Tensor a3 = reshape(contiguous(expand(a, with(batch, m, k))), {nb, m, k});
  const Tensor b3 = reshape(contiguous(expand(b, with(batch, k, n))), {nb, k, n});
  const Tensor ad = a3.detach(), bd = b3.detach();
  Tensor out = mm(ad, bd, false, false);
  out = autograd::record(out, "matmul", {a3, b3},
                         [ad, bd](const Tensor& g, const autograd::Node& node) {
                           const Tensor gc = kernels::contig(g);
                           Tensor ga, gb;
                           if (node.needs_grad(0)) ga = mm(gc, bd, false, true);  // g @ b^T
                           if (node.needs_grad(1)) gb = mm(ad, gc, true, false);  // a^T @ g
                           return std::vector<Tensor>{ga, gb};
                         },
                         {ad, bd});
  return reshape(out, with(batch, m, n));
}

void same_dtype(Tensor& a, Tensor& b, std::string_view op) {
  if (a.dtype() != b.dtype()) {
    const DType t = promote_floating(a.dtype(), b.dtype());
    a = a.to(t);
    b = b.to(t);
  }
  (void)op;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  Tensor a = a_in, b = b_in;
  amp::autocast(OpId::matmul, {&a, &b});
  check_floating(a, "matmul", "first operand");
  check_floating(b, "matmul", "second operand");
  same_dtype(a, b, "matmul");
  MIXPREC_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: expected [.., m, k] @ [.., k, n], got ", shape_str(a.shape()),
                " @ ", shape_str(b.shape()), " (1-d operands are not supported)");
  MIXPREC_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: ", shape_str(a.shape()), " @ ",
                shape_str(b.shape()));
  if (b.dim() > 2) return batched_matmul(a, b);
  Shape out_shape = a.shape();
  out_shape.back() = b.size(1);
  Tensor a2 = kernels::contig(a.detach()).reshape({-1, a.size(-1)});
  Tensor bd = b.detach();
  Tensor out = mm(a2, bd, false, false).reshape(out_shape);
  return autograd::record(out, "matmul", {a, b},
                          [a2, bd, a_shape = a.shape()](const Tensor& g, const autograd::Node& n) {
                            Tensor g2 = kernels::contig(g).reshape({-1, g.size(-1)});
                            Tensor ga, gb;
                            if (n.needs_grad(0)) ga = mm(g2, bd, false, true).reshape(a_shape);  // g @ b^T
                            if (n.needs_grad(1)) gb = mm(a2, g2, true, false);                   // a^T @ g
                            return std::vector<Tensor>{ga, gb};
                          },
                          {a2, bd});
}

namespace {

Tensor linear_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool relu) {
  Tensor x = x_in, w = w_in, b = b_in;
  amp::autocast(OpId::linear, {&x, &w, &b});
  check_floating(x, "linear", "input");
  check_floating(w, "linear", "weight");
  MIXPREC_CHECK(w.dim() == 2, "linear: weight must be [out, in], got ", shape_str(w.shape()));
  MIXPREC_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input ", shape_str(x.shape()),
                " does not end in in_features = ", w.size(1), " of weight ", shape_str(w.shape()));
  MIXPREC_CHECK(x.dtype() == w.dtype(), "linear: input is ", dtype_name(x.dtype()), " but weight is ",
                dtype_name(w.dtype()), " (use autocast, or cast one of them)");
  if (b.defined()) {
    MIXPREC_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "linear: bias must be [", w.size(0), "], got ",
                  shape_str(b.shape()));
    if (b.dtype() != x.dtype()) b = b.to(x.dtype());
  }
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  Tensor x2 = kernels::contig(x.detach()).reshape({-1, x.size(-1)});  // [M, in]
  Tensor wd = w.detach();                                             // [out, in]
  Tensor bd = b.defined() ? b.detach() : Tensor();
  Tensor out =
      mm(x2, wd, false, true, bd.defined() ? &bd : nullptr, std::nullopt, relu).reshape(out_shape);  // [M, out]
  // An f32 weight or bias that only casts turned bf16 (autocast's copy) gets its gradient in
  // f32 straight from the bf16 operands: the graph edge goes to the f32 tensor, past the cast
  // node. The gradient is the cast path's without its rounding to bf16, and without the bf16
  // write and the cast pass back to f32. Not for f16: its gradients are meant to be stored in
  // f16, with f16's range (what loss scaling is for). See docs/design.md (Autocast).
  const bool w_wide = w_in.dtype() == DType::f32 && w.dtype() == DType::bf16;
  const bool b_wide = b.defined() && b_in.dtype() == DType::f32 && b.dtype() == DType::bf16;
  std::vector<Tensor> inputs{x, w_wide ? w_in : w};
  if (b.defined()) inputs.push_back(b_wide ? b_in : b);
  // relu'(.) = [y > 0]: the output is saved for the mask and dropped once applied (mutable).
  Tensor y_mask = relu ? out.detach() : Tensor();
  auto backward = [x2, wd, w_wide, b_wide, y_mask, x_shape = x.shape()](const Tensor& g_in,
                                                                        const autograd::Node& n) mutable {
    const Tensor g = y_mask.defined() ? relu_masked_grad(g_in, y_mask) : kernels::contig(g_in);
    Tensor g2 = g.reshape({-1, g.size(-1)});  // [M, out]
    std::vector<Tensor> grads(n.next.size());
    const DType gt = g2.dtype();
    // The bias gradient first, while g (just written by the node before) is still in cache: after the
    // two products it came back from memory (the gpt's amp-bf16 step: its 16 sums 3.1-3.8 ms against
    // 4.0-4.8, `mixprec bench --model gpt --profile`, Emerald Rapids guest).
    if (n.next.size() > 2 && n.needs_grad(2)) grads[2] = kernels::sum(g2, {0}, false, b_wide ? DType::f32 : gt);
    if (n.needs_grad(0)) grads[0] = mm(g2, wd, false, false).reshape(x_shape);                   // [M,out]@[out,in]
    if (n.needs_grad(1)) grads[1] = mm(g2, x2, true, false, nullptr, w_wide ? DType::f32 : gt);  // [out,M]@[M,in]
    return grads;
  };
  return autograd::record(out, relu ? "linear_relu" : "linear", inputs, std::move(backward), {x2, wd, y_mask});
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return linear_impl(x, w, b, false); }
Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& b) { return linear_impl(x, w, b, true); }

}  // namespace mixprec::ops
