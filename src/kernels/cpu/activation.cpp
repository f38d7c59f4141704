// Fast CPU activation kernels, forward and backward, f32/bf16/f16 (f64 goes to the reference).
// ReLU works on the raw bits, vectorised: the forward (NaN stays NaN) and the mask
// dst = y > 0 ? grad : 0, in place (the fused ReLU of conv/linear) or into a new tensor. y may be
// ReLU's input or its output: both are > 0 at the same positions. 16-bit values need no
// conversion: y > 0 holds exactly for the bit patterns 0x0001..+inf (positive, not NaN), +inf
// being 0x7F80 in bf16 and 0x7C00 in f16.
// 16-bit tensors of the smooth activations on AVX-512 and AVX2 hosts go through tables of all
// 65536 values (cpu/activation_table.cpp), which give the bits of the arithmetic here.
// silu, sigmoid, tanh and gelu's tanh form run AVX-512 on f32 blocks (16-bit converted in, rounded once out) with a
// vector exp (Cephes expf: a degree-7 polynomial after range reduction, scaled by 2^n with
// scalef, within 2 ulp of the correctly rounded e^x); exact gelu, and on CPUs without AVX-512 all
// but ReLU and gelu's tanh form (AVX2 there), use the scalar formula of elementwise_math.h on the
// same blocks.
#include "core/simd.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/parallel.h"
#include "kernels/activation.h"
#include "kernels/cpu/activation_table.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/cpu/vec_exp.h"
#include "kernels/elementwise_math.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "mixprec/error.h"

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
__attribute__((target("avx512f,avx512bw"))) void relu_16(uint16_t* dst, const uint16_t* x, uint16_t inf, int64_t begin,
                                                         int64_t end) {
  const __m512i neg_lo = _mm512_set1_epi16(short(0x8000)), neg_hi = _mm512_set1_epi16(short(0x8000 | inf));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m512i v = _mm512_loadu_si512(x + i);
    const __mmask32 neg = _mm512_cmpge_epu16_mask(v, neg_lo) & _mm512_cmple_epu16_mask(v, neg_hi);
    _mm512_storeu_si512(dst + i, _mm512_maskz_mov_epi16(~neg, v));
  }
  for (; i < end; ++i) dst[i] = x[i] >= 0x8000 && x[i] <= (0x8000 | inf) ? uint16_t(0) : x[i];
}

__attribute__((target("avx512f"))) inline __m512 sigmoid_ps(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// Cephes tanhf: an odd polynomial below |x| = 0.625 (where 1 - 2/(e^2x + 1) would cancel), else
// 1 - 2/(e^2|x| + 1) with x's sign (e^2|x| = inf gives 1).
__attribute__((target("avx512f"))) inline __m512 tanh_ps(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp_ps(_mm512_add_ps(ax, ax));
  const __m512 big_abs = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, one)));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)));
  const __m512 big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big_abs), sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
}

// GELU's tanh form: inner = c (x + 0.044715 x^3) as the reference (elementwise_math.h) has it,
// then 0.5 (1 + tanh(inner)) as sigmoid(2 inner) (below).
__attribute__((target("avx512f"))) inline __m512 gelu_inner_ps(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), x), x);
  return _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), _mm512_add_ps(x, x3));
}

// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^-2u): one exp and one division, where tanh_ps
// takes an exp, a division and a polynomial with its blend (GELU was 10% of the GPT's bf16 step).
__attribute__((target("avx512f"))) inline __m512 gelu_half_one_plus_t_ps(__m512 x) {
  const __m512 u = gelu_inner_ps(x);
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_add_ps(u, u)));
  return _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

