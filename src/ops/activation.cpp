// Activations: relu, gelu (exact erf form, or tanh approximation), dropout (autocast class: keep).
#include "ops/common.h"

namespace mixprec::ops {

Tensor relu(const Tensor& x_in) {
  Tensor x = x_in;
  amp::autocast(OpId::relu, {&x});
  check_floating(x, "relu");
  Tensor out = kernels::unary(kernels::UnaryOp::relu, x);
  Tensor saved = out.detach();  // relu'(x) = [y > 0]: saving y lets x be freed
  return autograd::record(
      out, "relu", {x},
      [saved](const Tensor& g, const autograd::Node&) {
        return std::vector<Tensor>{kernels::unary_grad(kernels::UnaryGradOp::relu, g, saved)};
      },
      {saved});
}

Tensor gelu(const Tensor& x_in, bool tanh_approx) {
  Tensor x = x_in;
  amp::autocast(OpId::gelu, {&x});
  check_floating(x, "gelu");
  Tensor out = kernels::unary(tanh_approx ? kernels::UnaryOp::gelu_tanh : kernels::UnaryOp::gelu, x);
  Tensor saved = x.detach();
  return autograd::record(out, "gelu", {x}, [saved, tanh_approx](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::unary_grad(
        tanh_approx ? kernels::UnaryGradOp::gelu_tanh : kernels::UnaryGradOp::gelu, g, saved)};
  },
                          {saved});
}

Tensor dropout(const Tensor& x_in, double p, bool training, Generator* gen) {
  MIXPREC_CHECK(p >= 0.0 && p < 1.0, "dropout: probability must be in [0, 1), got ", p);
  Tensor x = x_in;
  amp::autocast(OpId::dropout, {&x});
  check_floating(x, "dropout");
  if (!training || p == 0.0) return x;
  // Mask holds 0 or 1/(1-p) in x's dtype: inverted dropout, as in PyTorch.
  Tensor mask = kernels::dropout_mask(x.shape(), x.dtype(), p, gen ? *gen : default_generator());
  Tensor out = kernels::binary(kernels::BinaryOp::mul, x, mask);
  return autograd::record(out, "dropout", {x}, [mask](const Tensor& gr, const autograd::Node&) {
    return std::vector<Tensor>{kernels::binary(kernels::BinaryOp::mul, gr, mask)};
  });
}

}  // namespace mixprec::ops
