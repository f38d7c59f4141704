// mixprec's weight gradient of a convolution with a short contraction (a first layer), in f32 on
// AVX2 and AVX-512 hosts and in bf16 with AVX-512, where oneDNN 2.6 pads the input channels to a
// block or, in bf16, falls back to its im2col GEMM (see conv.cpp's small_k_wgrad and docs/conv.md).
//
// dW[oc, k] = sum over images n and output positions p of dy[n, oc, p] * cols_n[k, p], where
// k = (c, kh, kw) runs over C * KH * KW <= kSmallKTaps taps and cols_n is image n's im2col. oneDNN's
// im2col kernel ran the wide cnn's first layer (1 -> 420 channels, 3x3, 64 images of 28x28) at
// 11 GFLOP/s, 34 ms of a 750 ms step (docs/hosts.md). Here: each image's cols in f32 (K rows of P,
// zero-padded to 16 lanes), and for four output channels at a time K dot products of their dy rows,
// read in place (bf16 widened in registers), with the cols rows, three taps at a time, f32
// accumulation (16 lanes with AVX-512, 8 with AVX2). Images go in fixed parts of kImagesPerPart,
// each with its own f32 partial sums, added in part order: the result does not depend on the
// thread count.
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

// Sixteen values of a dy row from position p in f32, zeros past p_count (nothing past it is read):
// f32 as stored, bf16 widened exactly.
template <class Row>
__attribute__((target("avx512f"))) inline __m512 load_row16(const Row* row, int64_t p, int64_t p_count) {
  if constexpr (std::is_same_v<Row, float>) {
    return _mm512_maskz_loadu_ps(first_lanes(p_count - p), row + p);
  } else {
    if (p + 16 <= p_count) return bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p)));
    alignas(32) uint16_t tail[16] = {};
    std::copy(row + p, row + p_count, tail);
    return bf16_widen_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tail)));
  }
}

// acc[r * K + k] += sum_p rows[r][p] * cols[k][p] for the four rows r over the first p_count
// positions, three taps at a time (twelve accumulators; a tap's sum has one 16-lane accumulator
// over the positions in order, then the lanes add in lane order, so the result is fixed for a
// given p_count); bias[r] += sum_p rows[r][p] when bias is set. The rows are read in place (grad_y's
// planes: bf16 bits or f32); cols rows are p16 floats apart, zeros past p_count.
template <class Row>
__attribute__((target("avx512f"))) void wgrad_four_rows(const float* cols, int64_t k_count, int64_t p_count,
                                                        int64_t p16, const Row* const* rows, float* acc, float* bias) {
  const Row *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  for (int64_t k = 0; k < k_count; k += 3) {
    const int64_t taps = std::min<int64_t>(3, k_count - k);
    // A last block of one or two taps repeats its first; only the taps it has are added.
    const float* c0 = cols + k * p16;
    const float* c1 = taps > 1 ? c0 + p16 : c0;
    const float* c2 = taps > 2 ? c0 + 2 * p16 : c0;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t p = 0; p < p_count; p += 16) {
      const __m512 v0 = _mm512_loadu_ps(c0 + p), v1 = _mm512_loadu_ps(c1 + p), v2 = _mm512_loadu_ps(c2 + p);
      __m512 y = load_row16(r0, p, p_count);
      a00 = _mm512_fmadd_ps(y, v0, a00), a01 = _mm512_fmadd_ps(y, v1, a01), a02 = _mm512_fmadd_ps(y, v2, a02);
      y = load_row16(r1, p, p_count);
      a10 = _mm512_fmadd_ps(y, v0, a10), a11 = _mm512_fmadd_ps(y, v1, a11), a12 = _mm512_fmadd_ps(y, v2, a12);
      y = load_row16(r2, p, p_count);
      a20 = _mm512_fmadd_ps(y, v0, a20), a21 = _mm512_fmadd_ps(y, v1, a21), a22 = _mm512_fmadd_ps(y, v2, a22);
      y = load_row16(r3, p, p_count);
      a30 = _mm512_fmadd_ps(y, v0, a30), a31 = _mm512_fmadd_ps(y, v1, a31), a32 = _mm512_fmadd_ps(y, v2, a32);
    }
    const __m512 sums[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < taps; ++t) acc[r * k_count + k + t] += lane_sum(sums[r][t]);
  }
  if (!bias) return;
  for (int64_t r = 0; r < 4; ++r) {
    __m512 b = _mm512_setzero_ps();
    for (int64_t p = 0; p < p_count; p += 16) b = _mm512_add_ps(b, load_row16(rows[r], p, p_count));
    bias[r] += lane_sum(b);
  }
}