template <Activation OP>
__attribute__((target("avx512f"))) inline __m512 value_ps(__m512 x) {
  if constexpr (OP == Activation::gelu_tanh) {  // 0.5 x (1 + t) = x sigmoid(2u)
    return _mm512_mul_ps(x, gelu_half_one_plus_t_ps(x));
  } else if constexpr (OP == Activation::sigmoid)
    return sigmoid_ps(x);
  else if constexpr (OP == Activation::tanh)
    return tanh_ps(x);
  else
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// The derivative from the saved tensor s, the same operations as activation_derivative.
template <Activation OP>
__attribute__((target("avx512f"))) inline __m512 derivative_ps(__m512 s) {
  const __m512 one = _mm512_set1_ps(1.f);
  if constexpr (OP == Activation::gelu_tanh) {
    // 0.5 (1 + t) + 0.5 s (1 - t^2) c (1 + 3 * 0.044715 s^2) with h = 0.5 (1 + t) = sigmoid(2u):
    // 1 - t^2 = 4 h (1 - h), so h + 2 s h (1 - h) c (1 + 3 * 0.044715 s^2).
    const __m512 h = gelu_half_one_plus_t_ps(s);
    __m512 b = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(s, s), h), _mm512_sub_ps(one, h));
    b = _mm512_mul_ps(_mm512_mul_ps(b, _mm512_set1_ps(0.7978845608028654f)),
                      _mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(float(3 * 0.044715)), s), s)));
    return _mm512_add_ps(h, b);
  } else if constexpr (OP == Activation::sigmoid) {
    return _mm512_mul_ps(s, _mm512_sub_ps(one, s));
  } else if constexpr (OP == Activation::tanh)
    return _mm512_sub_ps(one, _mm512_mul_ps(s, s));
  else {
    const __m512 sg = sigmoid_ps(s);
    return _mm512_mul_ps(sg, _mm512_add_ps(one, _mm512_mul_ps(s, _mm512_sub_ps(one, sg))));
  }
}

// dst = f(x) over len f32 values; the tail runs masked, so every element takes the vector path.
template <Activation OP>
__attribute__((target("avx512f"))) void forward_f32(const float* x, float* dst, int64_t len) {
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = first_lanes(len - i);
    _mm512_mask_storeu_ps(dst + i, m, value_ps<OP>(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// dst = grad * f'(s) over len f32 values.
template <Activation OP>
__attribute__((target("avx512f"))) void backward_f32(const float* g, const float* s, float* dst, int64_t len) {
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = first_lanes(len - i);
    const __m512 d = derivative_ps<OP>(_mm512_maskz_loadu_ps(m, s + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i), d));
  }
}

// The bf16 forms of forward_f32 and backward_f32: 16 values widened in registers, the f32 operations
// above, rounded once on the way out by the scalar rule, so the bits of the converted-block path
// without its two or three conversion passes through L1 (in the gpt's amp-bf16 step those passes
// took as long as GELU's arithmetic). kNative rounds with VCVTNEPS2BF16 (bf16_from_ps: the same
// bits) where the CPU has AVX512-BF16: bf16_round_epi32's ten integer operations a vector made the
// bf16 GELU slower than the f32 one on the Zen 5 kind (docs/hosts.md, 2026-12-05, later). Every
// function here carries AVX512-BF16 in its target so that the native form inlines; the integer form
// uses no instruction of it, and is what runs on AVX-512 CPUs without it (and here under the
// conversion path avx512f: detail::native_bf16_rounding, for the tests). A tail under 16 goes
// through stack copies.
// (MIXPREC_ACT_BF16: cpu/activation_table.h.)
template <Activation OP, bool kNative>
MIXPREC_ACT_BF16 inline __m256i forward_16(__m256i x) {
  return bf16_round_ps(value_ps<OP>(bf16_widen_ps(x)), kNative);
}
template <Activation OP, bool kNative>
MIXPREC_ACT_BF16 inline __m256i backward_16(__m256i g, __m256i s) {
  return bf16_round_ps(_mm512_mul_ps(bf16_widen_ps(g), derivative_ps<OP>(bf16_widen_ps(s))), kNative);
}

// 32 values a step where the CPU rounds natively: one VCVTNE2PS2BF16 and one denormal test for both
// halves.
MIXPREC_ACT_BF16 inline __m512 widen_lo(__m512i v) { return bf16_widen_ps(_mm512_castsi512_si256(v)); }
MIXPREC_ACT_BF16 inline __m512 widen_hi(__m512i v) { return bf16_widen_ps(_mm512_extracti64x4_epi64(v, 1)); }

// Each step asks for the line 4 KiB ahead of each of its loads (fetch_ahead): the saved input and
// the gradient of a gpt layer's GELU are 4 MiB each, and on the AMX host (2 MiB of L2 a core) the
// loads stalled on them (perf: a third of the backward's samples on the instructions after its two
// loads). gpt amp-bf16, `mixprec bench --profile` in alternating runs (2026-12-05): backward
// 4.28-4.77 -> 3.23-3.33 ms a step, forward 2.86-2.94 -> 2.19-2.30 (1, 2 and 8 KiB ahead within the
// noise of it).
template <Activation OP, bool kNative>
MIXPREC_ACT_BF16 void forward_bf16(const uint16_t* x, uint16_t* dst, int64_t len) {
  int64_t i = 0;
  if constexpr (kNative)
    for (; i + 32 <= len; i += 32) {
      fetch_ahead(x + i, 64);
      const __m512i v = _mm512_loadu_si512(x + i);
      _mm512_storeu_si512(dst + i, bf16_pair_from_ps(value_ps<OP>(widen_lo(v)), value_ps<OP>(widen_hi(v))));
    }
  for (; i + 16 <= len; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), forward_16<OP, kNative>(load_16(x + i)));
  if (i < len) store_tail(dst + i, forward_16<OP, kNative>(load_tail(x + i, len - i)), len - i);
}

