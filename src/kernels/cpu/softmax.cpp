// Fast CPU softmax and log_softmax over the last dimension: OpenMP over rows, each row in f32
// (rows up to one block; longer rows fall back to the reference).
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/softmax.h"

namespace mixprec::kernels::cpu {

bool softmax_lastdim(const Tensor& x, bool log, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || !x.is_contiguous() || x.dim() == 0) return false;
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  if (cols > kBlock) return false;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * cols, 1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float v[kBlock];
    load_f32(x.data_ptr(), t, r * cols, cols, v);
    float mx = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, v[c]);
    float total = 0.f;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(v[c] - mx);
    const float lse = mx + std::log(total);
    for (int64_t c = 0; c < cols; ++c) v[c] = log ? v[c] - lse : std::exp(v[c] - lse);
    store_f32(dst.data_ptr(), t, r * cols, cols, v);
  }
  return true;
}

bool softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log, Tensor& dst) {
  const DType t = y.dtype();
  if (!f32_compute(t) || grad_y.dtype() != t || !y.is_contiguous() || !grad_y.is_contiguous() || y.dim() == 0)
    return false;
  const int64_t cols = y.size(-1), rows = cols ? y.numel() / cols : 0;
  if (cols > kBlock) return false;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * cols, 1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float yv[kBlock], g[kBlock];
    load_f32(y.data_ptr(), t, r * cols, cols, yv);
    load_f32(grad_y.data_ptr(), t, r * cols, cols, g);
    float dot = 0.f;
    for (int64_t c = 0; c < cols; ++c) dot += log ? g[c] : g[c] * yv[c];
    for (int64_t c = 0; c < cols; ++c) g[c] = log ? g[c] - std::exp(yv[c]) * dot : yv[c] * (g[c] - dot);
    store_f32(dst.data_ptr(), t, r * cols, cols, g);
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
