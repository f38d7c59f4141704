// Reference batch and layer normalisation, forward and backward, in f64 whatever the storage
// dtype (results rounded once). Statistics come out in f32 (f64 for f64 inputs).
#include <cmath>

#include "kernels/norm.h"

namespace mixprec::kernels::ref {
namespace {

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }
std::vector<double> values_or(const Tensor& t, size_t n, double fill) {
  return t.defined() ? t.to_vector_f64() : std::vector<double>(n, fill);
}

// x [outer, channels, inner] as its three extents.
struct Nci {
  int64_t outer, channels, inner;
};
Nci nci(const Tensor& x, int64_t channels) {
  const int64_t outer = x.size(0), inner = x.numel() / (outer * channels);
  return {outer, channels, inner};
}

}  // namespace

void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var) {
  const std::vector<double> xv = x.to_vector_f64();
  const Nci d = nci(x, channels);
  std::vector<double> m(size_t(d.channels), 0.0), v(size_t(d.channels), 0.0);
  const double count = double(d.outer * d.inner);
  for (int64_t c = 0; c < d.channels; ++c) {
    for (int64_t o = 0; o < d.outer; ++o)
      for (int64_t i = 0; i < d.inner; ++i) m[size_t(c)] += xv[size_t((o * d.channels + c) * d.inner + i)];
    m[size_t(c)] /= count;
    for (int64_t o = 0; o < d.outer; ++o)
      for (int64_t i = 0; i < d.inner; ++i) {
        const double e = xv[size_t((o * d.channels + c) * d.inner + i)] - m[size_t(c)];
        v[size_t(c)] += e * e;
      }
    v[size_t(c)] /= count;
  }
  mean = Tensor::from_vector(m, {d.channels}, stats_dtype(x.dtype()));
  var = Tensor::from_vector(v, {d.channels}, stats_dtype(x.dtype()));
}

Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias) {
  const int64_t channels = mean.numel();
  const Nci d = nci(x, channels);
  const std::vector<double> xv = x.to_vector_f64(), m = mean.to_vector_f64(), is = invstd.to_vector_f64();
  const std::vector<double> w = values_or(weight, size_t(channels), 1.0), b = values_or(bias, size_t(channels), 0.0);
  std::vector<double> y(xv.size());
  for (size_t k = 0; k < y.size(); ++k) {
    const size_t c = size_t(int64_t(k) / d.inner % channels);
    y[k] = (xv[k] - m[c]) * is[c] * w[c] + b[c];
  }
  return Tensor::from_vector(y, x.shape(), x.dtype());
}

NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias) {
  const int64_t channels = mean.numel();
  const Nci d = nci(x, channels);
  const std::vector<double> gy = grad_y.to_vector_f64(), xv = x.to_vector_f64(), m = mean.to_vector_f64(),
                            is = invstd.to_vector_f64(), w = values_or(weight, size_t(channels), 1.0);
  // Per channel: sum(dy) and sum(dy * xhat).
  std::vector<double> sum_dy(size_t(channels), 0.0), sum_dy_xhat(size_t(channels), 0.0);
  for (size_t k = 0; k < xv.size(); ++k) {
    const size_t c = size_t(int64_t(k) / d.inner % channels);
    sum_dy[c] += gy[k];
    sum_dy_xhat[c] += gy[k] * (xv[k] - m[c]) * is[c];
  }
  NormGrads r;
  const DType st = stats_dtype(x.dtype());
  if (need_x) {
    const double count = double(d.outer * d.inner);
    std::vector<double> gx(xv.size());
    for (size_t k = 0; k < xv.size(); ++k) {
      const size_t c = size_t(int64_t(k) / d.inner % channels);
      // Training: the batch mean and variance depend on x too, which removes the mean of dy and
      // the part of dy along xhat.
      const double xhat = (xv[k] - m[c]) * is[c];
      gx[k] =
          training ? w[c] * is[c] * (gy[k] - sum_dy[c] / count - xhat * sum_dy_xhat[c] / count) : w[c] * is[c] * gy[k];
    }
    r.x = Tensor::from_vector(gx, x.shape(), grad_y.dtype());
  }
  if (need_weight) r.weight = Tensor::from_vector(sum_dy_xhat, {channels}, st);
  if (need_bias) r.bias = Tensor::from_vector(sum_dy, {channels}, st);
  return r;
}

Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat, std::optional<DType> y_dtype) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<double> xv = x.to_vector_f64();
  const std::vector<double> w = values_or(weight, size_t(cols), 1.0), b = values_or(bias, size_t(cols), 0.0);
  std::vector<double> y(xv.size()), m(size_t(rows), 0.0), rs(size_t(rows), 0.0), xh(xhat.defined() ? xv.size() : 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = xv.data() + r * cols;
    double s = 0, ss = 0;
    for (int64_t j = 0; j < cols; ++j) s += row[j];
    const double mu = s / double(cols);
    for (int64_t j = 0; j < cols; ++j) ss += (row[j] - mu) * (row[j] - mu);
    const double inv = 1.0 / std::sqrt(ss / double(cols) + eps);
    for (int64_t j = 0; j < cols; ++j) y[size_t(r * cols + j)] = (row[j] - mu) * inv * w[size_t(j)] + b[size_t(j)];
    if (!xh.empty())
      for (int64_t j = 0; j < cols; ++j) xh[size_t(r * cols + j)] = (row[j] - mu) * inv;
    m[size_t(r)] = mu;
    rs[size_t(r)] = inv;
  }
  mean = Tensor::from_vector(m, {rows}, stats_dtype(x.dtype()));
  rstd = Tensor::from_vector(rs, {rows}, stats_dtype(x.dtype()));
  if (xhat.defined()) {
    Tensor dst = xhat;
    dst.copy_(Tensor::from_vector(xh, x.shape(), xhat.dtype()));
  }
  return Tensor::from_vector(y, x.shape(), y_dtype.value_or(x.dtype()));
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias,
                              std::optional<DType> grad_x_dtype) {
  const int64_t rows = x.size(0), cols = x.size(1);
  // Without a mean, x is x̂ already: mean 0 and scale 1 for it, rstd only in grad_x.
  const bool normalized = !mean.defined();
  const std::vector<double> gy = grad_y.to_vector_f64(), xv = x.to_vector_f64(),
                            m = normalized ? std::vector<double>(size_t(rows), 0.0) : mean.to_vector_f64(),
                            rs = rstd.to_vector_f64(), w = values_or(weight, size_t(cols), 1.0);
  std::vector<double> gx(xv.size()), gw(size_t(cols), 0.0), gb(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean_g = 0, mean_g_xhat = 0;  // of g = dy * w over the row
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = size_t(r * cols + j);
      const double xhat = normalized ? xv[k] : (xv[k] - m[size_t(r)]) * rs[size_t(r)];
      const double g = gy[k] * w[size_t(j)];
      mean_g += g;
      mean_g_xhat += g * xhat;
      gw[size_t(j)] += gy[k] * xhat;
      gb[size_t(j)] += gy[k];
    }
    mean_g /= double(cols);
    mean_g_xhat /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = size_t(r * cols + j);
      const double xhat = normalized ? xv[k] : (xv[k] - m[size_t(r)]) * rs[size_t(r)];
      gx[k] = rs[size_t(r)] * (gy[k] * w[size_t(j)] - mean_g - xhat * mean_g_xhat);
    }
  }
  NormGrads out;
  const DType st = stats_dtype(x.dtype());
  if (need_x) out.x = Tensor::from_vector(gx, x.shape(), grad_x_dtype.value_or(grad_y.dtype()));
  if (need_weight) out.weight = Tensor::from_vector(gw, {cols}, st);
  if (need_bias) out.bias = Tensor::from_vector(gb, {cols}, st);
  return out;
}

Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype) {
  std::vector<double> inv = var.to_vector_f64();
  for (double& v : inv) v = 1.0 / std::sqrt(v + eps);
  return Tensor::from_vector(inv, var.shape(), dtype);
}

Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum) {
  std::vector<double> r = running.to_vector_f64();
  const std::vector<double> b = batch.to_vector_f64();
  for (size_t i = 0; i < r.size(); ++i) r[i] = (1 - momentum) * r[i] + momentum * (b[i] * factor);
  return Tensor::from_vector(r, running.shape(), DType::f64);
}

}  // namespace mixprec::kernels::ref
