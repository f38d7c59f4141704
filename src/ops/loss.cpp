// Losses: nll_loss, cross_entropy (integer class targets, class dim last, ignore_index) and
// mse_loss (autocast class fp32).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

kernels::LossReduce loss_reduce(Reduction r) {
  return r == Reduction::mean  ? kernels::LossReduce::mean
         : r == Reduction::sum ? kernels::LossReduce::sum
                               : kernels::LossReduce::none;
}

// The target nll_loss and cross_entropy take: i64, the leading shape of x [..., C].
void check_target(const Tensor& x, const Tensor& target) {
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  MIXPREC_CHECK(target.defined() && target.dtype() == DType::i64 && target.shape() == lead,
                "nll_loss: target must be i64 ", shape_str(lead), " (log_probs ", shape_str(x.shape()),
                " with the class dim last), got ", target.defined() ? dtype_name(target.dtype()) : "undefined", " ",
                target.defined() ? shape_str(target.shape()) : "");
}

}  // namespace

// log_probs [..., C], target i64 of the leading shape: loss_i = -log_probs[i, target_i], 0 where
// target_i == ignore_index.
Tensor nll_loss(const Tensor& lp_in, const Tensor& target, Reduction r, int64_t ignore_index) {
  Tensor lp = lp_in;
  amp::autocast(OpId::nll_loss, {&lp});
  check_floating(lp, "nll_loss", "log_probs");
  MIXPREC_CHECK(lp.dim() >= 1, "nll_loss: log_probs must be [..., C], got ", shape_str(lp.shape()));
  check_target(lp, target);
  const kernels::LossReduce red = loss_reduce(r);
  Tensor out = kernels::nll_loss_forward(lp, target, red, ignore_index);
  const DType dt = lp.dtype();
  const Shape shape = lp.shape();
  const Tensor t = target.detach();
  return autograd::record(out, "nll_loss", {lp}, [=](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::nll_loss_backward(g, t, shape, red, ignore_index, dt)};
  });
}

// In f32 (f32 logits, or 16-bit ones under autocast, whose class fp32 would widen them) and f64:
// one kernel each way from the logits as stored, keeping them and each row's log-sum-exp for the
// backward, instead of an f32 copy, log_softmax's f32 output and nll_loss's dense f32 gradient
// (for a vocabulary of 50304 and 8192 rows, 1.6 GB each). The f32 losses and, on the CPU, the
// gradients are the composite's bits (kernels/loss.h). 16-bit logits outside autocast keep the
// composite, nll_loss of log_softmax, in their dtype.
Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, Reduction r, int64_t ignore_index) {
  Tensor logits = logits_in;
  const DType run = amp::autocast_widening(OpId::cross_entropy, {&logits});
  check_floating(logits, "cross_entropy", "logits");
  MIXPREC_CHECK(logits.dim() >= 1, "cross_entropy: logits must be [..., C], got ", shape_str(logits.shape()));
  if (is_half(run) || logits.numel() == 0) return nll_loss(log_softmax(logits, -1), target, r, ignore_index);
  check_target(logits, target);
  const kernels::LossReduce red = loss_reduce(r);
  const Tensor x = kernels::contig(logits.detach()), t = target.detach();
  kernels::CrossEntropyResult out = kernels::cross_entropy_forward(x, t, red, ignore_index);
  const Tensor lse = out.lse;
  return autograd::record(
      out.loss, "cross_entropy", {logits},
      [x, lse, t, red, ignore_index](const Tensor& g, const autograd::Node&) {
        return std::vector<Tensor>{kernels::cross_entropy_backward(g, x, lse, t, red, ignore_index)};
      },
      {x});
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
