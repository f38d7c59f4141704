// BatchNorm2d (running statistics as buffers, PyTorch's state_dict names) and LayerNorm.
#include <sstream>

#include "kernels/optim.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"

namespace mixprec::nn {

BatchNorm2d::BatchNorm2d(int64_t n, BatchNormOptions o) : num_features(n), options(o) {
  MIXPREC_CHECK(n > 0, "BatchNorm2d(", n, "): num_features must be positive");
  MIXPREC_CHECK(o.eps > 0, "BatchNorm2d(", n, "): eps must be positive");
  MIXPREC_CHECK(!o.momentum || (*o.momentum >= 0 && *o.momentum <= 1), "BatchNorm2d(", n,
                "): momentum must be in [0, 1]");
  MemoryScope scope(MemCategory::parameters);
  if (o.affine) {
    weight = register_parameter("weight", Tensor::ones({n}));
    bias = register_parameter("bias", Tensor::zeros({n}));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", Tensor::zeros({n}));
    running_var = register_buffer("running_var", Tensor::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::scalar(0, DType::i64));
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  MIXPREC_CHECK(x.defined() && x.dim() == 4, name(), ": expected a 4-d input [N, C, H, W], got ",
                x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  MIXPREC_CHECK(x.size(1) == num_features, name(), ": input ", shape_str(x.shape()), " has ", x.size(1),
                " channels, expected ", num_features);
  const bool track = options.track_running_stats;
  const bool count = is_training() && track;
  // momentum nullopt: the cumulative moving average, 1/batches, which reads the count on the host
  // (as PyTorch does); a fixed momentum never does, so the forward never waits for a device.
  const double batches = count && !options.momentum ? num_batches_tracked.item() + 1 : 0;
  const double momentum = options.momentum ? *options.momentum : (count ? 1.0 / batches : 0.0);
  // Eval without running statistics normalises with the batch's, as PyTorch does.
  const bool batch_stats = is_training() || !track;
  Tensor y;
  try {
    y = ops::batch_norm(x, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias, batch_stats,
                        momentum, options.eps);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    throw Error(name() + ": " + e.what());
  }
  if (count) {
    kernels::increment(num_batches_tracked);
    num_batches_tracked.bump_version();
  }
  return y;
}

void BatchNorm2d::bind_parameter(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }
std::string BatchNorm2d::name() const {
  std::ostringstream os;
  os << "BatchNorm2d(" << num_features << ", eps=" << options.eps << ", momentum=";
  if (options.momentum)
    os << *options.momentum;
  else
    os << "None";
  os << ", affine=" << (options.affine ? "True" : "False")
     << ", track_running_stats=" << (options.track_running_stats ? "True" : "False") << ")";
  return os.str();
}

LayerNorm::LayerNorm(Shape shape, LayerNormOptions o) : normalized_shape(std::move(shape)), options(o) {
  MIXPREC_CHECK(!normalized_shape.empty() && shape_numel(normalized_shape) > 0, "LayerNorm(",
                shape_str(normalized_shape), "): normalized_shape must be non-empty");
  MemoryScope scope(MemCategory::parameters);
  if (o.elementwise_affine) {
    weight = register_parameter("weight", Tensor::ones(normalized_shape));
    bias = register_parameter("bias", Tensor::zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return forward(x, std::nullopt); }

Tensor LayerNorm::forward(const Tensor& x, std::optional<DType> out_dtype) {
  try {
    return ops::layer_norm(x, normalized_shape, weight, bias, options.eps, out_dtype);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    throw Error(name() + ": " + e.what());
  }
}

void LayerNorm::bind_parameter(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }
std::string LayerNorm::name() const {
  std::ostringstream os;
  os << "LayerNorm((";
  for (size_t i = 0; i < normalized_shape.size(); ++i) os << (i ? ", " : "") << normalized_shape[i];
  os << (normalized_shape.size() == 1 ? ",)" : ")") << ", eps=" << options.eps
     << ", elementwise_affine=" << (options.elementwise_affine ? "True" : "False") << ")";
  return os.str();
}

}  // namespace mixprec::nn
