// Fast CPU batch and layer normalisation: OpenMP over channels (batch norm) or rows (layer
// norm), f32 compute on f32/bf16/f16 data, per-plane sums combined in f64. f64 goes to the
// reference.
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/lane_tree.h"
#include "kernels/norm.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

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
// reassociating a single sum (no -ffast-math), and the lanes shorten the dependency chain. Always
// inlined, so a caller compiled for AVX-512 (layer norm's rows below) runs them in 512-bit lanes
// with the same results as the baseline build's: the lanes fix the order of every sum.
#define MIXPREC_LANES [[gnu::always_inline]] inline
constexpr int kLanes = 16;
// The lanes' total: lane_tree_sum's fixed tree of depth 4 (kernels/lane_tree.h); a row's reductions
// are a chain of additions, and 15 in a row made layer norm's short rows (the gpt's 128) wait on
// them.
MIXPREC_LANES float lanes_total(const float* acc) { return lane_tree_sum<kLanes>(acc); }
MIXPREC_LANES float plane_sum(const float* p, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
  for (; i < n; ++i) acc[0] += p[i];
  return lanes_total(acc);
}
MIXPREC_LANES float plane_sum_sq_dev(const float* p, int64_t n, float mu) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += (p[i + j] - mu) * (p[i + j] - mu);
  for (; i < n; ++i) acc[0] += (p[i] - mu) * (p[i] - mu);
  return lanes_total(acc);
}
// sum(gy) and sum(gy * (x - mu)) in one pass.
MIXPREC_LANES void plane_sums_backward(const float* gy, const float* x, int64_t n, float mu, float& s, float& sx) {
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
// Layer norm's rows, written once in lanes and compiled three times: for AVX-512 (512-bit lanes),
// AVX2 (256-bit) and the baseline x86-64, chosen at run time; all give the same bits.
struct LayerNormRow {
  const float* w;
  const float* b;  // forward only
  int64_t cols;
};
// y = (x - mean) * rstd * w + b, and x̂ = (x - mean) * rstd where xh is given, for R rows (row k:
// x[k], y[k], xh[k], mu[k], inv[k]), each with the same operations: a row's mean, variance and rstd
// are a chain of sums, f64 divisions and a square root, and R independent chains side by side
// overlap (R = 4 for whole groups of rows; the gpt's rows are 128 long).
template <int R>
MIXPREC_LANES void layer_norm_stats(const LayerNormRow& a, const float* const* x, double eps, float* mu, float* inv) {
  const int64_t n = a.cols;
  float s[R];
  for (int k = 0; k < R; ++k) s[k] = plane_sum(x[k], n);
  for (int k = 0; k < R; ++k) mu[k] = float(double(s[k]) / double(n));
  for (int k = 0; k < R; ++k) s[k] = plane_sum_sq_dev(x[k], n, mu[k]);
  for (int k = 0; k < R; ++k) inv[k] = float(1.0 / std::sqrt(double(s[k]) / double(n) + eps));
}
template <int R>
MIXPREC_LANES void layer_norm_rows(const LayerNormRow& a, const float* const* x, double eps, float* const* y,
                                   float* const* xh, float* mu, float* inv) {
  const int64_t n = a.cols;
  layer_norm_stats<R>(a, x, eps, mu, inv);
  for (int k = 0; k < R; ++k) {
    for (int64_t j = 0; j < n; ++j) y[k][j] = (x[k][j] - mu[k]) * inv[k] * a.w[j] + a.b[j];
    if (xh[k])
      for (int64_t j = 0; j < n; ++j) xh[k][j] = (x[k][j] - mu[k]) * inv[k];
  }
}
constexpr int kRowGroup = 4;
// The gradients of one row: x̂ (recomputed, or x itself when it is x̂ already), dweight and dbias
// added into the thread's f64 sums, and dx = rstd (g - mean(g) - x̂ mean(g x̂)) with g = dy w where
// dx is given.
template <bool kNormalized>
MIXPREC_LANES void layer_norm_row_backward(const LayerNormRow& a, const float* gy, const float* x, float mu, float rs,
                                           float* xhat, double* gw, double* gb, float* dx) {
  const int64_t n = a.cols;
  float sg[kLanes] = {}, sgx[kLanes] = {};
  auto term = [&](int64_t j, int l) {
    const float xh = kNormalized ? x[j] : (x[j] - mu) * rs;
    const float g = gy[j] * a.w[j];
    xhat[j] = xh;
    sg[l] += g;
    sgx[l] += g * xh;
  };
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) term(j + l, l);
  for (; j < n; ++j) term(j, 0);
  for (j = 0; j < n; ++j) {
    gw[j] += double(gy[j] * xhat[j]);
    gb[j] += double(gy[j]);
  }
  if (!dx) return;
  const float mean_g = lanes_total(sg) / float(n), mean_gx = lanes_total(sgx) / float(n);
  for (j = 0; j < n; ++j) dx[j] = rs * (gy[j] * a.w[j] - mean_g - xhat[j] * mean_gx);
}

