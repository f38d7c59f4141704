// Unary math ops: neg and affine (keep their dtype), exp/log/pow/sqrt (autocast class fp32).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

using kernels::UnaryGradOp;
using kernels::UnaryOp;

Tensor unary_op(OpId id, UnaryOp op, Tensor x, kernels::UnaryParams p, std::optional<UnaryGradOp> grad_op) {
  amp::autocast(id, {&x});
  check_floating(x, op_name(id));
  Tensor out = kernels::unary(op, x, p);
  Tensor saved = grad_op ? x.detach() : Tensor();  // neg/affine need nothing: keep no activation
  return autograd::record(out, op_name(id), {x},
                          [=](const Tensor& g, const autograd::Node&) {
                            if (op == UnaryOp::neg) return std::vector<Tensor>{kernels::unary(UnaryOp::neg, g)};
                            if (op == UnaryOp::affine)
                              return std::vector<Tensor>{kernels::unary(UnaryOp::affine, g, {p.a, 0.0})};
                            return std::vector<Tensor>{kernels::unary_grad(*grad_op, g, saved, p)};
                          },
                          {saved});
}

}  // namespace

Tensor neg(const Tensor& x) { return unary_op(OpId::neg, UnaryOp::neg, x, {}, std::nullopt); }
Tensor affine(const Tensor& x, double scale, double shift) {
  return unary_op(OpId::affine, UnaryOp::affine, x, {scale, shift}, std::nullopt);
}
Tensor exp(const Tensor& x) { return unary_op(OpId::exp, UnaryOp::exp, x, {}, UnaryGradOp::exp); }
Tensor log(const Tensor& x) { return unary_op(OpId::log, UnaryOp::log, x, {}, UnaryGradOp::log); }
Tensor pow(const Tensor& x, double e) { return unary_op(OpId::pow, UnaryOp::pow, x, {e, 0.0}, UnaryGradOp::pow); }
Tensor sqrt(const Tensor& x) { return unary_op(OpId::sqrt, UnaryOp::sqrt, x, {}, UnaryGradOp::sqrt); }

}  // namespace mixprec::ops
