// Element-wise add/sub/mul/div with numpy broadcasting (autocast class: promote).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

// Mixing dtypes promotes, inside autocast or not, as in PyTorch. The kernels take the pair as it
// is (no widened copy of the narrower operand: in a mixed-precision residual add, f32 stream plus a
// 16-bit branch, that copy would be a whole f32 activation at the forward's peak); the result and
// the gradients are those of casting first, and the engine casts each gradient to its input's dtype.
void check_pair(const Tensor& a, const Tensor& b, std::string_view op) {
  check_floating(a, op, "first operand");
  check_floating(b, op, "second operand");
}

Tensor binary_op(OpId id, kernels::BinaryOp kop, Tensor a, Tensor b) {
  amp::autocast(id, {&a, &b});
  check_pair(a, b, op_name(id));
  kernels::broadcast_shapes(a.shape(), b.shape(), op_name(id));  // names the op in the error
  Tensor out = kernels::binary(kop, a, b);
  const Shape sa = a.shape(), sb = b.shape();
  const bool need_a = kop == kernels::BinaryOp::mul || kop == kernels::BinaryOp::div;
  Tensor sa_saved = need_a ? b.detach() : Tensor();  // mul: da = g*b; div: da = g/b
  Tensor sb_saved = need_a ? a.detach() : Tensor();  // mul: db = g*a; div: db = -g*a/b^2
  return autograd::record(
      out, op_name(id), {a, b},
      [=](const Tensor& g, const autograd::Node& n) {
        using kernels::BinaryOp;
        Tensor ga, gb;
        switch (kop) {
          case BinaryOp::add:
            if (n.needs_grad(0)) ga = sum_to(g, sa);
            if (n.needs_grad(1)) gb = sum_to(g, sb);
            break;
          case BinaryOp::sub:
            if (n.needs_grad(0)) ga = sum_to(g, sa);
            if (n.needs_grad(1)) gb = sum_to(kernels::unary(kernels::UnaryOp::neg, g), sb);
            break;
          case BinaryOp::mul:
            if (n.needs_grad(0)) ga = sum_to(kernels::binary(BinaryOp::mul, g, sa_saved), sa);
            if (n.needs_grad(1)) gb = sum_to(kernels::binary(BinaryOp::mul, g, sb_saved), sb);
            break;
          case BinaryOp::div:
            if (n.needs_grad(0)) ga = sum_to(kernels::binary(BinaryOp::div, g, sa_saved), sa);
            if (n.needs_grad(1)) {
              // db = -g * a / b^2
              Tensor q = kernels::binary(BinaryOp::div, kernels::binary(BinaryOp::mul, g, sb_saved), sa_saved);
              gb = sum_to(kernels::unary(kernels::UnaryOp::neg, kernels::binary(BinaryOp::div, q, sa_saved)), sb);
            }
            break;
        }
        return std::vector<Tensor>{ga, gb};
      },
      {sa_saved, sb_saved});
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(OpId::add, kernels::BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(OpId::sub, kernels::BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(OpId::mul, kernels::BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(OpId::div, kernels::BinaryOp::div, a, b); }

}  // namespace mixprec::ops
