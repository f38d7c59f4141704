// mixprec's weight gradient of a convolution with a short contraction (a first layer), in f32, bf16
// and f16 on AVX2 and AVX-512 hosts, where oneDNN 2.6 pads the input channels
// to a block or, in bf16, falls back to its im2col GEMM, and has no f16 (see conv.cpp's
// small_k_wgrad and docs/conv.md).
//
// dW[oc, k] = sum over images n and output positions p of dy[n, oc, p] * cols_n[k, p], where
// k = (c, kh, kw) runs over C * KH * KW <= kSmallKTaps taps and cols_n is image n's im2col. oneDNN's
// im2col kernel ran the wide cnn's first layer (1 -> 420 channels, 3x3, 64 images of 28x28) at
// 11 GFLOP/s, 34 ms of a 750 ms step (docs/hosts.md). Here: each image's cols in x's dtype (K rows
// of P, zero-padded to whole vectors), and for four output channels by three taps at a time the
// dot products of their dy rows, read in place, with the cols rows, f32 accumulation: f32 by FMA
// (16 lanes with AVX-512, 8 with AVX2), f16 by the same FMAs on values widened as they are loaded
// (VCVTPH2PS, exact), bf16 by VDPBF16PS (pairs of positions) where the CPU has AVX512-BF16, else
// (on AVX2 hosts) by AVX2's FMAs on values widened as they are loaded. Images go in fixed
// parts of kImagesPerPart, each with its own f32 partial sums, added in part order: the result does
// not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

constexpr int64_t kImagesPerPart = 4;