using LayerNormRowFn = void (*)(const LayerNormRow&, const float* const*, double, float* const*, float* const*, float*,
                                float*);
using LayerNormRowBackwardFn = void (*)(const LayerNormRow&, const float*, const float*, float, float, float*, double*,
                                        double*, float*);
#define MIXPREC_AVX512 __attribute__((target("avx512f")))
#define MIXPREC_AVX2 __attribute__((target("avx2")))
template <int R>
MIXPREC_AVX512 void layer_norm_rows_avx512(const LayerNormRow& a, const float* const* x, double eps, float* const* y,
                                           float* const* xh, float* mu, float* inv) {
  layer_norm_rows<R>(a, x, eps, y, xh, mu, inv);
}
template <int R>
MIXPREC_AVX2 void layer_norm_rows_avx2(const LayerNormRow& a, const float* const* x, double eps, float* const* y,
                                       float* const* xh, float* mu, float* inv) {
  layer_norm_rows<R>(a, x, eps, y, xh, mu, inv);
}
template <int R>
void layer_norm_rows_baseline(const LayerNormRow& a, const float* const* x, double eps, float* const* y,
                              float* const* xh, float* mu, float* inv) {
  layer_norm_rows<R>(a, x, eps, y, xh, mu, inv);
}
template <bool kNormalized>
MIXPREC_AVX512 void layer_norm_row_backward_avx512(const LayerNormRow& a, const float* gy, const float* x, float mu,
                                                   float rs, float* xhat, double* gw, double* gb, float* dx) {
  layer_norm_row_backward<kNormalized>(a, gy, x, mu, rs, xhat, gw, gb, dx);
}
template <bool kNormalized>
MIXPREC_AVX2 void layer_norm_row_backward_avx2(const LayerNormRow& a, const float* gy, const float* x, float mu,
                                               float rs, float* xhat, double* gw, double* gb, float* dx) {
  layer_norm_row_backward<kNormalized>(a, gy, x, mu, rs, xhat, gw, gb, dx);
}
template <bool kNormalized>
void layer_norm_row_backward_baseline(const LayerNormRow& a, const float* gy, const float* x, float mu, float rs,
                                      float* xhat, double* gw, double* gb, float* dx) {
  layer_norm_row_backward<kNormalized>(a, gy, x, mu, rs, xhat, gw, gb, dx);
}
#undef MIXPREC_AVX512
#undef MIXPREC_AVX2