template <Activation OP, bool kNative>
MIXPREC_ACT_BF16 void backward_bf16(const uint16_t* g, const uint16_t* s, uint16_t* dst, int64_t len) {
  int64_t i = 0;
  if constexpr (kNative)
    for (; i + 32 <= len; i += 32) {
      fetch_ahead(g + i, 64);
      fetch_ahead(s + i, 64);
      const __m512i gv = _mm512_loadu_si512(g + i), sv = _mm512_loadu_si512(s + i);
      _mm512_storeu_si512(dst + i, bf16_pair_from_ps(_mm512_mul_ps(widen_lo(gv), derivative_ps<OP>(widen_lo(sv))),
                                                     _mm512_mul_ps(widen_hi(gv), derivative_ps<OP>(widen_hi(sv)))));
    }
  for (; i + 16 <= len; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), backward_16<OP, kNative>(load_16(g + i), load_16(s + i)));
  if (i < len)
    store_tail(dst + i, backward_16<OP, kNative>(load_tail(g + i, len - i), load_tail(s + i, len - i)), len - i);
}

// ---------------------------------------------------------------- AVX2 (hosts without AVX-512)
// ReLU and its mask in 8 f32 or 16 16-bit lanes (the same selections as above: AVX2 has no
// unsigned 16-bit compare, so v in [lo, hi] is max(v, lo) == v == min(v, hi)), and GELU's tanh
// form on f32 with exp256_ps (the same operations as value_ps and derivative_ps, in the same
// order; 16-bit data goes through the f32 blocks). The other smooth activations, which no model of
// ours uses, keep the scalar formula there.

__attribute__((target("avx2"))) inline __m256i load_si256(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx2"))) inline void store_si256(uint16_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// All-ones in the 16-bit lanes of v within [lo, hi] (unsigned).
__attribute__((target("avx2"))) inline __m256i within_epu16(__m256i v, __m256i lo, __m256i hi) {
  return _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_max_epu16(v, lo), v),
                          _mm256_cmpeq_epi16(_mm256_min_epu16(v, hi), v));
}

__attribute__((target("avx2"))) void mask_f32_avx2(float* dst, const float* g, const float* y, int64_t begin,
                                                   int64_t end) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 keep = _mm256_cmp_ps(_mm256_loadu_ps(y + i), zero, _CMP_GT_OQ);
    _mm256_storeu_ps(dst + i, _mm256_and_ps(keep, _mm256_loadu_ps(g + i)));
  }
  for (; i < end; ++i) dst[i] = y[i] > 0.f ? g[i] : 0.f;
}

__attribute__((target("avx2"))) void mask_16_avx2(uint16_t* dst, const uint16_t* g, const uint16_t* y, uint16_t inf,
                                                  int64_t begin, int64_t end) {
  const __m256i lo = _mm256_set1_epi16(0x0001), hi = _mm256_set1_epi16(short(inf));
  int64_t i = begin;
  for (; i + 16 <= end; i += 16)
    store_si256(dst + i, _mm256_and_si256(within_epu16(load_si256(y + i), lo, hi), load_si256(g + i)));
  for (; i < end; ++i) dst[i] = y[i] >= 0x0001 && y[i] <= inf ? g[i] : uint16_t(0);
}

__attribute__((target("avx2"))) void relu_f32_avx2(float* dst, const float* x, int64_t begin, int64_t end) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(dst + i, _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_NLE_UQ), v));
  }
  for (; i < end; ++i) dst[i] = x[i] > 0.f || x[i] != x[i] ? x[i] : 0.f;
}

