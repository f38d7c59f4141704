// The fused ReLU's backward mask, in place and vectorised: grad = y > 0 ? grad : 0 for f32 and
// bf16 (grad and y of one dtype). bf16 needs no conversion: y > 0 holds exactly for the bit
// patterns 0x0001..0x7F80 (positive, not NaN).
#include "core/simd.h"

#include <algorithm>
#include <cstring>

#include "kernels/kernels.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

__attribute__((target("avx512f"))) void mask_f32(float* g, const float* y, int64_t begin, int64_t end) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), zero, _CMP_GT_OQ);
    _mm512_storeu_ps(g + i, _mm512_maskz_mov_ps(keep, _mm512_loadu_ps(g + i)));
  }
  for (; i < end; ++i)
    if (!(y[i] > 0.f)) g[i] = 0.f;
}

__attribute__((target("avx512f,avx512bw"))) void mask_bf16(uint16_t* g, const uint16_t* y, int64_t begin, int64_t end) {
  const __m512i lo = _mm512_set1_epi16(0x0001), hi = _mm512_set1_epi16(0x7F80);
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m512i v = _mm512_loadu_si512(y + i);
    const __mmask32 keep = _mm512_cmpge_epu16_mask(v, lo) & _mm512_cmple_epu16_mask(v, hi);
    _mm512_storeu_si512(g + i, _mm512_maskz_mov_epi16(keep, _mm512_loadu_si512(g + i)));
  }
  for (; i < end; ++i)
    if (!(y[i] >= 0x0001 && y[i] <= 0x7F80)) g[i] = 0;
}

bool has_avx512bw() {
  static const bool ok = __builtin_cpu_supports("avx512bw");
  return ok;
}

}  // namespace

bool relu_mask_inplace(Tensor& grad, const Tensor& y) {
  if (grad.dtype() != y.dtype() || !grad.is_contiguous() || !y.is_contiguous() || !mixprec::cpu::has_avx512f())
    return false;
  if (grad.dtype() != DType::f32 && !(grad.dtype() == DType::bf16 && has_avx512bw())) return false;
  const int64_t n = grad.numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks >= 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    if (grad.dtype() == DType::f32) mask_f32(grad.data<float>(), y.data<float>(), begin, end);
    else mask_bf16(grad.data<uint16_t>(), y.data<uint16_t>(), begin, end);
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