// 16 elements as f32 lanes (f16 widened exactly), and the first lanes of m (zeros past them).
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 load16(const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__attribute__((target("avx512f"))) inline __m512 load16(__mmask16 m, const float* p) {
  return _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load16(__mmask16 m, const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// acc[r * K + k] += sum_p rows[r][p] * cols[k][p] for the four rows r over the first p_count
// positions, three taps at a time (twelve accumulators; a tap's sum has one 16-lane accumulator
// over the positions in order, then the lanes add in lane order, so the result is fixed for a
// given p_count); bias[r] += sum_p rows[r][p] when bias is set. The rows are read in place (grad_y's
// planes), masked past p_count; cols rows are `stride` elements apart, zeros past p_count. A last
// block of one or two taps repeats its first; only the taps it has are added.
// f32 and f16 (widened on load): 16 positions a step, FMA.
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void wgrad_four_rows_fma(const T* cols, int64_t k_count,
                                                                              int64_t p_count, int64_t stride,
                                                                              const T* const* rows, float* acc,
                                                                              float* bias) {
  const T *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  for (int64_t k = 0; k < k_count; k += 3) {
    const int64_t taps = std::min<int64_t>(3, k_count - k);
    const T* c0 = cols + k * stride;
    const T* c1 = taps > 1 ? c0 + stride : c0;
    const T* c2 = taps > 2 ? c0 + 2 * stride : c0;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t p = 0; p < p_count; p += 16) {
      const __mmask16 m = first_lanes(p_count - p);
      const __m512 v0 = load16(c0 + p), v1 = load16(c1 + p), v2 = load16(c2 + p);
      __m512 y = load16(m, r0 + p);
      a00 = _mm512_fmadd_ps(y, v0, a00), a01 = _mm512_fmadd_ps(y, v1, a01), a02 = _mm512_fmadd_ps(y, v2, a02);
      y = load16(m, r1 + p);
      a10 = _mm512_fmadd_ps(y, v0, a10), a11 = _mm512_fmadd_ps(y, v1, a11), a12 = _mm512_fmadd_ps(y, v2, a12);
      y = load16(m, r2 + p);
      a20 = _mm512_fmadd_ps(y, v0, a20), a21 = _mm512_fmadd_ps(y, v1, a21), a22 = _mm512_fmadd_ps(y, v2, a22);
      y = load16(m, r3 + p);
      a30 = _mm512_fmadd_ps(y, v0, a30), a31 = _mm512_fmadd_ps(y, v1, a31), a32 = _mm512_fmadd_ps(y, v2, a32);
    }
    const __m512 sums[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < taps; ++t) acc[r * k_count + k + t] += lane_sum(sums[r][t]);
  }
  if (!bias) return;
  for (int64_t r = 0; r < 4; ++r) {
    __m512 b = _mm512_setzero_ps();
    for (int64_t p = 0; p < p_count; p += 16) b = _mm512_add_ps(b, load16(first_lanes(p_count - p), rows[r] + p));
    bias[r] += lane_sum(b);
  }
}

// bf16 (every CPU with bf16 convolutions has AVX512-BF16): 32 positions a step, each lane the
// products of a pair of neighbouring positions added to its sum by VDPBF16PS (bf16 products are
// exact in f32; the instruction treats subnormal inputs and results as zero); the bias from the
// same instruction against ones.
#define MIXPREC_BF16_DOT __attribute__((target("avx512f,avx512bw,avx512bf16")))
MIXPREC_BF16_DOT inline __m512 dot(__m512 s, __m512i y, __m512i c) {
  return _mm512_dpbf16_ps(s, (__m512bh)y, (__m512bh)c);
}
MIXPREC_BF16_DOT inline __m512i load_first32(const uint16_t* p, int64_t n) {
  return _mm512_maskz_loadu_epi16(n >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << n) - 1), p);
}
MIXPREC_BF16_DOT void wgrad_four_rows(const uint16_t* cols, int64_t k_count, int64_t p_count, int64_t stride,
                                      const uint16_t* const* rows, float* acc, float* bias) {
  const uint16_t *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  for (int64_t k = 0; k < k_count; k += 3) {
    const int64_t taps = std::min<int64_t>(3, k_count - k);
    const uint16_t* c0 = cols + k * stride;
    const uint16_t* c1 = taps > 1 ? c0 + stride : c0;
    const uint16_t* c2 = taps > 2 ? c0 + 2 * stride : c0;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t p = 0; p < p_count; p += 32) {
      const int64_t n = p_count - p;
      const __m512i v0 = _mm512_loadu_si512(c0 + p), v1 = _mm512_loadu_si512(c1 + p), v2 = _mm512_loadu_si512(c2 + p);
      __m512i y = load_first32(r0 + p, n);
      a00 = dot(a00, y, v0), a01 = dot(a01, y, v1), a02 = dot(a02, y, v2);
      y = load_first32(r1 + p, n);
      a10 = dot(a10, y, v0), a11 = dot(a11, y, v1), a12 = dot(a12, y, v2);
      y = load_first32(r2 + p, n);
      a20 = dot(a20, y, v0), a21 = dot(a21, y, v1), a22 = dot(a22, y, v2);
      y = load_first32(r3 + p, n);
      a30 = dot(a30, y, v0), a31 = dot(a31, y, v1), a32 = dot(a32, y, v2);
    }
    const __m512 sums[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < taps; ++t) acc[r * k_count + k + t] += lane_sum(sums[r][t]);
  }
  if (!bias) return;
  const __m512i ones = _mm512_set1_epi16(short(0x3F80));  // bf16 1.0
  for (int64_t r = 0; r < 4; ++r) {
    __m512 b = _mm512_setzero_ps();
    for (int64_t p = 0; p < p_count; p += 32) b = dot(b, load_first32(rows[r] + p, p_count - p), ones);
    bias[r] += lane_sum(b);
  }
}
#undef MIXPREC_BF16_DOT