// y and x̂ written as bf16 by the row kernel itself where the CPU has AVX512-BF16 (autocast's norm
// before a Linear, which also saves x̂ in bf16): layer_norm_rows's statistics and its operations in
// the same order, 16 lanes at a time, rounded in registers (bf16_pair_from_ps, bf16_from_ps: the
// bits of the f32 rows rounded by convert), where the buffered path wrote both as f32 rows and
// converted them with two calls a group; its forward took 0.5 ms a step more than f32's in the gpt
// (docs/hosts.md, 2026-12-05, later). xh null: no x̂.
#define MIXPREC_LN_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// 16 lanes of layer_norm_rows's operations, in its order: x̂ = (x - mu) * inv into n, y = x̂ * w + b
// returned.
MIXPREC_LN_BF16 inline __m512 ln_lanes(__m512 x, __m512 w, __m512 b, __m512 mu, __m512 inv, __m512& n) {
  n = _mm512_mul_ps(_mm512_sub_ps(x, mu), inv);
  return _mm512_add_ps(_mm512_mul_ps(n, w), b);
}
// lanes_total of 16 lanes in a register: the same additions, pair by pair (lane j with j + 8 is the
// two halves' sum, and so on down).
MIXPREC_LN_BF16 inline float lanes_total_ps(__m512 v) {
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}
// layer_norm_stats<R> in registers, R rows in lockstep, for rows of a multiple of 16 columns: each
// row's lanes and their totals as there, and the f64 divisions and square roots of the R rows in
// one vector each (correctly rounded either way). The row-by-row form left each row's chain of
// sums, divisions and root to the out-of-order window: the gpt's forward norms, 128 columns, took
// about 95 ns a row on the AMX host (docs/hosts.md, 2026-12-06, second session).
template <int R>
MIXPREC_LN_BF16 void layer_norm_stats_avx512(int64_t n, const float* const* x, double eps, float* mu, float* inv) {
  static_assert(R <= 4);
  __m512 acc[R];
  for (int k = 0; k < R; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16)
    for (int k = 0; k < R; ++k) acc[k] = _mm512_add_ps(acc[k], _mm512_loadu_ps(x[k] + j));
  alignas(32) double s[4] = {1, 1, 1, 1};
  alignas(16) float m[4] = {};
  for (int k = 0; k < R; ++k) s[k] = double(lanes_total_ps(acc[k]));
  const __m256d vn = _mm256_set1_pd(double(n));
  _mm_store_ps(m, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_load_pd(s), vn)));
  __m512 vm[R];
  for (int k = 0; k < R; ++k) vm[k] = _mm512_set1_ps(m[k]), acc[k] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16)
    for (int k = 0; k < R; ++k) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x[k] + j), vm[k]);
      acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(d, d));
    }
  for (int k = 0; k < R; ++k) s[k] = double(lanes_total_ps(acc[k]));
  const __m256d root = _mm256_sqrt_pd(_mm256_add_pd(_mm256_div_pd(_mm256_load_pd(s), vn), _mm256_set1_pd(eps)));
  alignas(16) float r[4];
  _mm_store_ps(r, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), root)));
  for (int k = 0; k < R; ++k) mu[k] = m[k], inv[k] = r[k];
}
template <int R>
MIXPREC_LN_BF16 void layer_norm_rows_bf16(const LayerNormRow& a, const float* const* x, double eps, uint16_t* const* y,
                                          uint16_t* const* xh, float* mu, float* inv) {
  const int64_t n = a.cols;
  if (n % 16 == 0)
    layer_norm_stats_avx512<R>(n, x, eps, mu, inv);
  else
    layer_norm_stats<R>(a, x, eps, mu, inv);
  for (int k = 0; k < R; ++k) {
    const __m512 vm = _mm512_set1_ps(mu[k]), vi = _mm512_set1_ps(inv[k]);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const float* xr = x[k] + j;
      __m512 n0, n1;
      const __m512 y0 = ln_lanes(_mm512_loadu_ps(xr), _mm512_loadu_ps(a.w + j), _mm512_loadu_ps(a.b + j), vm, vi, n0);
      const __m512 y1 =
          ln_lanes(_mm512_loadu_ps(xr + 16), _mm512_loadu_ps(a.w + j + 16), _mm512_loadu_ps(a.b + j + 16), vm, vi, n1);
      _mm512_storeu_si512(y[k] + j, bf16_pair_from_ps(y0, y1));
      if (xh[k]) _mm512_storeu_si512(xh[k] + j, bf16_pair_from_ps(n0, n1));
    }
    for (; j < n; j += 16) {
      const __mmask16 m = first_lanes(n - j);
      __m512 nv;
      const __m512 yv = ln_lanes(_mm512_maskz_loadu_ps(m, x[k] + j), _mm512_maskz_loadu_ps(m, a.w + j),
                                 _mm512_maskz_loadu_ps(m, a.b + j), vm, vi, nv);
      _mm256_mask_storeu_epi16(y[k] + j, m, bf16_from_ps(yv));
      if (xh[k]) _mm256_mask_storeu_epi16(xh[k] + j, m, bf16_from_ps(nv));
    }
  }
}