__attribute__((target("avx2"))) void relu_16_avx2(uint16_t* dst, const uint16_t* x, uint16_t inf, int64_t begin,
                                                  int64_t end) {
  const __m256i neg_lo = _mm256_set1_epi16(short(0x8000)), neg_hi = _mm256_set1_epi16(short(0x8000 | inf));
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256i v = load_si256(x + i);
    store_si256(dst + i, _mm256_andnot_si256(within_epu16(v, neg_lo, neg_hi), v));
  }
  for (; i < end; ++i) dst[i] = x[i] >= 0x8000 && x[i] <= (0x8000 | inf) ? uint16_t(0) : x[i];
}

// gelu_half_one_plus_t_ps on 8 lanes.
__attribute__((target("avx2,fma"))) inline __m256 gelu_half_one_plus_t_256(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), x), x);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_add_ps(x, x3));
  const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_add_ps(u, u)));
  return _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

// derivative_ps<gelu_tanh> on 8 lanes.
__attribute__((target("avx2,fma"))) inline __m256 gelu_derivative_256(__m256 s) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 h = gelu_half_one_plus_t_256(s);
  __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(s, s), h), _mm256_sub_ps(one, h));
  b = _mm256_mul_ps(_mm256_mul_ps(b, _mm256_set1_ps(0.7978845608028654f)),
                    _mm256_add_ps(one, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(float(3 * 0.044715)), s), s)));
  return _mm256_add_ps(h, b);
}

// dst = gelu(x) and dst = grad gelu'(s) over len f32 values; the tail through zero-padded stack
// copies, so every element takes the vector path.
__attribute__((target("avx2,fma"))) inline __m256 gelu_forward_256(const float* x) {
  const __m256 v = _mm256_loadu_ps(x);
  return _mm256_mul_ps(v, gelu_half_one_plus_t_256(v));
}
__attribute__((target("avx2,fma"))) void gelu_forward_f32_avx2(const float* x, float* dst, int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(dst + i, gelu_forward_256(x + i));
  if (i < len) {
    alignas(32) float in[8] = {}, out[8];
    std::memcpy(in, x + i, size_t(len - i) * sizeof(float));
    _mm256_store_ps(out, gelu_forward_256(in));
    std::memcpy(dst + i, out, size_t(len - i) * sizeof(float));
  }
}
__attribute__((target("avx2,fma"))) inline __m256 gelu_backward_256(const float* g, const float* s) {
  return _mm256_mul_ps(_mm256_loadu_ps(g), gelu_derivative_256(_mm256_loadu_ps(s)));
}
__attribute__((target("avx2,fma"))) void gelu_backward_f32_avx2(const float* g, const float* s, float* dst,
                                                                int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(dst + i, gelu_backward_256(g + i, s + i));
  if (i < len) {
    alignas(32) float gi[8] = {}, si[8] = {}, out[8];
    std::memcpy(gi, g + i, size_t(len - i) * sizeof(float));
    std::memcpy(si, s + i, size_t(len - i) * sizeof(float));
    _mm256_store_ps(out, gelu_backward_256(gi, si));
    std::memcpy(dst + i, out, size_t(len - i) * sizeof(float));
  }
}

bool has_avx512bw() {
  static const bool ok = __builtin_cpu_supports("avx512bw");
  return ok;
}

bool supported(const Tensor& dst, const Tensor& grad, const Tensor& y) {
  const DType t = grad.dtype();
  if (y.dtype() != t || dst.dtype() != t || !grad.is_contiguous() || !y.is_contiguous() || !dst.is_contiguous() ||
      y.numel() != grad.numel() || dst.numel() != grad.numel() || simd_lanes() == Lanes::none)
    return false;
  return t == DType::f32 || ((t == DType::bf16 || t == DType::f16) && (simd_lanes() == Lanes::avx2 || has_avx512bw()));
}

// f(begin, end, inf) over chunks of n elements, in parallel when there are enough; inf is the
// 16-bit dtype's +inf pattern.
template <class F>
void for_chunks(int64_t n, DType t, F&& f) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const uint16_t inf = t == DType::bf16 ? 0x7F80 : 0x7C00;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(chunks, 4))
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, c * kChunk + kChunk), inf);
}