// 8 elements as f32 lanes (bf16 and f16 widened exactly), and the first n (0..8) of them, zeros past
// them, nothing past them read.
__attribute__((target("avx2"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* p) { return bf16_widen_avx2(p); }
__attribute__((target("avx2,f16c"))) inline __m256 load8(const f16_t* p) { return f16_widen_avx2(&p->bits); }
__attribute__((target("avx2"))) inline __m256 load8(const float* p, int64_t n) { return load_first8(p, n); }
__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* p, int64_t n) {
  const __m256i w = _mm256_cvtepu16_epi32(load_first_bytes(p, 2 * n));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
__attribute__((target("avx2,f16c"))) inline __m256 load8(const f16_t* p, int64_t n) {
  return _mm256_cvtph_ps(load_first_bytes(p, 2 * n));
}

// The same sums on AVX2 (8 lanes): acc[r * K + k] += sum_p rows[r][p] * cols[k][p] over the first
// p_count positions, three taps at a time (twelve accumulators). The rows are read in place
// (grad_y's planes), loaded partially past p_count: f32, or bf16 or f16 widened as they are loaded;
// cols rows are f32 (a 16-bit image's widened once, part_sums), `stride` elements apart, zeros past
// p_count. Widening is exact: the sums of the values widened beforehand, bit for bit, without the
// casts of x and grad_y that computing a 16-bit layer in f32 took. The lanes of each sum add in
// lane order, so the result is fixed for a given p_count.
template <class T>
__attribute__((target("avx2,fma,f16c"))) void wgrad_four_rows_avx2(const float* cols, int64_t k_count, int64_t p_count,
                                                                   int64_t stride, const T* const* rows, float* acc,
                                                                   float* bias) {
  const T *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  const int64_t whole = p_count / 8 * 8, rest = p_count - whole;
  for (int64_t k = 0; k < k_count; k += 3) {
    const int64_t taps = std::min<int64_t>(3, k_count - k);
    // A last block of one or two taps repeats its first; only the taps it has are added.
    const float* c0 = cols + k * stride;
    const float* c1 = taps > 1 ? c0 + stride : c0;
    const float* c2 = taps > 2 ? c0 + 2 * stride : c0;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t p = 0; p < p_count; p += 8) {
      const bool full = p < whole;
      const __m256 v0 = load8(c0 + p), v1 = load8(c1 + p), v2 = load8(c2 + p);
      __m256 y = full ? load8(r0 + p) : load8(r0 + p, rest);
      a00 = _mm256_fmadd_ps(y, v0, a00), a01 = _mm256_fmadd_ps(y, v1, a01), a02 = _mm256_fmadd_ps(y, v2, a02);
      y = full ? load8(r1 + p) : load8(r1 + p, rest);
      a10 = _mm256_fmadd_ps(y, v0, a10), a11 = _mm256_fmadd_ps(y, v1, a11), a12 = _mm256_fmadd_ps(y, v2, a12);
      y = full ? load8(r2 + p) : load8(r2 + p, rest);
      a20 = _mm256_fmadd_ps(y, v0, a20), a21 = _mm256_fmadd_ps(y, v1, a21), a22 = _mm256_fmadd_ps(y, v2, a22);
      y = full ? load8(r3 + p) : load8(r3 + p, rest);
      a30 = _mm256_fmadd_ps(y, v0, a30), a31 = _mm256_fmadd_ps(y, v1, a31), a32 = _mm256_fmadd_ps(y, v2, a32);
    }
    const __m256 sums[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < taps; ++t) acc[r * k_count + k + t] += lane_sum(sums[r][t]);
  }
  if (!bias) return;
  for (int64_t r = 0; r < 4; ++r) {
    __m256 b = _mm256_setzero_ps();
    for (int64_t p = 0; p < whole; p += 8) b = _mm256_add_ps(b, load8(rows[r] + p));
    if (rest) b = _mm256_add_ps(b, load8(rows[r] + whole, rest));
    bias[r] += lane_sum(b);
  }
}

// Image n's im2col (f32, or bf16 or f16 bits, as x): K rows of `stride` elements, zeros past P and wherever
// a tap falls in the padding. A stride-1, undilated layer copies whole output rows from a
// zero-padded copy of the image (`padded`: (h + 2 pad_h) x (w + 2 pad_w) per channel, its border
// zero).
template <class T>
void im2col(const T* x, const ConvGeometry& g, int64_t stride, T* padded, T* cols) {
  const int64_t p_count = g.oh * g.ow;
  if (padded != nullptr) {
    const int64_t hp = g.h + 2 * g.pad_h, wp = g.w + 2 * g.pad_w;
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ih = 0; ih < g.h; ++ih)
        std::copy_n(x + (c * g.h + ih) * g.w, g.w, padded + (c * hp + ih + g.pad_h) * wp + g.pad_w);
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          T* col = cols + ((c * g.kh + i) * g.kw + j) * stride;
          for (int64_t oh = 0; oh < g.oh; ++oh) std::copy_n(padded + (c * hp + oh + i) * wp + j, g.ow, col + oh * g.ow);
          std::fill(col + p_count, col + stride, T{});
        }
    return;
  }
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* col = cols + ((c * g.kh + i) * g.kw + j) * stride;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dil_h;
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dil_w;
            col[oh * g.ow + ow] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? x[(c * g.h + ih) * g.w + iw] : T{};
          }
        }
        std::fill(col + p_count, col + stride, T{});
      }
}

// Whether the sums run on AVX2's kernel (hosts without AVX-512), else on AVX-512's.
bool on_avx2() { return simd_lanes() == Lanes::avx2; }

