// Fast CPU softmax and log_softmax over the last dimension: OpenMP over rows, each row in f32
// (rows up to one block; longer rows fall back to the reference). On AVX-512 a row is 16 lanes:
// the max, the sum of exponentials and the backward's dot product in lane-wise partial sums added
// in lane order (a fixed order, whatever the threads), e^x by vec_exp.h's exp_ps (within 2 ulp),
// f32 rows read and written in place; on AVX2 the same in 8 lanes (exp256_ps). Elsewhere the
// scalar loops with std::exp.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/cpu/vec_exp.h"
#include "kernels/loss.h"
#include "kernels/softmax.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

#define MIXPREC_AVX512 __attribute__((target("avx512f")))

// The log of the sum of e^v over a row of cols f32: max + log(sum e^(v - max)).
MIXPREC_AVX512 float row_lse_avx512(const float* v, int64_t cols) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 vmax = ninf;
  for (int64_t c = 0; c < cols; c += 16)
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(ninf, first_lanes(cols - c), v + c));
  // A NaN anywhere makes the row NaN through the sum below, whichever lane's max kept it.
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + c), mx))));
  }
  return _mm512_cvtss_f32(mx) + std::log(lane_sum(acc));
}

// v (cols f32) -> out: softmax or log_softmax. out may be v.
MIXPREC_AVX512 void softmax_row_avx512(const float* v, int64_t cols, bool log, float* out) {
  const __m512 vl = _mm512_set1_ps(row_lse_avx512(v, cols));
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + c), vl);
    _mm512_mask_storeu_ps(out + c, m, log ? d : exp_ps(d));
  }
}

// g (cols f32, the output's gradient) -> out, from y (the output). out may be g.
MIXPREC_AVX512 void softmax_row_backward_avx512(const float* y, const float* g, int64_t cols, bool log, float* out) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + c);
    acc = log ? _mm512_add_ps(acc, gv) : _mm512_add_ps(acc, _mm512_mul_ps(gv, _mm512_maskz_loadu_ps(m, y + c)));
  }
  const __m512 dot = _mm512_set1_ps(lane_sum(acc));
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    const __m512 yv = _mm512_maskz_loadu_ps(m, y + c), gv = _mm512_maskz_loadu_ps(m, g + c);
    const __m512 r =
        log ? _mm512_sub_ps(gv, _mm512_mul_ps(exp_ps(yv), dot)) : _mm512_mul_ps(yv, _mm512_sub_ps(gv, dot));
    _mm512_mask_storeu_ps(out + c, m, r);
  }
}
// Cross-entropy's backward on a row, less the target's term: out = e^(v - lse) * s. out may be v.
MIXPREC_AVX512 void ce_row_backward_avx512(const float* v, int64_t cols, float lse, float s, float* out) {
  const __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(s);
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + c), vl);
    _mm512_mask_storeu_ps(out + c, m, _mm512_mul_ps(exp_ps(d), vs));
  }
}
#undef MIXPREC_AVX512

// The same on 8 lanes (AVX2 and FMA, hosts without AVX-512), e^x by exp256_ps; a row's last chunk
// loads masked (the max's masked lanes -inf) and stores its lanes in pieces (store_first8).
#define MIXPREC_AVX2 __attribute__((target("avx2,fma")))
MIXPREC_AVX2 inline __m256 load8(const float* p, int64_t n, __m256 fill) {
  if (n >= 8) return _mm256_loadu_ps(p);
  const __m256i m = first_lanes8(n);
  return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

MIXPREC_AVX2 float row_lse_avx2(const float* v, int64_t cols) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
  __m256 vmax = ninf;
  for (int64_t c = 0; c < cols; c += 8) vmax = _mm256_max_ps(vmax, load8(v + c, cols - c, ninf));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float row_max = -INFINITY;
  for (float l : lanes) row_max = std::max(row_max, l);
  // A NaN anywhere makes the row NaN through the sum below, whichever lane's max kept it.
  const __m256 mx = _mm256_set1_ps(row_max);
  __m256 acc = zero;
  for (int64_t c = 0; c < cols; c += 8) {
    const __m256 e = exp256_ps(_mm256_sub_ps(load_first8(v + c, cols - c), mx));
    acc = _mm256_add_ps(acc, cols - c >= 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(first_lanes8(cols - c))));
  }
  return row_max + std::log(lane_sum(acc));
}

MIXPREC_AVX2 void softmax_row_avx2(const float* v, int64_t cols, bool log, float* out) {
  const __m256 vl = _mm256_set1_ps(row_lse_avx2(v, cols));
  for (int64_t c = 0; c < cols; c += 8) {
    const __m256 d = _mm256_sub_ps(load_first8(v + c, cols - c), vl);
    store_first8(out + c, log ? d : exp256_ps(d), cols - c);
  }
}

