// Normalisation: batch_norm with running statistics and train/eval modes (autocast class mixed: a
// 16-bit input stays 16-bit, its weight and bias f32, statistics in f32, the output in the input's
// dtype), and layer_norm over trailing dims (class fp32: 16-bit inputs are upcast; under a 16-bit
// autocast it saves x̂ in that dtype).
#include "ops/common.h"

namespace mixprec::ops {
namespace {

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

void check_param(const Tensor& t, std::string_view op, std::string_view what, const Shape& expected, const Tensor& x) {
  if (!t.defined()) return;
  check_floating(t, op, what);
  MIXPREC_CHECK(t.shape() == expected, op, ": ", what, " must be ", shape_str(expected), " for input ",
                shape_str(x.shape()), ", got ", shape_str(t.shape()));
}

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var, const Tensor& w_in,
                  const Tensor& b_in, bool training, double momentum, double eps) {
  Tensor x = x_in, w = w_in, b = b_in;
  amp::autocast(OpId::batch_norm, {&x, &w, &b});
  check_floating(x, "batch_norm", "input");
  MIXPREC_CHECK(x.dim() >= 2, "batch_norm: input must be [N, C, ...], got ", shape_str(x.shape()));
  MIXPREC_CHECK(eps > 0 && momentum >= 0 && momentum <= 1, "batch_norm: need eps > 0 and momentum in [0, 1], got eps ",
                eps, ", momentum ", momentum);
  const int64_t channels = x.size(1);
  check_param(w, "batch_norm", "weight", {channels}, x);
  check_param(b, "batch_norm", "bias", {channels}, x);
  check_param(running_mean, "batch_norm", "running_mean", {channels}, x);
  check_param(running_var, "batch_norm", "running_var", {channels}, x);
  MIXPREC_CHECK(running_mean.defined() == running_var.defined(),
                "batch_norm: give both running_mean and running_var, or neither");
  MIXPREC_CHECK(training || running_mean.defined(), "batch_norm: eval mode needs running_mean and running_var");
  const int64_t count = channels ? x.numel() / channels : 0;
  MIXPREC_CHECK(!training || count > 1, "batch_norm: training needs more than 1 value per channel, got input ",
                shape_str(x.shape()));

  const DType st = stats_dtype(x.dtype());
  const Tensor xd = kernels::contig(x.detach());
  Tensor mean, var;
  if (training) {
    kernels::batch_norm_stats(xd, channels, mean, var);
    if (running_mean.defined()) {
      // PyTorch: the running variance takes the unbiased batch variance.
      Tensor rm = running_mean, rv = running_var;
      rm.copy_(kernels::batch_norm_running(rm, mean, 1.0, momentum));
      rv.copy_(kernels::batch_norm_running(rv, var, double(count) / double(count - 1), momentum));
    }
  } else {
    mean = kernels::cast(running_mean, st);
    var = running_var;
  }
  const Tensor invstd = kernels::batch_norm_invstd(var, eps, st);
  const Tensor wd = w.defined() ? w.detach() : Tensor(), bd = b.defined() ? b.detach() : Tensor();
  Tensor out = kernels::batch_norm_forward(xd, mean, invstd, wd, bd);

  std::vector<Tensor> inputs{x, w, b};
  return autograd::record(out, "batch_norm", inputs,
                          [=](const Tensor& gy, const autograd::Node& n) {
                            kernels::NormGrads g =
                                kernels::batch_norm_backward(kernels::contig(gy), xd, mean, invstd, wd, training,
                                                             n.needs_grad(0), n.needs_grad(1), n.needs_grad(2));
                            return std::vector<Tensor>{g.x, g.weight, g.bias};
                          },
                          {xd, mean, wd});
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& w_in, const Tensor& b_in, double eps,
                  std::optional<DType> out_dtype) {
  Tensor x = x_in, w = w_in, b = b_in;
  amp::autocast(OpId::layer_norm, {&x, &w, &b});
  check_floating(x, "layer_norm", "input");
  MIXPREC_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  const DType y_dtype = out_dtype.value_or(x.dtype());
  MIXPREC_CHECK(is_floating(y_dtype), "layer_norm: out_dtype must be a floating dtype, got ", dtype_name(y_dtype));
  const size_t k = normalized_shape.size();
  bool fits = k >= 1 && k <= size_t(x.dim());
  for (size_t i = 0; fits && i < k; ++i) fits = normalized_shape[i] == x.shape()[x.shape().size() - k + i];
  MIXPREC_CHECK(fits, "layer_norm: normalized_shape ", shape_str(normalized_shape),
                " is not the trailing shape of input ", shape_str(x.shape()));
  check_param(w, "layer_norm", "weight", normalized_shape, x);
  check_param(b, "layer_norm", "bias", normalized_shape, x);
  const int64_t cols = shape_numel(normalized_shape);
  MIXPREC_CHECK(cols >= 1, "layer_norm: normalized_shape ", shape_str(normalized_shape), " is empty");
  const int64_t rows = x.numel() / cols;

  const Tensor x2 = kernels::contig(x.detach()).reshape({rows, cols});
  const Tensor wd = w.defined() ? w.detach() : Tensor(), bd = b.defined() ? b.detach() : Tensor();
  Tensor mean, rstd;
  // Under autocast with a 16-bit dtype the norm computes in f32, as its class says, but saves for
  // backward the normalised input x̂ in that dtype (written by the forward kernel) instead of its
  // f32 input: in a pre-norm transformer those inputs are the f32 residual stream, the largest
  // activations autocast keeps in f32. x̂ is rounded once (a relative 2^-9 in bf16, 2^-11 in fp16,
  // the rounding the following 16-bit matmul applies to the norm's output anyway), and backward
  // needs no mean: docs/design.md, "Layer norm under autocast".
  const DeviceType dev = x.device().type;
  const bool save_xhat = x.dtype() == DType::f32 && amp::is_autocast_enabled(dev) &&
                         is_half(amp::autocast_dtype(dev)) && autograd::grad_enabled() &&
                         autograd::any_requires_grad({x, w, b});
  const Tensor xhat = save_xhat ? Tensor::empty({rows, cols}, amp::autocast_dtype(dev), x.device()) : Tensor();
  Tensor out = kernels::layer_norm_forward(x2, wd, bd, eps, mean, rstd, xhat, y_dtype).reshape(x.shape());
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype();
  const Tensor saved_x = save_xhat ? xhat : x2, saved_mean = save_xhat ? Tensor() : mean;
  return autograd::record(out, "layer_norm", {x, w, b},
                          [=](const Tensor& gy, const autograd::Node& n) {
                            kernels::NormGrads g = kernels::layer_norm_backward(
                                kernels::contig(gy).reshape({rows, cols}), saved_x, saved_mean, rstd, wd,
                                n.needs_grad(0), n.needs_grad(1), n.needs_grad(2), x_dtype);
                            if (g.x.defined()) g.x = g.x.reshape(x_shape);
                            if (g.weight.defined()) g.weight = g.weight.reshape(normalized_shape);
                            if (g.bias.defined()) g.bias = g.bias.reshape(normalized_shape);
                            return std::vector<Tensor>{g.x, g.weight, g.bias};
                          },
                          {save_xhat ? Tensor() : x2, wd});
}

}  // namespace mixprec::ops
