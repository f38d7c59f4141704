// Losses: nll_loss, cross_entropy (integer class targets) and mse_loss (autocast class fp32).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

double reduction_scale(Reduction r, int64_t n) {
  return r == Reduction::mean ? 1.0 / double(std::max<int64_t>(n, 1)) : 1.0;
}

}  // namespace

// log_probs [N, C], target i64 [N]: loss_i = -log_probs[i, target_i].
Tensor nll_loss(const Tensor& lp_in, const Tensor& target, Reduction r) {
  Tensor lp = lp_in;
  amp::autocast(OpId::nll_loss, {&lp});
  check_floating(lp, "nll_loss", "log_probs");
  MIXPREC_CHECK(lp.dim() == 2, "nll_loss: log_probs must be [N, C], got ", shape_str(lp.shape()));
  MIXPREC_CHECK(target.dtype() == DType::i64 && target.dim() == 1 && target.size(0) == lp.size(0),
                "nll_loss: target must be i64 [", lp.size(0), "], got ", dtype_name(target.dtype()), " ",
                shape_str(target.shape()));
  const int64_t n = lp.size(0), c = lp.size(1);
  const bool reduce = r != Reduction::none;
  const double scale = reduction_scale(r, n);
  Tensor out = kernels::nll_loss_forward(lp, target, reduce, scale);
  const DType dt = lp.dtype();
  const Tensor t = target.detach();
  return autograd::record(out, "nll_loss", {lp}, [=](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::nll_loss_backward(g, t, c, reduce, scale, dt)};
  });
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, Reduction r) {
  Tensor logits = logits_in;
  amp::autocast(OpId::cross_entropy, {&logits});
  check_floating(logits, "cross_entropy", "logits");
  MIXPREC_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, C], got ", shape_str(logits.shape()));
  return nll_loss(log_softmax(logits, 1), target, r);
}

Tensor mse_loss(const Tensor& in, const Tensor& tg, Reduction r) {
  Tensor input = in, target = tg;
  amp::autocast(OpId::mse_loss, {&input, &target});
  check_floating(input, "mse_loss", "input");
  check_floating(target, "mse_loss", "target");
  MIXPREC_CHECK(input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()), " and target ",
                shape_str(target.shape()), " differ in shape");
  Tensor diff = sub(input, target);
  Tensor sq = mul(diff, diff);
  if (r == Reduction::none) return sq;
  return r == Reduction::mean ? mean(sq) : sum(sq);
}

}  // namespace mixprec::ops