MIXPREC_AVX2 void ce_row_backward_avx2(const float* v, int64_t cols, float lse, float s, float* out) {
  const __m256 vl = _mm256_set1_ps(lse), vs = _mm256_set1_ps(s);
  for (int64_t c = 0; c < cols; c += 8) {
    const __m256 d = _mm256_sub_ps(load_first8(v + c, cols - c), vl);
    store_first8(out + c, _mm256_mul_ps(exp256_ps(d), vs), cols - c);
  }
}

MIXPREC_AVX2 void softmax_row_backward_avx2(const float* y, const float* g, int64_t cols, bool log, float* out) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 acc = zero;
  for (int64_t c = 0; c < cols; c += 8) {
    const __m256 gv = load_first8(g + c, cols - c);
    acc = log ? _mm256_add_ps(acc, gv) : _mm256_add_ps(acc, _mm256_mul_ps(gv, load_first8(y + c, cols - c)));
  }
  const __m256 dot = _mm256_set1_ps(lane_sum(acc));
  for (int64_t c = 0; c < cols; c += 8) {
    const __m256 yv = load_first8(y + c, cols - c), gv = load_first8(g + c, cols - c);
    const __m256 r =
        log ? _mm256_sub_ps(gv, _mm256_mul_ps(exp256_ps(yv), dot)) : _mm256_mul_ps(yv, _mm256_sub_ps(gv, dot));
    store_first8(out + c, r, cols - c);
  }
}
#undef MIXPREC_AVX2

float row_lse_scalar(const float* x, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[c]);
  float total = 0.f;
  for (int64_t c = 0; c < cols; ++c) total += std::exp(x[c] - mx);
  return mx + std::log(total);
}

void softmax_row_scalar(const float* x, int64_t cols, bool log, float* v) {
  const float lse = row_lse_scalar(x, cols);
  for (int64_t c = 0; c < cols; ++c) v[c] = log ? x[c] - lse : std::exp(x[c] - lse);
}

void softmax_row_backward_scalar(const float* yv, const float* gv, int64_t cols, bool log, float* g) {
  float dot = 0.f;
  for (int64_t c = 0; c < cols; ++c) dot += log ? gv[c] : gv[c] * yv[c];
  for (int64_t c = 0; c < cols; ++c) g[c] = log ? gv[c] - std::exp(yv[c]) * dot : yv[c] * (gv[c] - dot);
}

void ce_row_backward_scalar(const float* x, int64_t cols, float lse, float s, float* out) {
  for (int64_t c = 0; c < cols; ++c) out[c] = std::exp(x[c] - lse) * s;
}

}  // namespace

bool softmax_lastdim(const Tensor& x, bool log, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || !x.is_contiguous() || x.dim() == 0) return false;
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  if (cols > kBlock) return false;
  const auto row_fn = simd_lanes() == Lanes::avx512 ? &softmax_row_avx512
                      : simd_lanes() == Lanes::avx2 ? &softmax_row_avx2
                                                    : &softmax_row_scalar;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * cols, 1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float v[kBlock];
    const float* in = in_f32(x.data_ptr(), t, r * cols, cols, v);
    float* out = out_f32(dst.data_ptr(), t, r * cols, v);
    row_fn(in, cols, log, out);
    flush_f32(dst.data_ptr(), t, r * cols, cols, out);
  }
  return true;
}

bool softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log, Tensor& dst) {
  const DType t = y.dtype();
  if (!f32_compute(t) || grad_y.dtype() != t || !y.is_contiguous() || !grad_y.is_contiguous() || y.dim() == 0)
    return false;
  const int64_t cols = y.size(-1), rows = cols ? y.numel() / cols : 0;
  if (cols > kBlock) return false;
  const auto row_fn = simd_lanes() == Lanes::avx512 ? &softmax_row_backward_avx512
                      : simd_lanes() == Lanes::avx2 ? &softmax_row_backward_avx2
                                                    : &softmax_row_backward_scalar;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * cols, 1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float yb[kBlock], gb[kBlock];
    const float* yv = in_f32(y.data_ptr(), t, r * cols, cols, yb);
    const float* gv = in_f32(grad_y.data_ptr(), t, r * cols, cols, gb);
    float* out = out_f32(dst.data_ptr(), t, r * cols, gb);
    row_fn(yv, gv, cols, log, out);
    flush_f32(dst.data_ptr(), t, r * cols, cols, out);
  }
  return true;
}

