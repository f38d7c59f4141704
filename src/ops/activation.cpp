// Activations (autocast class keep): relu, gelu (exact erf form, or tanh approximation), silu,
// sigmoid, tanh (kernels: kernels/activation.h), and dropout.
#include "ops/common.h"

namespace mixprec::ops {
namespace {

// The backward reads the output (relu, sigmoid, tanh: the input can be freed) or the input
// (gelu, silu), as kernels::grad_from_output says.
Tensor activation_op(OpId id, kernels::Activation act, Tensor x) {
  amp::autocast(id, {&x});
  check_floating(x, op_name(id));
  Tensor out = kernels::activation(act, x);
  Tensor saved = kernels::grad_from_output(act) ? out.detach() : x.detach();
  return autograd::record(out, op_name(id), {x},
                          [saved, act](const Tensor& g, const autograd::Node&) {
                            return std::vector<Tensor>{kernels::activation_grad(act, g, saved)};
                          },
                          {saved});
}

}  // namespace

Tensor relu(const Tensor& x) { return activation_op(OpId::relu, kernels::Activation::relu, x); }
Tensor gelu(const Tensor& x, bool tanh_approx) {
  return activation_op(OpId::gelu, tanh_approx ? kernels::Activation::gelu_tanh : kernels::Activation::gelu, x);
}
Tensor silu(const Tensor& x) { return activation_op(OpId::silu, kernels::Activation::silu, x); }
Tensor sigmoid(const Tensor& x) { return activation_op(OpId::sigmoid, kernels::Activation::sigmoid, x); }
Tensor tanh(const Tensor& x) { return activation_op(OpId::tanh, kernels::Activation::tanh, x); }

Tensor dropout(const Tensor& x_in, double p, bool training, Generator* gen) {
  MIXPREC_CHECK(p >= 0.0 && p < 1.0, "dropout: probability must be in [0, 1), got ", p);
  Tensor x = x_in;
  amp::autocast(OpId::dropout, {&x});
  check_floating(x, "dropout");
  if (!training || p == 0.0) return x;
  // Mask holds 0 or 1/(1-p) in x's dtype: inverted dropout, as in PyTorch.
  Tensor mask = kernels::dropout_mask(x.shape(), x.dtype(), p, gen ? *gen : default_generator(), x.device());
  Tensor out = kernels::binary(kernels::BinaryOp::mul, x, mask);
  return autograd::record(out, "dropout", {x}, [mask](const Tensor& gr, const autograd::Node&) {
    return std::vector<Tensor>{kernels::binary(kernels::BinaryOp::mul, gr, mask)};
  });
}

}  // namespace mixprec::ops