// Bytes of a thread's scratch before its f32 cols (part_sums), and in all.
struct Scratch {
  size_t own, total;
};
template <class T>
Scratch scratch_bytes(const ConvGeometry& g, int64_t stride, bool by_rows) {
  const int64_t k_count = g.c * g.kh * g.kw;
  const size_t own =
      size_t((by_rows ? g.c * (g.h + 2 * g.pad_h) * (g.w + 2 * g.pad_w) : 0) + k_count * stride + stride) * sizeof(T);
  const size_t wide = std::is_same_v<T, float> || !on_avx2() ? 0 : size_t(k_count * stride) * sizeof(float);
  const size_t own64 = (own + 63) / 64 * 64;
  return {own64, (own64 + wide + 63) / 64 * 64};
}

// One part's images [first, last) into its partial sums: T is x's and grad_y's element (float, or
// bf16 or f16 bits); scratch holds the padded image, the cols (K rows of `stride`) and one zero dy
// row, and for AVX2's kernel on 16-bit tensors the cols widened to f32 (once an image: every group of
// four output channels reads them, and widening them in the inner loop would add three widenings
// to its four of grad_y's rows a step of twelve FMAs).
// With `up`, dy is not given: each group of four output channels' planes of an image are routed
// from the max pool's gradient by its argmax into up_rows (4 planes of T), up_f32 the router's
// scratch.
template <class T>
void part_sums(const T* x, const T* dy, const ConvGeometry& g, int64_t first, int64_t last, int64_t stride,
               bool by_rows, char* scratch, float* acc, float* bias_acc, const UnpooledGrad* up = nullptr,
               T* up_rows = nullptr, float* up_f32 = nullptr) {
  const int64_t k_count = g.c * g.kh * g.kw, p_count = g.oh * g.ow, oc4 = (g.oc + 3) / 4 * 4;
  const int64_t padded_count = by_rows ? g.c * (g.h + 2 * g.pad_h) * (g.w + 2 * g.pad_w) : 0;
  T* const padded = reinterpret_cast<T*>(scratch);
  T* const cols = padded + padded_count;
  T* const zero_row = cols + k_count * stride;
  const bool avx2 = on_avx2();
  float* const wide = std::is_same_v<T, float> || !avx2
                          ? nullptr
                          : reinterpret_cast<float*>(scratch + scratch_bytes<T>(g, stride, by_rows).own);
  std::fill(padded, padded + padded_count, T{});  // the border stays zero
  std::fill(zero_row, zero_row + stride, T{});
  for (int64_t n = first; n < last; ++n) {
    im2col(x + n * g.c * g.h * g.w, g, stride, by_rows ? padded : nullptr, cols);
    if (wide)
      convert(cols, std::is_same_v<T, uint16_t> ? DType::bf16 : DType::f16, wide, DType::f32, size_t(k_count * stride));
    for (int64_t oc = 0; oc < oc4; oc += 4) {
      const T* rows[4];
      for (int64_t r = 0; r < 4; ++r) {
        if (oc + r >= g.oc) {
          rows[r] = zero_row;
        } else if (up) {
          const int64_t pooled = up->pool->oh * up->pool->ow, plane = (n * g.oc + oc + r) * pooled;
          // The plane's taps, unpacked past the router's scratch where they are two bits each.
          uint8_t* const taps_buf = reinterpret_cast<uint8_t*>(up_f32 + 2 * pooled + p_count);
          max_unpool_plane(static_cast<const T*>(up->pooled->data_ptr()) + plane,
                           up->argmax.taps(plane, pooled, taps_buf), *up->pool, up->pooled->dtype(),
                           up_rows + r * p_count, up_f32,
                           up->relu_y ? static_cast<const T*>(up->relu_y->data_ptr()) + plane : nullptr);
          rows[r] = up_rows + r * p_count;
        } else {
          rows[r] = dy + (n * g.oc + oc + r) * p_count;
        }
      }
      float* const dw = acc + oc * k_count;
      float* const db = bias_acc ? bias_acc + oc : nullptr;
      // AVX2's FMAs, or with AVX-512 bf16 by VDPBF16PS (small_k_wgrad: the CPU has it), f16 and f32
      // by FMAs.
      if (avx2) {
        wgrad_four_rows_avx2(wide ? wide : reinterpret_cast<const float*>(cols), k_count, p_count, stride, rows, dw,
                             db);
      } else if constexpr (std::is_same_v<T, uint16_t>) {
        wgrad_four_rows(cols, k_count, p_count, stride, rows, dw, db);
      } else {
        wgrad_four_rows_fma(cols, k_count, p_count, stride, rows, dw, db);
      }
    }
  }
}

}  // namespace

