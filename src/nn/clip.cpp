// clip_grad_norm_ and clip_grad_value_ (torch.nn.utils): gradients are read in blocks converted to
// f32, norms accumulate in f64, and 16-bit gradients are written back rounded once.
#include "mixprec/clip.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::nn {
namespace {

constexpr int64_t kBlock = 4096;

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& param : params) {
    Tensor p = param;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    MIXPREC_CHECK(is_floating(g.dtype()), "clip: a gradient is ", dtype_name(g.dtype()));
    if (!g.is_contiguous()) {
      MemoryScope scope(MemCategory::gradients);
      g = g.clone();
      p.set_grad(g);
    }
    out.push_back(g);
  }
  return out;
}

// f(values, len) over f64 copies of each block of g (exact for every floating dtype).
template <class F>
void for_blocks(const Tensor& g, F&& f) {
  const int64_t n = g.numel(), nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (nb >= 8)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    alignas(64) double buf[kBlock];
    convert(static_cast<const char*>(g.data_ptr()) + begin * int64_t(dtype_size(g.dtype())), g.dtype(), buf, DType::f64,
            size_t(len));
    f(buf, len, begin);
  }
}

// Applies v -> op(v) to every element of g in place (computed in f64, stored rounded once).
template <class Op>
void transform(Tensor& g, Op&& op) {
  const size_t es = dtype_size(g.dtype());
  char* base = static_cast<char*>(g.data_ptr());
  for_blocks(g, [&](double* v, int64_t len, int64_t begin) {
    for (int64_t j = 0; j < len; ++j) v[j] = op(v[j]);
    convert(v, DType::f64, base + begin * int64_t(es), g.dtype(), size_t(len));
  });
  g.bump_version();
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  MIXPREC_CHECK(norm_type >= 1.0 || std::isinf(norm_type), "grad_norm: norm_type must be >= 1 or inf, got ", norm_type);
  const std::vector<Tensor> grads = grads_of(params);
  const bool is_inf = std::isinf(norm_type);
  double acc = 0;
  for (const Tensor& g : grads) {
    std::vector<double> partial(size_t((g.numel() + kBlock - 1) / kBlock), 0.0);
    for_blocks(g, [&](const double* v, int64_t len, int64_t begin) {
      double s = 0;
      if (is_inf) {
        for (int64_t j = 0; j < len; ++j) s = std::isnan(v[j]) || std::isnan(s) ? NAN : std::max(s, std::fabs(v[j]));
      } else if (norm_type == 2.0) {
        for (int64_t j = 0; j < len; ++j) s += v[j] * v[j];
      } else {
        for (int64_t j = 0; j < len; ++j) s += std::pow(std::fabs(v[j]), norm_type);
      }
      partial[size_t(begin / kBlock)] = s;
    });
    for (double s : partial) acc = is_inf ? (std::isnan(s) || std::isnan(acc) ? NAN : std::max(acc, s)) : acc + s;
  }
  if (is_inf) return acc;
  return norm_type == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / norm_type);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipNormOptions o) {
  MIXPREC_CHECK(max_norm >= 0 && !std::isnan(max_norm), "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  const double total = grad_norm(params, o.norm_type);
  MIXPREC_CHECK(std::isfinite(total) || !o.error_if_nonfinite, "clip_grad_norm_: the total norm of order ", o.norm_type,
                " of the gradients is non-finite, so they cannot be clipped (error_if_nonfinite=false scales them "
                "by it anyway)");
  // PyTorch: coef = max_norm / (total + 1e-6), clamped to 1; 1e-6 guards a zero norm.
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  if (coef == 1.0) return total;  // multiplying by 1 changes nothing
  for (Tensor g : grads_of(params)) transform(g, [coef](double v) { return v * coef; });
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  MIXPREC_CHECK(clip_value >= 0 && !std::isnan(clip_value), "clip_grad_value_: clip_value must be >= 0, got ",
                clip_value);
  for (Tensor g : grads_of(params))
    transform(g, [clip_value](double v) { return std::isnan(v) ? v : std::clamp(v, -clip_value, clip_value); });
}

}  // namespace mixprec::nn
