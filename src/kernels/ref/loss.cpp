// Reference negative log-likelihood: the gather of -log_probs[i, target_i] (summed in f64) and the
// scatter of the gradient back to [N, C].
#include "kernels/loss.h"

#include "mixprec/error.h"

namespace mixprec::kernels::ref {

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, bool reduce, double scale) {
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  const std::vector<int64_t> t = target.to_vector_i64();
  for (int64_t i = 0; i < n; ++i)
    MIXPREC_CHECK(t[size_t(i)] >= 0 && t[size_t(i)] < c, "nll_loss: target[", i, "] = ", t[size_t(i)],
                  " is not a class index in [0, ", c, ")");
  const std::vector<double> v = log_probs.to_vector_f64();
  std::vector<double> losses(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    losses[size_t(i)] = -v[size_t(i * c + t[size_t(i)])];
    total += losses[size_t(i)];
  }
  return reduce ? Tensor::scalar(total * scale, log_probs.dtype())
                : Tensor::from_vector(losses, {n}, log_probs.dtype());
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& target, int64_t classes, bool reduce, double scale,
                         DType dtype) {
  const std::vector<int64_t> t = target.to_vector_i64();
  const int64_t n = int64_t(t.size());
  const std::vector<double> gv = grad.to_vector_f64();
  std::vector<double> dx(size_t(n * classes), 0.0);
  for (int64_t i = 0; i < n; ++i) dx[size_t(i * classes + t[size_t(i)])] = -(reduce ? gv[0] * scale : gv[size_t(i)]);
  return Tensor::from_vector(dx, {n, classes}, dtype);
}

}  // namespace mixprec::kernels::ref