void apply(Tensor& dst, const Tensor& grad, const Tensor& y) {
  const bool avx2 = simd_lanes() == Lanes::avx2;
  for_chunks(grad.numel(), grad.dtype(), [&](int64_t begin, int64_t end, uint16_t inf) {
    if (grad.dtype() == DType::f32)
      (avx2 ? mask_f32_avx2 : mask_f32)(dst.data<float>(), grad.data<float>(), y.data<float>(), begin, end);
    else
      (avx2 ? mask_16_avx2 : mask_16)(dst.data<uint16_t>(), grad.data<uint16_t>(), y.data<uint16_t>(), inf, begin, end);
  });
}

// dst = relu(x) over n raw elements of dtype t (f32, bf16 or f16; dst may be x), in chunks: the
// vector kernels where the host has them (supported()'s rule), else their scalar tails' rule.
void relu_elements(const void* x, void* dst, DType t, int64_t n) {
  const Lanes lanes = simd_lanes();
  const bool avx2 = lanes == Lanes::avx2;
  const bool vector = t == DType::f32 ? lanes != Lanes::none : avx2 || (lanes == Lanes::avx512 && has_avx512bw());
  for_chunks(n, t, [&](int64_t begin, int64_t end, uint16_t inf) {
    if (t == DType::f32) {
      const auto* in = static_cast<const float*>(x);
      auto* out = static_cast<float*>(dst);
      if (vector) {
        (avx2 ? relu_f32_avx2 : relu_f32)(out, in, begin, end);
      } else {
        for (int64_t i = begin; i < end; ++i) out[i] = in[i] > 0.f || in[i] != in[i] ? in[i] : 0.f;
      }
      return;
    }
    const auto* in = static_cast<const uint16_t*>(x);
    auto* out = static_cast<uint16_t*>(dst);
    if (vector) {
      (avx2 ? relu_16_avx2 : relu_16)(out, in, inf, begin, end);
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = in[i] >= 0x8000 && in[i] <= (0x8000 | inf) ? uint16_t(0) : in[i];
    }
  });
}

bool relu_forward(const Tensor& x, Tensor& dst) {
  if (!supported(dst, x, x)) return false;
  relu_elements(x.data_ptr(), dst.data_ptr(), x.dtype(), x.numel());
  return true;
}

bool vectorised(Activation op) {
  return (op == Activation::silu || op == Activation::sigmoid || op == Activation::tanh ||
          op == Activation::gelu_tanh) &&
         simd_lanes() == Lanes::avx512;
}

template <Activation OP>
void forward_blocks(const Tensor& x, Tensor& dst) {
  if (x.dtype() == DType::bf16 && dst.dtype() == DType::bf16) {
    const auto* src = static_cast<const uint16_t*>(x.data_ptr());
    auto* out = static_cast<uint16_t*>(dst.data_ptr());
    const bool native = detail::native_bf16_rounding();
    for_blocks(x.numel(), [&](int64_t begin, int64_t len) {
      (native ? forward_bf16<OP, true> : forward_bf16<OP, false>)(src + begin, out + begin, len);
    });
    return;
  }
  map_f32_blocks(x, dst, [](const float* v, float* o, int64_t len) { forward_f32<OP>(v, o, len); });
}

template <Activation OP>
void backward_blocks(const Tensor& grad, const Tensor& saved, Tensor& dst) {
  if (saved.dtype() == DType::bf16 && grad.dtype() == DType::bf16 && dst.dtype() == DType::bf16 &&
      grad.is_contiguous() && saved.is_contiguous() && dst.is_contiguous()) {
    const auto* g = static_cast<const uint16_t*>(grad.data_ptr());
    const auto* s = static_cast<const uint16_t*>(saved.data_ptr());
    auto* out = static_cast<uint16_t*>(dst.data_ptr());
    const bool native = detail::native_bf16_rounding();
    for_blocks(saved.numel(), [&](int64_t begin, int64_t len) {
      (native ? backward_bf16<OP, true> : backward_bf16<OP, false>)(g + begin, s + begin, out + begin, len);
    });
    return;
  }
  map_grad_f32_blocks(grad, saved, dst,
                      [](const float* g, const float* v, float* o, int64_t len) { backward_f32<OP>(g, v, o, len); });
}

}  // namespace

