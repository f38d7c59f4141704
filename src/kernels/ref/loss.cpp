// Reference negative log-likelihood: the gather of -log_probs[i, target_i] (summed in f64) and the
// scatter of the gradient back to log_probs' shape; ignored targets contribute nothing.
#include "kernels/loss.h"

#include <algorithm>
#include <cmath>

#include "mixprec/error.h"

namespace mixprec::kernels::ref {

double mean_scale(LossReduce r, const std::vector<int64_t>& t, int64_t ignore_index) {
  if (r != LossReduce::mean) return 1.0;
  int64_t count = 0;
  for (int64_t v : t) count += v != ignore_index;
  return 1.0 / double(count);
}

void check_class_targets(const std::vector<int64_t>& target, int64_t classes, int64_t ignore_index) {
  for (size_t i = 0; i < target.size(); ++i)
    MIXPREC_CHECK(target[i] == ignore_index || (target[i] >= 0 && target[i] < classes), "nll_loss: target[", i,
                  "] = ", target[i], " is not a class index in [0, ", classes, ")");
}

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, LossReduce r, int64_t ignore_index) {
  const int64_t c = log_probs.size(-1), n = c ? log_probs.numel() / c : target.numel();
  const std::vector<int64_t> t = target.to_vector_i64();
  check_class_targets(t, c, ignore_index);
  const std::vector<double> v = log_probs.to_vector_f64();
  std::vector<double> losses(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    losses[size_t(i)] = t[size_t(i)] == ignore_index ? 0.0 : -v[size_t(i * c + t[size_t(i)])];
    total += losses[size_t(i)];
  }
  return r != LossReduce::none ? Tensor::scalar(total * mean_scale(r, t, ignore_index), log_probs.dtype())
                               : Tensor::from_vector(losses, target.shape(), log_probs.dtype());
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, const Shape& lp_shape, LossReduce r,
                         int64_t ignore_index, DType dtype) {
  const std::vector<int64_t> t = target.to_vector_i64();
  const int64_t n = int64_t(t.size()), classes = lp_shape.empty() ? 1 : lp_shape.back();
  const std::vector<double> gv = grad.to_vector_f64();
  const double scale = mean_scale(r, t, ignore_index);
  std::vector<double> dx(size_t(n * classes), 0.0);
  for (int64_t i = 0; i < n; ++i)
    if (t[size_t(i)] != ignore_index)
      dx[size_t(i * classes + t[size_t(i)])] = -(r != LossReduce::none ? gv[0] * scale : gv[size_t(i)]);
  return Tensor::from_vector(dx, lp_shape, dtype);
}

CrossEntropyResult cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r,
                                         int64_t ignore_index) {
  const int64_t c = logits.size(-1), n = target.numel();
  const std::vector<int64_t> t = target.to_vector_i64();
  check_class_targets(t, c, ignore_index);
  const std::vector<double> x = logits.to_vector_f64();
  std::vector<double> lse(static_cast<size_t>(n)), losses(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = x.data() + i * c;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < c; ++j) sum += std::exp(row[j] - mx);
    lse[size_t(i)] = mx + std::log(sum);
    losses[size_t(i)] = t[size_t(i)] == ignore_index ? 0.0 : lse[size_t(i)] - row[t[size_t(i)]];
    total += losses[size_t(i)];
  }
  const DType od = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  CrossEntropyResult out;
  out.lse = Tensor::from_vector(lse, {n}, od);
  out.loss = r != LossReduce::none ? Tensor::scalar(total * mean_scale(r, t, ignore_index), od)
                                   : Tensor::from_vector(losses, target.shape(), od);
  return out;
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                              LossReduce r, int64_t ignore_index) {
  const int64_t c = logits.size(-1), n = target.numel();
  const std::vector<int64_t> t = target.to_vector_i64();
  const std::vector<double> x = logits.to_vector_f64(), l = lse.to_vector_f64(), gv = grad.to_vector_f64();
  const double scale = mean_scale(r, t, ignore_index);
  std::vector<double> dx(x.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[size_t(i)] == ignore_index) continue;
    const double s = r != LossReduce::none ? gv[0] * scale : gv[size_t(i)];
    for (int64_t j = 0; j < c; ++j)
      dx[size_t(i * c + j)] = std::exp(x[size_t(i * c + j)] - l[size_t(i)]) * s - (j == t[size_t(i)] ? s : 0.0);
  }
  return Tensor::from_vector(dx, logits.shape(), logits.dtype());
}

}  // namespace mixprec::kernels::ref