// The same sums from f32 on AVX2 (8 lanes): acc[r * K + k] += sum_p rows[r][p] * cols[k][p] over the
// first p_count positions, three taps at a time (twelve accumulators). The rows are read in place
// (grad_y's planes), masked past p_count; cols rows are p8 floats apart, zeros past p_count. The
// lanes of each sum add in lane order, so the result is fixed for a given p_count.
__attribute__((target("avx2,fma"))) void wgrad_four_rows_avx2(const float* cols, int64_t k_count, int64_t p_count,
                                                              int64_t p8, const float* const* rows, float* acc,
                                                              float* bias) {
  const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
  const int64_t whole = p_count / 8 * 8;
  const __m256i tail = first_lanes8(p_count - whole);
  for (int64_t k = 0; k < k_count; k += 3) {
    const int64_t taps = std::min<int64_t>(3, k_count - k);
    // A last block of one or two taps repeats its first; only the taps it has are added.
    const float* c0 = cols + k * p8;
    const float* c1 = taps > 1 ? c0 + p8 : c0;
    const float* c2 = taps > 2 ? c0 + 2 * p8 : c0;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t p = 0; p < p_count; p += 8) {
      const bool full = p < whole;
      const __m256 v0 = _mm256_loadu_ps(c0 + p), v1 = _mm256_loadu_ps(c1 + p), v2 = _mm256_loadu_ps(c2 + p);
      __m256 y = full ? _mm256_loadu_ps(r0 + p) : _mm256_maskload_ps(r0 + p, tail);
      a00 = _mm256_fmadd_ps(y, v0, a00), a01 = _mm256_fmadd_ps(y, v1, a01), a02 = _mm256_fmadd_ps(y, v2, a02);
      y = full ? _mm256_loadu_ps(r1 + p) : _mm256_maskload_ps(r1 + p, tail);
      a10 = _mm256_fmadd_ps(y, v0, a10), a11 = _mm256_fmadd_ps(y, v1, a11), a12 = _mm256_fmadd_ps(y, v2, a12);
      y = full ? _mm256_loadu_ps(r2 + p) : _mm256_maskload_ps(r2 + p, tail);
      a20 = _mm256_fmadd_ps(y, v0, a20), a21 = _mm256_fmadd_ps(y, v1, a21), a22 = _mm256_fmadd_ps(y, v2, a22);
      y = full ? _mm256_loadu_ps(r3 + p) : _mm256_maskload_ps(r3 + p, tail);
      a30 = _mm256_fmadd_ps(y, v0, a30), a31 = _mm256_fmadd_ps(y, v1, a31), a32 = _mm256_fmadd_ps(y, v2, a32);
    }
    const __m256 sums[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < taps; ++t) acc[r * k_count + k + t] += lane_sum(sums[r][t]);
  }
  if (!bias) return;
  for (int64_t r = 0; r < 4; ++r) {
    __m256 b = _mm256_setzero_ps();
    for (int64_t p = 0; p < whole; p += 8) b = _mm256_add_ps(b, _mm256_loadu_ps(rows[r] + p));
    if (whole < p_count) b = _mm256_add_ps(b, _mm256_maskload_ps(rows[r] + whole, tail));
    bias[r] += lane_sum(b);
  }
}

// Image n's im2col in f32: K rows of `stride` floats, zeros past P and wherever a tap falls in the
// padding. A stride-1, undilated layer copies whole output rows from a zero-padded copy of the
// image (`padded`: (h + 2 pad_h) x (w + 2 pad_w) per channel, its border zero).
void im2col(const float* xf, const ConvGeometry& g, int64_t stride, float* padded, float* cols) {
  const int64_t p_count = g.oh * g.ow;
  if (padded != nullptr) {
    const int64_t hp = g.h + 2 * g.pad_h, wp = g.w + 2 * g.pad_w;
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ih = 0; ih < g.h; ++ih)
        std::copy_n(xf + (c * g.h + ih) * g.w, g.w, padded + (c * hp + ih + g.pad_h) * wp + g.pad_w);
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          float* col = cols + ((c * g.kh + i) * g.kw + j) * stride;
          for (int64_t oh = 0; oh < g.oh; ++oh) std::copy_n(padded + (c * hp + oh + i) * wp + j, g.ow, col + oh * g.ow);
          std::fill(col + p_count, col + stride, 0.0f);
        }
    return;
  }
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        float* col = cols + ((c * g.kh + i) * g.kw + j) * stride;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dil_h;
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dil_w;
            col[oh * g.ow + ow] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? xf[(c * g.h + ih) * g.w + iw] : 0.0f;
          }
        }
        std::fill(col + p_count, col + stride, 0.0f);
      }
}

}  // namespace