bool activation(Activation op, const Tensor& x, Tensor& dst) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous() || !dst.is_contiguous()) return false;
  if (op == Activation::relu && relu_forward(x, dst)) return true;
  if (table::use_table(op, x) && dst.dtype() == x.dtype()) {
    table::table_forward(op, x, dst);
    return true;
  }
  if (op == Activation::gelu_tanh && simd_lanes() == Lanes::avx2) {
    map_f32_blocks(x, dst, [](const float* v, float* o, int64_t len) { gelu_forward_f32_avx2(v, o, len); });
    return true;
  }
  if (vectorised(op)) {
    if (op == Activation::gelu_tanh)
      forward_blocks<Activation::gelu_tanh>(x, dst);
    else if (op == Activation::silu)
      forward_blocks<Activation::silu>(x, dst);
    else if (op == Activation::sigmoid)
      forward_blocks<Activation::sigmoid>(x, dst);
    else
      forward_blocks<Activation::tanh>(x, dst);
    return true;
  }
  map_f32_blocks(x, dst, [op](const float* v, float* o, int64_t len) {
    for (int64_t i = 0; i < len; ++i) o[i] = activation_value<float>(op, v[i]);
  });
  return true;
}

bool activation_grad(Activation op, const Tensor& grad, const Tensor& saved, Tensor& dst) {
  if (!f32_compute(saved.dtype()) || grad.dtype() != saved.dtype()) return false;
  if (op == Activation::relu && supported(dst, grad, saved)) {
    apply(dst, grad, saved);
    return true;
  }
  if (table::use_table(op, saved) && supported(dst, grad, saved)) {
    table::table_backward(op, grad, saved, dst);
    return true;
  }
  if (op == Activation::gelu_tanh && simd_lanes() == Lanes::avx2) {
    map_grad_f32_blocks(grad, saved, dst, [](const float* g, const float* v, float* o, int64_t len) {
      gelu_backward_f32_avx2(g, v, o, len);
    });
    return true;
  }
  if (vectorised(op)) {
    if (op == Activation::gelu_tanh)
      backward_blocks<Activation::gelu_tanh>(grad, saved, dst);
    else if (op == Activation::silu)
      backward_blocks<Activation::silu>(grad, saved, dst);
    else if (op == Activation::sigmoid)
      backward_blocks<Activation::sigmoid>(grad, saved, dst);
    else
      backward_blocks<Activation::tanh>(grad, saved, dst);
    return true;
  }
  map_grad_f32_blocks(grad, saved, dst, [op](const float* g, const float* v, float* o, int64_t len) {
    if (op == Activation::relu) {
      for (int64_t i = 0; i < len; ++i) o[i] = v[i] > 0.f ? g[i] : 0.f;
    } else {
      for (int64_t i = 0; i < len; ++i) o[i] = g[i] * activation_derivative<float>(op, v[i]);
    }
  });
  return true;
}

bool relu_mask_inplace(Tensor& grad, const Tensor& y) {
  if (!supported(grad, grad, y)) return false;
  apply(grad, grad, y);
  return true;
}

void relu_inplace(void* p, DType t, int64_t n) { relu_elements(p, p, t, n); }

void relu_mask(const void* gy, const void* y, DType t, int64_t n, void* out) {
  // apply()'s kernels on the one range, where the host has them (supported()'s rule).
  const Lanes lanes = simd_lanes();
  const bool avx2 = lanes == Lanes::avx2;
  if (t == DType::f32) {
    const auto* g = static_cast<const float*>(gy);
    const auto* v = static_cast<const float*>(y);
    auto* o = static_cast<float*>(out);
    if (lanes != Lanes::none)
      (avx2 ? mask_f32_avx2 : mask_f32)(o, g, v, 0, n);
    else
      for (int64_t i = 0; i < n; ++i) o[i] = v[i] > 0.f ? g[i] : 0.f;
    return;
  }
  const uint16_t inf = t == DType::bf16 ? 0x7F80 : 0x7C00;
  const auto* g = static_cast<const uint16_t*>(gy);
  const auto* v = static_cast<const uint16_t*>(y);
  auto* o = static_cast<uint16_t*>(out);
  if (avx2 || (lanes == Lanes::avx512 && has_avx512bw()))
    (avx2 ? mask_16_avx2 : mask_16)(o, g, v, inf, 0, n);
  else
    for (int64_t i = 0; i < n; ++i) o[i] = v[i] >= 0x0001 && v[i] <= inf ? g[i] : uint16_t(0);
}

}  // namespace mixprec::kernels::cpu
