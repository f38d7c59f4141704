// Fast CPU batch and layer normalisation: OpenMP over channels (batch norm) or rows (layer
// norm), f32 compute on f32/bf16/f16 data, per-plane sums combined in f64. f64 goes to the
// reference.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/f32_blocks.h"
#include "kernels/norm.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

std::vector<float> values_or(const Tensor& t, int64_t n, float fill) {
  return t.defined() ? t.to_vector() : std::vector<float>(size_t(n), fill);
}

// x as [outer, channels, inner].
struct Nci {
  int64_t outer, channels, inner;
};
Nci nci(const Tensor& x, int64_t channels) { return {x.size(0), channels, x.numel() / (x.size(0) * channels)}; }

bool usable(const Tensor& t) { return !t.defined() || (f32_compute(t.dtype()) && t.is_contiguous()); }

// Reductions over one plane with 16 independent f32 lanes: the compiler vectorises them without
// reassociating a single sum (no -ffast-math), and the lanes shorten the dependency chain.
constexpr int kLanes = 16;
inline float lanes_total(const float* acc) {
  float s = 0.f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}
inline float plane_sum(const float* p, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
  for (; i < n; ++i) acc[0] += p[i];
  return lanes_total(acc);
}
inline float plane_sum_sq_dev(const float* p, int64_t n, float mu) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += (p[i + j] - mu) * (p[i + j] - mu);
  for (; i < n; ++i) acc[0] += (p[i] - mu) * (p[i] - mu);
  return lanes_total(acc);
}
// sum(gy) and sum(gy * (x - mu)) in one pass.
inline void plane_sums_backward(const float* gy, const float* x, int64_t n, float mu, float& s, float& sx) {
  float a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      a[j] += gy[i + j];
      b[j] += gy[i + j] * (x[i + j] - mu);
    }
  for (; i < n; ++i) {
    a[0] += gy[i];
    b[0] += gy[i] * (x[i] - mu);
  }
  s = lanes_total(a), sx = lanes_total(b);
}
// Where plane results go: straight into an f32 destination, else into buf for a rounding store.
inline float* out_plane(Tensor& dst, int64_t begin, std::vector<float>& buf) {
  return dst.dtype() == DType::f32 ? dst.data<float>() + begin : buf.data();
}
inline void finish_plane(Tensor& dst, int64_t begin, int64_t n, const float* buf) {
  if (dst.dtype() != DType::f32) store_f32(dst, begin, n, buf);
}

}  // namespace

bool batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous()) return false;
  const Nci d = nci(x, channels);
  std::vector<float> m(static_cast<size_t>(channels)), v(static_cast<size_t>(channels));
  const double count = double(d.outer * d.inner);
#pragma omp parallel
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < channels; ++c) {
      double s = 0;  // plane sums in f32, the planes combined in f64
      for (int64_t o = 0; o < d.outer; ++o) {
        s += plane_sum(in_f32(x, (o * channels + c) * d.inner, d.inner, buf), d.inner);
      }
      const float mu = float(s / count);
      double ss = 0;
      for (int64_t o = 0; o < d.outer; ++o) {
        ss += plane_sum_sq_dev(in_f32(x, (o * channels + c) * d.inner, d.inner, buf), d.inner, mu);
      }
      m[size_t(c)] = mu;
      v[size_t(c)] = float(ss / count);
    }
  }
  mean = Tensor::from_vector(m, {channels}, DType::f32);
  var = Tensor::from_vector(v, {channels}, DType::f32);
  return true;
}

