// mixprec's weight gradient of a bf16 convolution with a short contraction (a first layer), where
// oneDNN 2.6 has only its im2col GEMM (see conv.cpp's small_k_wgrad and docs/conv.md).
//
// dW[oc, k] = sum over images n and output positions p of dy[n, oc, p] * cols_n[k, p], where
// k = (c, kh, kw) runs over C * KH * KW <= kSmallKTaps taps and cols_n is image n's im2col. oneDNN's
// im2col kernel ran the wide cnn's first layer (1 -> 420 channels, 3x3, 64 images of 28x28) at
// 11 GFLOP/s, 34 ms of a 750 ms step (docs/hosts.md). Here: each image's cols in f32 (K rows of P,
// zero-padded to 16 lanes), and for four output channels at a time K dot products of their dy rows
// with the cols rows, f32 accumulation. Images go in fixed parts of kImagesPerPart, each with its
// own f32 partial sums, added in part order: the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

constexpr int64_t kImagesPerPart = 4;

// acc[r * K + k] += sum_p rows[r][p] * cols[k][p] for the four rows r, over P16 (a multiple of 16)
// lanes; bias[r] += sum_p rows[r][p] when bias is set.
__attribute__((target("avx512f"))) void wgrad_four_rows(const float* cols, int64_t k_count, int64_t p16,
                                                        const float* rows, float* acc, float* bias) {
  const float* r0 = rows;
  const float* r1 = rows + p16;
  const float* r2 = rows + 2 * p16;
  const float* r3 = rows + 3 * p16;
  for (int64_t k = 0; k < k_count; ++k) {
    const float* c = cols + k * p16;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t p = 0; p < p16; p += 16) {
      const __m512 cv = _mm512_loadu_ps(c + p);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + p), cv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r1 + p), cv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(r2 + p), cv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(r3 + p), cv, a3);
    }
    acc[k] += lane_sum(a0);
    acc[k_count + k] += lane_sum(a1);
    acc[2 * k_count + k] += lane_sum(a2);
    acc[3 * k_count + k] += lane_sum(a3);
  }
  if (!bias) return;
  for (int64_t r = 0; r < 4; ++r) {
    __m512 b = _mm512_setzero_ps();
    for (int64_t p = 0; p < p16; p += 16) b = _mm512_add_ps(b, _mm512_loadu_ps(rows + r * p16 + p));
    bias[r] += lane_sum(b);
  }
}

}  // namespace

void backward_weights_small_k(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out) {
  const int64_t k_count = g.c * g.kh * g.kw, p_count = g.oh * g.ow, p16 = (p_count + 15) / 16 * 16;
  const int64_t oc4 = (g.oc + 3) / 4 * 4;  // rows padded to whole groups of four (zero rows)
  const int64_t plane = g.c * g.h * g.w, parts = (g.n + kImagesPerPart - 1) / kImagesPerPart;
  const bool with_bias = out.bias.defined();
  const int threads = omp_get_max_threads();
  // Every buffer before the parallel region (an OutOfMemory cannot leave one): per part its f32
  // partial sums, per thread the image in f32, its cols and four dy rows.
  const int64_t part_floats = oc4 * k_count + (with_bias ? oc4 : 0);
  WorkspaceBuffer partials(size_t(parts * part_floats) * sizeof(float));
  const int64_t scratch_floats = plane + k_count * p16 + 4 * p16;
  WorkspaceBuffer scratch(size_t(threads) * size_t(scratch_floats) * sizeof(float));
  float* const part_base = static_cast<float*>(partials.data());
  std::fill(part_base, part_base + parts * part_floats, 0.0f);
  const char* const xb = static_cast<const char*>(x.data_ptr());
  const char* const yb = static_cast<const char*>(grad_y.data_ptr());
  profile::detail::note_impl("mixprec:small_k_wgrad");
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    float* const tmp = static_cast<float*>(scratch.data()) + int64_t(omp_get_thread_num()) * scratch_floats;
    float* const xf = tmp;
    float* const cols = xf + plane;
    float* const rows = cols + k_count * p16;
    float* const acc = part_base + part * part_floats;
    float* const bias_acc = with_bias ? acc + oc4 * k_count : nullptr;
    for (int64_t n = part * kImagesPerPart; n < std::min(g.n, (part + 1) * kImagesPerPart); ++n) {
      convert(xb + n * plane * 2, DType::bf16, xf, DType::f32, size_t(plane));
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            float* col = cols + ((c * g.kh + i) * g.kw + j) * p16;
            for (int64_t oh = 0; oh < g.oh; ++oh) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dil_h;
              for (int64_t ow = 0; ow < g.ow; ++ow) {
                const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dil_w;
                col[oh * g.ow + ow] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? xf[(c * g.h + ih) * g.w + iw] : 0.0f;
              }
            }
            std::fill(col + p_count, col + p16, 0.0f);
          }
      for (int64_t oc = 0; oc < oc4; oc += 4) {
        for (int64_t r = 0; r < 4; ++r) {
          float* row = rows + r * p16;
          if (oc + r < g.oc) {
            convert(yb + ((n * g.oc + oc + r) * p_count) * 2, DType::bf16, row, DType::f32, size_t(p_count));
            std::fill(row + p_count, row + p16, 0.0f);
          } else {
            std::fill(row, row + p16, 0.0f);
          }
        }
        wgrad_four_rows(cols, k_count, p16, rows, acc + oc * k_count, bias_acc ? bias_acc + oc : nullptr);
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