// Cross-entropy (loss.h) on the rows above: each row's lse by the softmax's own function, so the
// losses and gradients are log_softmax's then nll_loss's, bit for bit, without their [N, C] f32
// tensors (for rows of up to a block, which log_softmax's fast kernel takes; longer ones, a
// vocabulary of 50304, run here too, where log_softmax goes to the reference). A 16-bit row is
// widened into a per-thread buffer of the row. The per-row losses are summed in row order in f64,
// as nll_loss's reference sums them.
bool cross_entropy_forward(const Tensor& logits, const Tensor& target, LossReduce r, int64_t ignore_index,
                           CrossEntropyResult& out) {
  const DType t = logits.dtype();
  if (!f32_compute(t) || !logits.is_contiguous() || logits.dim() == 0) return false;
  const int64_t cols = logits.size(-1), rows = target.numel();
  if (cols == 0) return false;
  const std::vector<int64_t> tg = target.to_vector_i64();
  ref::check_class_targets(tg, cols, ignore_index);
  const auto lse_fn = simd_lanes() == Lanes::avx512 ? &row_lse_avx512
                      : simd_lanes() == Lanes::avx2 ? &row_lse_avx2
                                                    : &row_lse_scalar;
  out.lse = Tensor::empty({rows}, DType::f32);
  float* lse = out.lse.data<float>();
  std::vector<float> losses(static_cast<size_t>(rows));
  // 16-bit logits are widened a group of rows per conversion call: a call per row of the gpt's 81
  // classes cost as much as the row's log-sum-exp (the bf16 loss took twice the f32 one).
  constexpr int64_t kGroup = 16;
  const int64_t groups = (rows + kGroup - 1) / kGroup;
#pragma omp parallel if (detail::parallel_worth(rows * cols, 1 << 15))
  {
    std::vector<float> v(t == DType::f32 ? 0 : size_t(kGroup * cols));
#pragma omp for schedule(static)
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t i0 = grp * kGroup, n = std::min(kGroup, rows - i0);
      const float* block = in_f32(logits.data_ptr(), t, i0 * cols, n * cols, v.data());
      for (int64_t i = i0; i < i0 + n; ++i) {
        const float* in = block + (i - i0) * cols;
        lse[i] = lse_fn(in, cols);
        losses[size_t(i)] = tg[size_t(i)] == ignore_index ? 0.f : lse[i] - in[tg[size_t(i)]];
      }
    }
  }
  if (r == LossReduce::none) {
    out.loss = Tensor::from_vector(losses, target.shape());
    return true;
  }
  double total = 0;
  for (float l : losses) total += double(l);
  out.loss = Tensor::scalar(total * ref::mean_scale(r, tg, ignore_index), DType::f32);
  return true;
}

bool cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& lse, const Tensor& target,
                            LossReduce r, int64_t ignore_index, Tensor& dst) {
  const DType t = logits.dtype();
  if (!f32_compute(t) || !logits.is_contiguous() || logits.dim() == 0) return false;
  const int64_t cols = logits.size(-1), rows = target.numel();
  if (cols == 0) return false;
  const std::vector<int64_t> tg = target.to_vector_i64();
  const std::vector<double> gv = grad.to_vector_f64();
  // nll_loss's backward: its gradient, rounded to f32 from f64, is -s at the target.
  const float reduced = r == LossReduce::none ? 0.f : float(gv[0] * ref::mean_scale(r, tg, ignore_index));
  const auto row_fn = simd_lanes() == Lanes::avx512 ? &ce_row_backward_avx512
                      : simd_lanes() == Lanes::avx2 ? &ce_row_backward_avx2
                                                    : &ce_row_backward_scalar;
  const float* l = lse.data<float>();
  // Groups of rows per conversion call, as the forward (16-bit rows computed in place in the buffer).
  constexpr int64_t kGroup = 16;
  const int64_t groups = (rows + kGroup - 1) / kGroup;
#pragma omp parallel if (detail::parallel_worth(rows * cols, 1 << 15))
  {
    std::vector<float> v(t == DType::f32 ? 0 : size_t(kGroup * cols));
#pragma omp for schedule(static)
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t i0 = grp * kGroup, n = std::min(kGroup, rows - i0);
      const float* in = in_f32(logits.data_ptr(), t, i0 * cols, n * cols, v.data());
      float* o = out_f32(dst.data_ptr(), t, i0 * cols, v.data());
      for (int64_t i = i0; i < i0 + n; ++i) {
        const int64_t ti = tg[size_t(i)], k = (i - i0) * cols;
        const float s = ti == ignore_index ? 0.f : r == LossReduce::none ? float(gv[size_t(i)]) : reduced;
        row_fn(in + k, cols, l[i], s, o + k);
        if (ti != ignore_index) o[k + ti] = o[k + ti] - s;
      }
      flush_f32(dst.data_ptr(), t, i0 * cols, n * cols, o);
    }
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