// The same where the CPU has AVX2 but no AVX-512, for bf16 and f16: layer_norm_rows's statistics
// and its operations in its order, 8 lanes at a time, rounded in registers (round16_avx2:
// convert's bits), a row's last piece under 8 through a buffer and convert(). The
// buffered path wrote y and x̂ as f32 rows and converted them with two calls a group: the gpt's
// amp-bf16 forward norms took 2.7 ms a step against fp32's 1.4 (AMD Zen 3).
template <int R>
__attribute__((target("avx2,f16c"))) void layer_norm_rows_16_avx2(const LayerNormRow& a, const float* const* x,
                                                                  double eps, DType t, uint16_t* const* y,
                                                                  uint16_t* const* xh, float* mu, float* inv) {
  const int64_t n = a.cols;
  layer_norm_stats<R>(a, x, eps, mu, inv);
  const bool f16 = t == DType::f16;
  for (int k = 0; k < R; ++k) {
    const __m256 vm = _mm256_set1_ps(mu[k]), vi = _mm256_set1_ps(inv[k]);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 nv = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x[k] + j), vm), vi);
      const __m256 yv = _mm256_add_ps(_mm256_mul_ps(nv, _mm256_loadu_ps(a.w + j)), _mm256_loadu_ps(a.b + j));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[k] + j), round16_avx2(yv, f16));
      if (xh[k]) _mm_storeu_si128(reinterpret_cast<__m128i*>(xh[k] + j), round16_avx2(nv, f16));
    }
    if (j == n) continue;
    float yt[8], nt[8];
    for (int64_t c = j; c < n; ++c) {
      nt[c - j] = (x[k][c] - mu[k]) * inv[k];
      yt[c - j] = nt[c - j] * a.w[c] + a.b[c];
    }
    convert(yt, DType::f32, y[k] + j, t, size_t(n - j));
    if (xh[k]) convert(nt, DType::f32, xh[k] + j, t, size_t(n - j));
  }
}

// acc[0 .. 16) += double(v), lane by lane (the row kernel's `gw[j] += double(...)`).
__attribute__((target("avx512f"))) inline void add_to_f64(double* acc, __m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  _mm512_storeu_pd(acc, _mm512_add_pd(_mm512_loadu_pd(acc), _mm512_cvtps_pd(_mm512_castps512_ps256(v))));
  _mm512_storeu_pd(acc + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 8), _mm512_cvtps_pd(hi)));
}

// The normalized backward (x is x̂, autocast's saved bf16) on bf16 gy and x̂ read in place, 16
// lanes a step widened in registers, dx stored as f32 (the residual stream's gradient): the
// operations of layer_norm_row_backward<true>, in its order, where the rows went through two bulk
// conversions a group and an x̂ buffer (the gpt's amp-bf16 norms: a third of the backward's time
// in bf16_to_f32). Rows of a multiple of 16 columns; the bits of the converted path
// (NormKernels.LayerNormBackwardOn16BitsIsTheF32KernelsBits).
__attribute__((target("avx512f"))) void layer_norm_row_backward_bf16(const float* w, int64_t n, const uint16_t* gy,
                                                                     const uint16_t* x, float rs, double* gw,
                                                                     double* gb, float* dx) {
  fetch_ahead(gy, n * 2);
  fetch_ahead(x, n * 2);
  __m512 sg = _mm512_setzero_ps(), sgx = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 g16 = bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gy + j)));
    const __m512 xh = bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)));
    const __m512 g = _mm512_mul_ps(g16, _mm512_loadu_ps(w + j));
    sg = _mm512_add_ps(sg, g);
    sgx = _mm512_add_ps(sgx, _mm512_mul_ps(g, xh));
    add_to_f64(gw + j, _mm512_mul_ps(g16, xh));
    add_to_f64(gb + j, g16);
  }
  if (!dx) return;
  float lanes[kLanes];
  _mm512_storeu_ps(lanes, sg);
  const __m512 mean_g = _mm512_set1_ps(lanes_total(lanes) / float(n));
  _mm512_storeu_ps(lanes, sgx);
  const __m512 mean_gx = _mm512_set1_ps(lanes_total(lanes) / float(n));
  const __m512 vrs = _mm512_set1_ps(rs);
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 g16 = bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gy + j)));
    const __m512 xh = bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)));
    const __m512 t =
        _mm512_sub_ps(_mm512_sub_ps(_mm512_mul_ps(g16, _mm512_loadu_ps(w + j)), mean_g), _mm512_mul_ps(xh, mean_gx));
    _mm512_storeu_ps(dx + j, _mm512_mul_ps(vrs, t));
  }
}
#undef MIXPREC_LN_BF16