void backward_weights_small_k(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out,
                              const UnpooledGrad* up) {
  // f32 and f16 on AVX2 and AVX-512 hosts, bf16 on AVX2 hosts and with AVX512-BF16 (small_k_wgrad).
  const DType t = x.dtype();
  const bool f32 = t == DType::f32;
  MIXPREC_ASSERT(t == DType::bf16 ? simd_lanes() == Lanes::avx2 || mixprec::cpu::has_avx512_bf16()
                                  : simd_lanes() != Lanes::none && (f32 || t == DType::f16),
                 "small-K weight gradient: ", dtype_name(t), " on this host");
  const int64_t k_count = g.c * g.kh * g.kw, p_count = g.oh * g.ow;
  const int64_t vector = t == DType::bf16 ? 32 : 16;  // elements of a cols row's vectors
  const int64_t stride = (p_count + vector - 1) / vector * vector;
  const int64_t oc4 = (g.oc + 3) / 4 * 4;  // rows padded to whole groups of four (zero rows)
  const int64_t parts = (g.n + kImagesPerPart - 1) / kImagesPerPart;
  const bool with_bias = out.bias.defined();
  const int threads = omp_get_max_threads();
  // A stride-1, undilated layer's cols are copied row by row from a zero-padded image.
  const int64_t hp = g.h + 2 * g.pad_h, wp = g.w + 2 * g.pad_w;
  const bool by_rows = g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1 && g.oh - 1 + g.kh <= hp &&
                       g.ow - 1 + g.kw <= wp;
  // Every buffer before the parallel region (an OutOfMemory cannot leave one): per part its f32
  // partial sums, per thread the padded image, the cols and a zero dy row, in x's dtype (and the
  // cols in f32, scratch_bytes).
  const int64_t part_floats = oc4 * k_count + (with_bias ? oc4 : 0);
  WorkspaceBuffer partials(size_t(parts * part_floats) * sizeof(float));
  const size_t scratch_stride = f32                ? scratch_bytes<float>(g, stride, by_rows).total
                                : t == DType::bf16 ? scratch_bytes<uint16_t>(g, stride, by_rows).total
                                                   : scratch_bytes<f16_t>(g, stride, by_rows).total;
  // Routing a pool's gradient: four planes of x's dtype, and the router's f32 scratch with a plane's
  // taps after it, per thread.
  const int64_t pooled_plane = up ? up->pool->oh * up->pool->ow : 0;
  const int64_t up_f32 = up ? 2 * pooled_plane + p_count + (pooled_plane + 3) / 4 : 0;
  const size_t up_bytes =
      up ? (size_t(4 * p_count) * dtype_size(t) + size_t(up_f32) * sizeof(float) + 63) / 64 * 64 : 0;
  const size_t thread_bytes = scratch_stride + up_bytes;
  WorkspaceBuffer scratch(size_t(threads) * thread_bytes);
  float* const part_base = static_cast<float*>(partials.data());
  std::fill(part_base, part_base + parts * part_floats, 0.0f);
  profile::detail::note_impl("mixprec:small_k_wgrad");
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    char* const tmp = static_cast<char*>(scratch.data()) + size_t(omp_get_thread_num()) * thread_bytes;
    char* const up_rows = tmp + scratch_stride;
    float* const up_scratch = reinterpret_cast<float*>(up_rows + size_t(4 * p_count) * dtype_size(t));
    float* const acc = part_base + part * part_floats;
    float* const bias_acc = with_bias ? acc + oc4 * k_count : nullptr;
    const int64_t first = part * kImagesPerPart, last = std::min(g.n, first + kImagesPerPart);
    const auto sums = [&](auto e) {
      using T = decltype(e);
      part_sums(static_cast<const T*>(x.data_ptr()), up ? nullptr : static_cast<const T*>(grad_y.data_ptr()), g, first,
                last, stride, by_rows, tmp, acc, bias_acc, up, reinterpret_cast<T*>(up_rows), up_scratch);
    };
    if (f32)
      sums(float{});
    else if (t == DType::bf16)
      sums(uint16_t{});
    else
      sums(f16_t{});
  }
  // The parts in order, then one rounding into the gradients' dtypes.
  for (int64_t part = 1; part < parts; ++part) {
    const float* add = part_base + part * part_floats;
    for (int64_t i = 0; i < part_floats; ++i) part_base[i] += add[i];
  }
  convert(part_base, DType::f32, out.weight.data_ptr(), out.weight.dtype(), size_t(g.oc * k_count));
  if (with_bias) convert(part_base + oc4 * k_count, DType::f32, out.bias.data_ptr(), out.bias.dtype(), size_t(g.oc));
}

}  // namespace mixprec::kernels::cpu
