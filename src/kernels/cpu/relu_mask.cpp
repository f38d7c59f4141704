// ReLU on the raw bits, vectorised, for f32, bf16 and f16: the forward (NaN stays NaN), and the
// backward mask dst = y > 0 ? grad : 0, in place (the fused ReLU of conv) or into a new tensor
// (the relu op), grad, y and dst of one dtype.
// y may be ReLU's input or its output: both are > 0 at the same positions. 16-bit values need
// no conversion: y > 0 holds exactly for the bit patterns 0x0001..+inf (positive, not NaN),
// +inf being 0x7F80 in bf16 and 0x7C00 in f16.
#include "core/simd.h"

#include <algorithm>
#include <cstring>

#include "kernels/kernels.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

__attribute__((target("avx512f"))) void mask_f32(float* dst, const float* g, const float* y, int64_t begin,
                                                 int64_t end) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), zero, _CMP_GT_OQ);
    _mm512_storeu_ps(dst + i, _mm512_maskz_mov_ps(keep, _mm512_loadu_ps(g + i)));
  }
  for (; i < end; ++i) dst[i] = y[i] > 0.f ? g[i] : 0.f;
}

__attribute__((target("avx512f,avx512bw"))) void mask_16(uint16_t* dst, const uint16_t* g, const uint16_t* y,
                                                         uint16_t inf, int64_t begin, int64_t end) {
  const __m512i lo = _mm512_set1_epi16(0x0001), hi = _mm512_set1_epi16(short(inf));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m512i v = _mm512_loadu_si512(y + i);
    const __mmask32 keep = _mm512_cmpge_epu16_mask(v, lo) & _mm512_cmple_epu16_mask(v, hi);
    _mm512_storeu_si512(dst + i, _mm512_maskz_mov_epi16(keep, _mm512_loadu_si512(g + i)));
  }
  for (; i < end; ++i) dst[i] = y[i] >= 0x0001 && y[i] <= inf ? g[i] : uint16_t(0);
}

// relu(x) = x > 0 || x is NaN ? x : +0.
__attribute__((target("avx512f"))) void relu_f32(float* dst, const float* x, int64_t begin, int64_t end) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(dst + i, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_NLE_UQ), v));
  }
  for (; i < end; ++i) dst[i] = x[i] > 0.f || x[i] != x[i] ? x[i] : 0.f;
}

// 16-bit: zero exactly the negative numbers (0x8000..0x8000|inf) and +0; NaNs of either sign stay.
__attribute__((target("avx512f,avx512bw"))) void relu_16(uint16_t* dst, const uint16_t* x, uint16_t inf,
                                                         int64_t begin, int64_t end) {
  const __m512i neg_lo = _mm512_set1_epi16(short(0x8000)), neg_hi = _mm512_set1_epi16(short(0x8000 | inf));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m512i v = _mm512_loadu_si512(x + i);
    const __mmask32 neg = _mm512_cmpge_epu16_mask(v, neg_lo) & _mm512_cmple_epu16_mask(v, neg_hi);
    _mm512_storeu_si512(dst + i, _mm512_maskz_mov_epi16(~neg, v));
  }
  for (; i < end; ++i) dst[i] = x[i] >= 0x8000 && x[i] <= (0x8000 | inf) ? uint16_t(0) : x[i];
}

bool has_avx512bw() {
  static const bool ok = __builtin_cpu_supports("avx512bw");
  return ok;
}

bool supported(const Tensor& dst, const Tensor& grad, const Tensor& y) {
  const DType t = grad.dtype();
  if (y.dtype() != t || dst.dtype() != t || !grad.is_contiguous() || !y.is_contiguous() || !dst.is_contiguous() ||
      y.numel() != grad.numel() || dst.numel() != grad.numel() || !mixprec::cpu::has_avx512f())
    return false;
  return t == DType::f32 || ((t == DType::bf16 || t == DType::f16) && has_avx512bw());
}

// f(begin, end, inf) over chunks of n elements, in parallel when there are enough; inf is the
// 16-bit dtype's +inf pattern.
template <class F>
void for_chunks(int64_t n, DType t, F&& f) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const uint16_t inf = t == DType::bf16 ? 0x7F80 : 0x7C00;
#pragma omp parallel for schedule(static) if (chunks >= 4)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, c * kChunk + kChunk), inf);
}

void apply(Tensor& dst, const Tensor& grad, const Tensor& y) {
  for_chunks(grad.numel(), grad.dtype(), [&](int64_t begin, int64_t end, uint16_t inf) {
    if (grad.dtype() == DType::f32)
      mask_f32(dst.data<float>(), grad.data<float>(), y.data<float>(), begin, end);
    else
      mask_16(dst.data<uint16_t>(), grad.data<uint16_t>(), y.data<uint16_t>(), inf, begin, end);
  });
}

}  // namespace

bool relu_forward(const Tensor& x, Tensor& dst) {
  if (!supported(dst, x, x)) return false;
  for_chunks(x.numel(), x.dtype(), [&](int64_t begin, int64_t end, uint16_t inf) {
    if (x.dtype() == DType::f32)
      relu_f32(dst.data<float>(), x.data<float>(), begin, end);
    else
      relu_16(dst.data<uint16_t>(), x.data<uint16_t>(), inf, begin, end);
  });
  return true;
}

bool relu_mask_inplace(Tensor& grad, const Tensor& y) {
  if (!supported(grad, grad, y)) return false;
  apply(grad, grad, y);
  return true;
}

bool relu_mask(const Tensor& grad, const Tensor& y, Tensor& dst) {
  if (!supported(dst, grad, y)) return false;
  apply(dst, grad, y);
  return true;
}

}  // namespace mixprec::kernels::cpu