// acc[0 .. 8) += double(v), lane by lane.
__attribute__((target("avx2"))) inline void add_to_f64_avx2(double* acc, __m256 v) {
  _mm256_storeu_pd(acc, _mm256_add_pd(_mm256_loadu_pd(acc), _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
  _mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
}

// layer_norm_row_backward_bf16 on AVX2 hosts, for bf16 or f16 (`f16`) gy and x̂ read in place: 16
// columns a step as two vectors of 8 (the row kernel's 16 partial sums, lanes 0-7 and 8-15),
// widened in registers, the row kernel's operations in its order; dx stored as f32. Rows of a
// multiple of 16 columns; the bits of the converted path (the test named above).
__attribute__((target("avx2,f16c"))) void layer_norm_row_backward_16_avx2(const float* w, int64_t n, const uint16_t* gy,
                                                                          const uint16_t* x, bool f16, float rs,
                                                                          double* gw, double* gb, float* dx) {
  fetch_ahead(gy, n * 2);
  fetch_ahead(x, n * 2);
  __m256 sg[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, sgx[2] = {sg[0], sg[0]};
  for (int64_t j = 0; j < n; j += 16)
    for (int h = 0; h < 2; ++h) {
      const int64_t c = j + 8 * h;
      const __m256 g16 = widen16_avx2(gy + c, f16), xh = widen16_avx2(x + c, f16);
      const __m256 g = _mm256_mul_ps(g16, _mm256_loadu_ps(w + c));
      sg[h] = _mm256_add_ps(sg[h], g);
      sgx[h] = _mm256_add_ps(sgx[h], _mm256_mul_ps(g, xh));
      add_to_f64_avx2(gw + c, _mm256_mul_ps(g16, xh));
      add_to_f64_avx2(gb + c, g16);
    }
  if (!dx) return;
  float lanes[kLanes];
  _mm256_storeu_ps(lanes, sg[0]);
  _mm256_storeu_ps(lanes + 8, sg[1]);
  const __m256 mean_g = _mm256_set1_ps(lanes_total(lanes) / float(n));
  _mm256_storeu_ps(lanes, sgx[0]);
  _mm256_storeu_ps(lanes + 8, sgx[1]);
  const __m256 mean_gx = _mm256_set1_ps(lanes_total(lanes) / float(n));
  const __m256 vrs = _mm256_set1_ps(rs);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 g16 = widen16_avx2(gy + j, f16), xh = widen16_avx2(x + j, f16);
    const __m256 t =
        _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(g16, _mm256_loadu_ps(w + j)), mean_g), _mm256_mul_ps(xh, mean_gx));
    _mm256_storeu_ps(dx + j, _mm256_mul_ps(vrs, t));
  }
}

// The function for groups of R rows (1 or kRowGroup).
template <int R>
LayerNormRowFn layer_norm_rows_fn() {
  switch (simd_lanes()) {
    case Lanes::avx512:
      return &layer_norm_rows_avx512<R>;
    case Lanes::avx2:
      return &layer_norm_rows_avx2<R>;
    case Lanes::none:
      break;
  }
  return &layer_norm_rows_baseline<R>;
}
LayerNormRowBackwardFn layer_norm_row_backward_fn(bool normalized) {
  switch (simd_lanes()) {
    case Lanes::avx512:
      return normalized ? &layer_norm_row_backward_avx512<true> : &layer_norm_row_backward_avx512<false>;
    case Lanes::avx2:
      return normalized ? &layer_norm_row_backward_avx2<true> : &layer_norm_row_backward_avx2<false>;
    case Lanes::none:
      break;
  }
  return normalized ? &layer_norm_row_backward_baseline<true> : &layer_norm_row_backward_baseline<false>;
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
  if (!usable(x) || !usable(weight) || !usable(bias) || !usable(xhat) || !usable(dst)) return false;
  Tensor xhat_dst = xhat;  // shares xhat's storage
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<float> w = values_or(weight, cols, 1.f), b = values_or(bias, cols, 0.f);
  std::vector<float> m(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));
  const LayerNormRow row{w.data(), b.data(), cols};
  const LayerNormRowFn group_fn = layer_norm_rows_fn<kRowGroup>(), one_fn = layer_norm_rows_fn<1>();
  const int64_t groups = (rows + kRowGroup - 1) / kRowGroup;
  const bool bf16_out = dst.dtype() == DType::bf16 && (!xhat.defined() || xhat.dtype() == DType::bf16) &&
                        simd_lanes() == Lanes::avx512 && detail::native_bf16_rounding();
  const bool out16_avx2 = (dst.dtype() == DType::bf16 || dst.dtype() == DType::f16) &&
                          (!xhat.defined() || xhat.dtype() == dst.dtype()) && simd_lanes() == Lanes::avx2;
  auto* const y16 = static_cast<uint16_t*>(dst.data_ptr());
  auto* const xh16 = xhat.defined() ? static_cast<uint16_t*>(xhat_dst.data_ptr()) : nullptr;
