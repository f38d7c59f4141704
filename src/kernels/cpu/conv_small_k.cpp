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
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

constexpr int64_t kImagesPerPart = 4;

// The 16 lanes' sum, in lane order (_mm512_reduce_add_ps trips GCC 12's maybe-uninitialized).
__attribute__((target("avx512f"))) inline float lane_sum(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float s = 0.0f;
  for (float x : l) s += x;
  return s;
}

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

// Forward: four output channels' planes of one image, 16 outputs per step (masked on the row's
// tail): acc_r = bias_r + sum over taps k = (c, ky, kx) of w[r][k] * xp[c][oy + ky][ox + kx], xp
// the image zero-padded in f32 (rows of pw; off[k] = the tap's offset in it), each tap's inputs
// loaded once for the four channels. ReLU as the reference's (NaN and -0 kept). The planes are
// computed into `planes` (f32, L1-sized), then each is rounded once into y with whole-vector
// stores, non-temporal where `stream` (an output far larger than the caches, whose lines would
// only be read for ownership and evicted).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward_four_channels(
    const float* xp, int64_t pw, const int64_t* off, int64_t taps, const ConvGeometry& g, const float* w4,
    const float* b4, int64_t channels, bool relu, bool stream, float* planes, uint16_t* y) {
  const int64_t plane = g.oh * g.ow;
  const __m512 zero = _mm512_setzero_ps();
  const float *w0 = w4, *w1 = w4 + taps, *w2 = w4 + 2 * taps, *w3 = w4 + 3 * taps;
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ox += 16) {
      const __mmask16 m = first_lanes(g.ow - ox);
      const float* base = xp + oy * pw + ox;
      __m512 a0 = _mm512_set1_ps(b4[0]), a1 = _mm512_set1_ps(b4[1]), a2 = _mm512_set1_ps(b4[2]),
             a3 = _mm512_set1_ps(b4[3]);
      for (int64_t k = 0; k < taps; ++k) {
        const __m512 v = _mm512_maskz_loadu_ps(m, base + off[k]);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0[k]), v, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(w1[k]), v, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(w2[k]), v, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(w3[k]), v, a3);
      }
      const __m512 acc[4] = {a0, a1, a2, a3};
      for (int64_t r = 0; r < channels; ++r)
        _mm512_mask_storeu_ps(planes + r * plane + oy * g.ow + ox, m,
                              relu ? _mm512_max_ps(zero, acc[r]) : acc[r]);  // max returns its second operand for NaN
    }
  for (int64_t r = 0; r < channels; ++r)
    for (int64_t i = 0; i < plane; i += 16) {
      const __mmask16 m = first_lanes(plane - i);
      const __m512i bits = bf16_round_epi32(_mm512_maskz_loadu_ps(m, planes + r * plane + i));
      if (stream)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(y + r * plane + i), _mm512_cvtepi32_epi16(bits));
      else
        _mm256_mask_storeu_epi16(y + r * plane + i, m,
                                 _mm512_cvtepi32_epi16(bits));  // not vpmovdw to memory: slow on AMD
    }
}

// Image n of x (dtype t) zero-padded into xp: [c][oh + kh - 1][ow + kw - 1] in f32.
void pad_image(const char* xb, DType t, int64_t n, const ConvGeometry& g, int64_t pw, int64_t ph, float* xp) {
  const size_t es = dtype_size(t);
  std::fill(xp, xp + g.c * ph * pw, 0.0f);
  const int64_t x0 = std::max<int64_t>(0, g.pad_w), x1 = std::min(pw, g.pad_w + g.w);
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t r = 0; r < ph; ++r) {
      const int64_t iy = r - g.pad_h;
      if (iy < 0 || iy >= g.h || x1 <= x0) continue;
      const char* src = xb + (((n * g.c + c) * g.h + iy) * g.w + (x0 - g.pad_w)) * int64_t(es);
      convert(src, t, xp + (c * ph + r) * pw + x0, DType::f32, size_t(x1 - x0));
    }
}

constexpr size_t kStreamBytes = size_t(8) << 20;

void forward_small_k_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                          Tensor& dst) {
  const int64_t taps = g.c * g.kh * g.kw, oc4 = (g.oc + 3) / 4 * 4;
  const int64_t pw = g.ow + g.kw - 1, ph = g.oh + g.kh - 1, pplane = ph * pw, plane = g.oh * g.ow;
  int64_t off[kSmallKTaps];
  for (int64_t c = 0, k = 0; c < g.c; ++c)
    for (int64_t ky = 0; ky < g.kh; ++ky)
      for (int64_t kx = 0; kx < g.kw; ++kx) off[k++] = c * pplane + ky * pw + kx;
  // f32 weights and bias, padded to whole groups of four channels with zeros.
  std::vector<float> wf(size_t(oc4 * taps), 0.0f), bf(size_t(oc4), 0.0f);
  convert(weight.data_ptr(), weight.dtype(), wf.data(), DType::f32, size_t(g.oc * taps));
  if (bias.defined()) convert(bias.data_ptr(), bias.dtype(), bf.data(), DType::f32, size_t(g.oc));
  // Per thread: the padded image and four f32 output planes, allocated before the parallel region.
  const int threads = omp_get_max_threads();
  const int64_t scratch_floats = g.c * pplane + 4 * plane;
  WorkspaceBuffer scratch(size_t(threads) * size_t(scratch_floats) * sizeof(float));
  const char* const xb = static_cast<const char*>(x.data_ptr());
  auto* const y = static_cast<uint16_t*>(dst.data_ptr());
  // Non-temporal stores need 32-byte aligned planes. On the AMD Zen 5 host (micro-benchmark, 2
  // threads) they took the wide cnn's first layer (64 x 420 x 28 x 28 out, 42 MB) from 3.9-4.5 to
  // 3.3-4.2 ms and the 256 x 32 x 28 x 28 one (13 MB) from 1.18-1.24 to 1.09-1.17 ms.
  const bool stream = dst.nbytes() >= kStreamBytes && plane % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 32 == 0;
  profile::detail::note_impl("mixprec:small_k_fwd");
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < g.n; ++n) {
    float* const xp = static_cast<float*>(scratch.data()) + int64_t(omp_get_thread_num()) * scratch_floats;
    float* const planes = xp + g.c * pplane;
    pad_image(xb, x.dtype(), n, g, pw, ph, xp);
    for (int64_t o = 0; o < g.oc; o += 4)
      forward_four_channels(xp, pw, off, taps, g, wf.data() + o * taps, bf.data() + o, std::min<int64_t>(4, g.oc - o),
                            relu, stream, planes, y + (n * g.oc + o) * plane);
    if (stream) _mm_sfence();  // the streamed lines are in memory before the region's barrier
  }
}

}  // namespace

bool forward_small_k_applies(const ConvGeometry& g, DType t) {
  return t == DType::bf16 && g.groups == 1 && g.c <= kFirstLayerChannels && g.c * g.kh * g.kw <= kSmallKTaps &&
         g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1 && mixprec::cpu::has_avx512bw();
}

void forward_small_k(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                     Tensor& dst) {
  forward_small_k_bf16(x, weight, bias, g, relu, dst);
}

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