void backward_weights_small_k(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out) {
  // f32 and bf16 on AVX-512, f32 on AVX2 (where bf16 convolutions run in f32); dy read in place.
  const bool f32 = x.dtype() == DType::f32, avx512 = simd_lanes() == Lanes::avx512;
  MIXPREC_ASSERT(f32 ? simd_lanes() != Lanes::none : x.dtype() == DType::bf16 && avx512,
                 "small-K weight gradient: ", dtype_name(x.dtype()), " on this host");
  const int64_t k_count = g.c * g.kh * g.kw, p_count = g.oh * g.ow, p16 = (p_count + 15) / 16 * 16;
  const int64_t oc4 = (g.oc + 3) / 4 * 4;  // rows padded to whole groups of four (zero rows)
  const int64_t plane = g.c * g.h * g.w, parts = (g.n + kImagesPerPart - 1) / kImagesPerPart;
  const bool with_bias = out.bias.defined();
  const int threads = omp_get_max_threads();
  // A stride-1, undilated layer's cols are copied row by row from a zero-padded image.
  const int64_t hp = g.h + 2 * g.pad_h, wp = g.w + 2 * g.pad_w;
  const bool by_rows = g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1 && g.oh - 1 + g.kh <= hp &&
                       g.ow - 1 + g.kw <= wp;
  const int64_t padded_floats = by_rows ? g.c * hp * wp : 0;
  // Every buffer before the parallel region (an OutOfMemory cannot leave one): per part its f32
  // partial sums, per thread the image in f32 (bf16), its padded copy, its cols and one zero dy row
  // (of p16 floats, read as bf16 or f32) for the channels past oc.
  const int64_t part_floats = oc4 * k_count + (with_bias ? oc4 : 0);
  WorkspaceBuffer partials(size_t(parts * part_floats) * sizeof(float));
  const int64_t scratch_floats = (f32 ? 0 : plane) + padded_floats + k_count * p16 + p16;
  WorkspaceBuffer scratch(size_t(threads) * size_t(scratch_floats) * sizeof(float));
  float* const part_base = static_cast<float*>(partials.data());
  std::fill(part_base, part_base + parts * part_floats, 0.0f);
  const char* const xb = static_cast<const char*>(x.data_ptr());
  const char* const yb = static_cast<const char*>(grad_y.data_ptr());
  const size_t y_bytes = f32 ? 4 : 2;
  profile::detail::note_impl("mixprec:small_k_wgrad");
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    float* const tmp = static_cast<float*>(scratch.data()) + int64_t(omp_get_thread_num()) * scratch_floats;
    float* const xbuf = tmp;
    float* const padded = xbuf + (f32 ? 0 : plane);
    float* const cols = padded + padded_floats;
    char* const zero_row = reinterpret_cast<char*>(cols + k_count * p16);
    float* const acc = part_base + part * part_floats;
    float* const bias_acc = with_bias ? acc + oc4 * k_count : nullptr;
    if (by_rows) std::fill(padded, padded + padded_floats, 0.0f);  // the border stays zero
    std::memset(zero_row, 0, size_t(p16) * sizeof(float));
    for (int64_t n = part * kImagesPerPart; n < std::min(g.n, (part + 1) * kImagesPerPart); ++n) {
      const float* xf = reinterpret_cast<const float*>(xb) + n * plane;
      if (!f32) {
        convert(xb + n * plane * 2, DType::bf16, xbuf, DType::f32, size_t(plane));
        xf = xbuf;
      }
      im2col(xf, g, p16, by_rows ? padded : nullptr, cols);
      for (int64_t oc = 0; oc < oc4; oc += 4) {
        const char* r4[4];
        for (int64_t r = 0; r < 4; ++r)
          r4[r] = oc + r < g.oc ? yb + size_t((n * g.oc + oc + r) * p_count) * y_bytes : zero_row;
        float* const dw = acc + oc * k_count;
        float* const db = bias_acc ? bias_acc + oc : nullptr;
        if (!f32) {
          const uint16_t* rows[4];
          for (int64_t r = 0; r < 4; ++r) rows[r] = reinterpret_cast<const uint16_t*>(r4[r]);
          wgrad_four_rows(cols, k_count, p_count, p16, rows, dw, db);
          continue;
        }
        const float* rows[4];
        for (int64_t r = 0; r < 4; ++r) rows[r] = reinterpret_cast<const float*>(r4[r]);
        if (avx512)
          wgrad_four_rows(cols, k_count, p_count, p16, rows, dw, db);
        else
          wgrad_four_rows_avx2(cols, k_count, p_count, p16, rows, dw, db);
      }
    }
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