#pragma omp parallel
  {
    std::vector<float> in(size_t(kRowGroup * cols)), out(size_t(kRowGroup * cols)),
        xh(xhat.defined() ? size_t(kRowGroup * cols) : 0);
#pragma omp for schedule(static)
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t r0 = grp * kRowGroup, count = std::min<int64_t>(kRowGroup, rows - r0);
      const float* src[kRowGroup] = {};
      float *y[kRowGroup] = {}, *xh_rows[kRowGroup] = {};
      // The rows 4 KiB ahead (fetch_ahead; this thread's next groups: static schedule): the gpt's
      // forward norms, alternating profiles on the AMX host (2026-12-05), 1.80-1.85 -> 1.67-1.81 ms
      // a step (a little, in every pair).
      const int64_t es = int64_t(dtype_size(x.dtype()));
      fetch_ahead(static_cast<const char*>(x.data_ptr()) + r0 * cols * es, count * cols * es);
      const float* group_in = in_f32(x.data_ptr(), x.dtype(), r0 * cols, count * cols, in.data());
      if (bf16_out || out16_avx2) {
        uint16_t *y_rows[kRowGroup] = {}, *xh16_rows[kRowGroup] = {};
        for (int64_t k = 0; k < count; ++k) {
          src[k] = group_in + k * cols;
          y_rows[k] = y16 + (r0 + k) * cols;
          xh16_rows[k] = xh16 ? xh16 + (r0 + k) * cols : nullptr;
        }
        float* const mk = m.data() + r0;
        float* const rk = rs.data() + r0;
        const DType t = dst.dtype();
        if (count == kRowGroup) {
          if (bf16_out)
            layer_norm_rows_bf16<kRowGroup>(row, src, eps, y_rows, xh16_rows, mk, rk);
          else
            layer_norm_rows_16_avx2<kRowGroup>(row, src, eps, t, y_rows, xh16_rows, mk, rk);
        } else {
          for (int64_t k = 0; k < count; ++k)
            if (bf16_out)
              layer_norm_rows_bf16<1>(row, src + k, eps, y_rows + k, xh16_rows + k, mk + k, rk + k);
            else
              layer_norm_rows_16_avx2<1>(row, src + k, eps, t, y_rows + k, xh16_rows + k, mk + k, rk + k);
        }
        continue;
      }
      for (int64_t k = 0; k < count; ++k) {
        const int64_t begin = (r0 + k) * cols;
        src[k] = group_in + k * cols;
        y[k] = out_f32(dst.data_ptr(), dst.dtype(), begin, out.data() + k * cols);
        if (!xh.empty()) xh_rows[k] = out_f32(xhat_dst.data_ptr(), xhat_dst.dtype(), begin, xh.data() + k * cols);
      }
      if (count == kRowGroup) {
        group_fn(row, src, eps, y, xh_rows, m.data() + r0, rs.data() + r0);
      } else {
        for (int64_t k = 0; k < count; ++k)
          one_fn(row, src + k, eps, y + k, xh_rows + k, m.data() + r0 + k, rs.data() + r0 + k);
      }
      // The group's rows lie one after another in dst, xhat and the buffers: one rounding store each
      // (a call per row of the gpt's 128 columns cost more than its conversion).
      flush_f32(dst.data_ptr(), dst.dtype(), r0 * cols, count * cols, out.data());
      if (!xh.empty()) flush_f32(xhat_dst.data_ptr(), xhat_dst.dtype(), r0 * cols, count * cols, xh.data());
    }
  }
  mean = Tensor::from_vector(m, {rows}, DType::f32);
  rstd = Tensor::from_vector(rs, {rows}, DType::f32);
  return true;
}