bool batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias, Tensor& dst) {
  if (!usable(x) || !usable(weight) || !usable(bias) || mean.dtype() != DType::f32) return false;
  const int64_t channels = mean.numel();
  const Nci d = nci(x, channels);
  const std::vector<float> m = mean.to_vector(), is = invstd.to_vector();
  const std::vector<float> w = values_or(weight, channels, 1.f), b = values_or(bias, channels, 0.f);
  // y = x * scale + shift per channel
  std::vector<float> scale(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
  for (size_t c = 0; c < scale.size(); ++c) {
    scale[c] = is[c] * w[c];
    shift[c] = b[c] - m[c] * scale[c];
  }
  const int64_t planes = d.outer * channels;
#pragma omp parallel
  {
    std::vector<float> in, out(static_cast<size_t>(d.inner));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const size_t c = size_t(p % channels);
      const float* src = in_f32(x, p * d.inner, d.inner, in);
      float* o = out_plane(dst, p * d.inner, out);
      const float sc = scale[c], sh = shift[c];
      for (int64_t i = 0; i < d.inner; ++i) o[i] = src[i] * sc + sh;
      finish_plane(dst, p * d.inner, d.inner, o);
    }
  }
  return true;
}

bool batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                         const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias,
                         NormGrads& out) {
  if (!usable(grad_y) || !usable(x) || !usable(weight) || mean.dtype() != DType::f32) return false;
  const int64_t channels = mean.numel();
  const Nci d = nci(x, channels);
  const std::vector<float> m = mean.to_vector(), is = invstd.to_vector(), w = values_or(weight, channels, 1.f);
  std::vector<float> sum_dy(static_cast<size_t>(channels)), sum_dy_xhat(static_cast<size_t>(channels));
#pragma omp parallel
  {
    std::vector<float> gb, xb;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < channels; ++c) {
      double s = 0, sx = 0;
      for (int64_t o = 0; o < d.outer; ++o) {
        const int64_t begin = (o * channels + c) * d.inner;
        const float* gy = in_f32(grad_y, begin, d.inner, gb);
        const float* xv = in_f32(x, begin, d.inner, xb);
        float ps, psx;
        plane_sums_backward(gy, xv, d.inner, m[size_t(c)], ps, psx);
        s += ps;
        sx += psx;
      }
      sum_dy[size_t(c)] = float(s);
      sum_dy_xhat[size_t(c)] = float(sx * is[size_t(c)]);
    }
  }
  if (need_x) {
    // dx = a*dy + b*(x - mean) + e per channel; training adds the batch statistics' terms.
    const float count = float(d.outer * d.inner);
    std::vector<float> a(static_cast<size_t>(channels)), b(static_cast<size_t>(channels)),
        e(static_cast<size_t>(channels));
    for (size_t c = 0; c < a.size(); ++c) {
      a[c] = w[c] * is[c];
      b[c] = training ? -a[c] * is[c] * sum_dy_xhat[c] / count : 0.f;
      e[c] = training ? -a[c] * sum_dy[c] / count : 0.f;
    }
    out.x = Tensor::empty(x.shape(), grad_y.dtype());
    const int64_t planes = d.outer * channels;
#pragma omp parallel
    {
      std::vector<float> gb, xb, ob(static_cast<size_t>(d.inner));
#pragma omp for schedule(static)
      for (int64_t p = 0; p < planes; ++p) {
        const size_t c = size_t(p % channels);
        const float* gy = in_f32(grad_y, p * d.inner, d.inner, gb);
        const float* xv = in_f32(x, p * d.inner, d.inner, xb);
        float* o = out_plane(out.x, p * d.inner, ob);
        const float ac = a[c], bc = b[c], ec = e[c], mc = m[c];
        for (int64_t i = 0; i < d.inner; ++i) o[i] = ac * gy[i] + bc * (xv[i] - mc) + ec;
        finish_plane(out.x, p * d.inner, d.inner, o);
      }
    }
  }
  if (need_weight) out.weight = Tensor::from_vector(sum_dy_xhat, {channels}, DType::f32);
  if (need_bias) out.bias = Tensor::from_vector(sum_dy, {channels}, DType::f32);
  return true;
}