bool layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, bool need_x, bool need_weight, bool need_bias, DType grad_x_dtype,
                         NormGrads& out) {
  if (!usable(grad_y) || !usable(x) || !usable(weight) || !f32_compute(grad_x_dtype) || rstd.dtype() != DType::f32 ||
      (mean.defined() && mean.dtype() != DType::f32))
    return false;
  const int64_t rows = x.size(0), cols = x.size(1);
  // Without a mean, x is x̂ already (the forward's `xhat`): mean 0 and scale 1 for it.
  const bool normalized = !mean.defined();
  const std::vector<float> m = normalized ? std::vector<float>(size_t(rows), 0.f) : mean.to_vector(),
                           rs = rstd.to_vector(), w = values_or(weight, cols, 1.f);
  if (need_x) out.x = Tensor::empty(x.shape(), grad_x_dtype);
  // Per-thread partial sums of dweight/dbias, combined in thread order: deterministic.
  std::vector<std::vector<double>> gw_parts(static_cast<size_t>(omp_get_max_threads())), gb_parts(gw_parts.size());
  const LayerNormRow row{w.data(), nullptr, cols};
  const LayerNormRowBackwardFn row_fn = layer_norm_row_backward_fn(normalized);
  // Rows in groups of kRowGroup, each group's 16-bit rows converted by one call (they are contiguous)
  // and its grad_x rounded by one: a call per row of the gpt's 128 columns cost more than the row.
  const int64_t groups = (rows + kRowGroup - 1) / kRowGroup, group_elems = kRowGroup * cols;
  // The 16-bit rows read in place (no conversion calls, no x̂ buffer): bf16 with AVX-512, bf16 and
  // f16 with AVX2.
  const bool sixteen = grad_y.dtype() == x.dtype() &&
                       (x.dtype() == DType::bf16 || (x.dtype() == DType::f16 && simd_lanes() == Lanes::avx2));
  const bool direct =
      normalized && sixteen && (!need_x || grad_x_dtype == DType::f32) && cols % 16 == 0 && simd_lanes() != Lanes::none;
  const bool avx2 = simd_lanes() == Lanes::avx2, f16 = x.dtype() == DType::f16;
  const auto* gy16 = static_cast<const uint16_t*>(grad_y.data_ptr());
  const auto* x16 = static_cast<const uint16_t*>(x.data_ptr());
#pragma omp parallel
  {
    std::vector<float> gbuf, xbuf, ob(static_cast<size_t>(group_elems)), xhat(static_cast<size_t>(cols));
    std::vector<double>& gw_t = gw_parts[size_t(omp_get_thread_num())];
    std::vector<double>& gb_t = gb_parts[size_t(omp_get_thread_num())];
    gw_t.assign(size_t(cols), 0.0);
    gb_t.assign(size_t(cols), 0.0);
#pragma omp for schedule(static)
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t r0 = grp * kRowGroup, count = std::min<int64_t>(kRowGroup, rows - r0);
      if (direct) {
        for (int64_t r = r0; r < r0 + count; ++r) {
          float* const dx = need_x ? out.x.data<float>() + r * cols : nullptr;
          if (avx2)
            layer_norm_row_backward_16_avx2(w.data(), cols, gy16 + r * cols, x16 + r * cols, f16, rs[size_t(r)],
                                            gw_t.data(), gb_t.data(), dx);
          else
            layer_norm_row_backward_bf16(w.data(), cols, gy16 + r * cols, x16 + r * cols, rs[size_t(r)], gw_t.data(),
                                         gb_t.data(), dx);
        }
        continue;
      }
      const float* gy = in_f32(grad_y, r0 * cols, count * cols, gbuf);
      const float* xv = in_f32(x, r0 * cols, count * cols, xbuf);
      float* dx = need_x ? out_plane(out.x, r0 * cols, ob) : nullptr;
      for (int64_t k = 0; k < count; ++k)
        row_fn(row, gy + k * cols, xv + k * cols, m[size_t(r0 + k)], rs[size_t(r0 + k)], xhat.data(), gw_t.data(),
               gb_t.data(), dx ? dx + k * cols : nullptr);
      if (dx) finish_plane(out.x, r0 * cols, count * cols, dx);
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