bool layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                        Tensor& rstd, const Tensor& xhat, Tensor& dst) {
  if (!usable(x) || !usable(weight) || !usable(bias) || !usable(xhat)) return false;
  Tensor xhat_dst = xhat;  // shares xhat's storage
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<float> w = values_or(weight, cols, 1.f), b = values_or(bias, cols, 0.f);
  std::vector<float> m(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> in, out(static_cast<size_t>(cols)), xh(xhat.defined() ? size_t(cols) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = in_f32(x, r * cols, cols, in);
      // Two passes, each over 16 f32 lanes (vectorised; the row is short: a transformer's width).
      const float mu = float(double(plane_sum(src, cols)) / double(cols));
      const float inv = float(1.0 / std::sqrt(double(plane_sum_sq_dev(src, cols, mu)) / double(cols) + eps));
      for (int64_t j = 0; j < cols; ++j) out[size_t(j)] = (src[j] - mu) * inv * w[size_t(j)] + b[size_t(j)];
      store_f32(dst, r * cols, cols, out.data());
      if (!xh.empty()) {
        for (int64_t j = 0; j < cols; ++j) xh[size_t(j)] = (src[j] - mu) * inv;
        store_f32(xhat_dst, r * cols, cols, xh.data());
      }
      m[size_t(r)] = mu;
      rs[size_t(r)] = inv;
    }
  }
  mean = Tensor::from_vector(m, {rows}, DType::f32);
  rstd = Tensor::from_vector(rs, {rows}, DType::f32);
  return true;
}

bool layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, bool need_x, bool need_weight, bool need_bias, NormGrads& out) {
  if (!usable(grad_y) || !usable(x) || !usable(weight) || rstd.dtype() != DType::f32 ||
      (mean.defined() && mean.dtype() != DType::f32))
    return false;
  const int64_t rows = x.size(0), cols = x.size(1);
  // Without a mean, x is x̂ already (the forward's `xhat`): mean 0 and scale 1 for it.
  const bool normalized = !mean.defined();
  const std::vector<float> m = normalized ? std::vector<float>(size_t(rows), 0.f) : mean.to_vector(),
                           rs = rstd.to_vector(), w = values_or(weight, cols, 1.f);
  if (need_x) out.x = Tensor::empty(x.shape(), grad_y.dtype());
  // Per-thread partial sums of dweight/dbias, combined in thread order: deterministic.
  std::vector<std::vector<double>> gw_parts(static_cast<size_t>(omp_get_max_threads())), gb_parts(gw_parts.size());
#pragma omp parallel
  {
    std::vector<float> gbuf, xbuf, ob(static_cast<size_t>(cols)), xhat(static_cast<size_t>(cols));
    std::vector<double>& gw_t = gw_parts[size_t(omp_get_thread_num())];
    std::vector<double>& gb_t = gb_parts[size_t(omp_get_thread_num())];
    gw_t.assign(size_t(cols), 0.0);
    gb_t.assign(size_t(cols), 0.0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* gy = in_f32(grad_y, r * cols, cols, gbuf);
      const float* xv = in_f32(x, r * cols, cols, xbuf);
      float mean_g = 0.f, mean_g_xhat = 0.f;
      for (int64_t j = 0; j < cols; ++j) {
        xhat[size_t(j)] = normalized ? xv[j] : (xv[j] - m[size_t(r)]) * rs[size_t(r)];
        const float g = gy[j] * w[size_t(j)];
        mean_g += g;
        mean_g_xhat += g * xhat[size_t(j)];
        gw_t[size_t(j)] += double(gy[j] * xhat[size_t(j)]);
        gb_t[size_t(j)] += double(gy[j]);
      }
      if (!need_x) continue;
      mean_g /= float(cols);
      mean_g_xhat /= float(cols);
      for (int64_t j = 0; j < cols; ++j)
        ob[size_t(j)] = rs[size_t(r)] * (gy[j] * w[size_t(j)] - mean_g - xhat[size_t(j)] * mean_g_xhat);
      store_f32(out.x, r * cols, cols, ob.data());
    }
  }
  std::vector<double> gw(size_t(cols), 0.0), gb(size_t(cols), 0.0);
  for (size_t t = 0; t < gw_parts.size(); ++t)
    for (size_t j = 0; j < gw_parts[t].size(); ++j) {
      gw[j] += gw_parts[t][j];
      gb[j] += gb_parts[t][j];
    }
  if (need_weight) out.weight = Tensor::from_vector(gw, {cols}, DType::f32);
  if (need_bias) out.bias = Tensor::from_vector(gb, {cols}, DType::f32);
  return true;
}

}  // namespace mixprec::kernels::cpu
