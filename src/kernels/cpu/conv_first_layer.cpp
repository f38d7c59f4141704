// A first layer's forward convolution (at most kFirstLayerChannels input channels and kSmallKTaps
// taps, stride 1, no dilation, one group): mixprec's own, direct loops over each image zero-padded
// in f32 (dnnl_conv.h; docs/conv.md, item 1), rounded once on store, into an NCHW output. In bf16
// or f16 with AVX-512BW: oneDNN 2.6 has only its im2col GEMM for such a forward with an NCHW output
// in bf16, and no f16 at all (f16 convolutions otherwise run its f32 kernels, on the f32 road:
// dnnl_conv.h, conv_in_f32). In f32, bf16 and f16 on AVX2 hosts: oneDNN's blocked kernel there
// writes nChw8c, and the reorder of that output to NCHW took longer than the convolution itself.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

// The geometry's padded image: [c][ph][pw] f32 with ph = oh + kh - 1, pw = ow + kw - 1, and the
// offset of each tap (c, ky, kx) in it.
struct Padded {
  int64_t ph, pw, pplane, taps;
  int64_t off[kSmallKTaps];
  explicit Padded(const ConvGeometry& g)
      : ph(g.oh + g.kh - 1), pw(g.ow + g.kw - 1), pplane(ph * pw), taps(g.c * g.kh * g.kw), off{} {
    for (int64_t c = 0, k = 0; c < g.c; ++c)
      for (int64_t ky = 0; ky < g.kh; ++ky)
        for (int64_t kx = 0; kx < g.kw; ++kx) off[k++] = c * pplane + ky * pw + kx;
  }
};

// Image n of x (dtype t) zero-padded into xp: [c][oh + kh - 1][ow + kw - 1] in f32.
void pad_image(const char* xb, DType t, int64_t n, const ConvGeometry& g, const Padded& pd, float* xp) {
  const size_t es = dtype_size(t);
  const int64_t ph = pd.ph, pw = pd.pw;
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

// Forward: four output channels' planes of one image, over the padded image's rows as one run:
// output q = oy * pw + ox for q in [0, qn), qn = (oh - 1) * pw + ow, so that a step's outputs may
// span rows and no row has a tail of its own (the kw - 1 outputs at ox >= ow of each row are
// computed and dropped). acc_r = bias_r + sum over taps k = (c, ky, kx) of w[r][k] * xp[q + off[k]],
// xp the image zero-padded in f32 (rows of pw; off[k] = the tap's offset in it), each tap's inputs
// loaded once for the four channels; the same chain (bias, then the taps in order) on every road.
// AVX-512: 32 outputs a step, two vectors of 16 for each of the four channels (eight accumulators,
// enough to cover the FMA's latency on two 512-bit FMA units; it had four, a row's 16 outputs and a
// masked tail: docs/conv.md, item 1). Plane r is computed into planes + r * pstride with rows pw
// apart (pstride: qn rounded up to kRunStep; xp holds kRunStep zeros past its image, so the last
// step reads inside it), f32 values as is, 16-bit ones rounded into 16 bits and widened back where
// `round_trip` (the values y would hold, for the pool), f32 sums otherwise. ReLU by max(0, acc),
// which returns acc where it is NaN, and keeps -0. store_planes16 (store_planes on AVX2 hosts) then
// rounds them once into y; the pool reads them as they are.
constexpr int64_t kRunStep = 32;

__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward_four_channels(
    const float* xp, const int64_t* off, int64_t taps, int64_t qn, const float* w4, const float* b4, int64_t channels,
    bool relu, bool round_trip, bool f16, float* planes, int64_t pstride) {
  const __m512 zero = _mm512_setzero_ps();
  const float *w0 = w4, *w1 = w4 + taps, *w2 = w4 + 2 * taps, *w3 = w4 + 3 * taps;
  for (int64_t q = 0; q < qn; q += 32) {
    const float* base = xp + q;
    __m512 a0 = _mm512_set1_ps(b4[0]), a1 = _mm512_set1_ps(b4[1]), a2 = _mm512_set1_ps(b4[2]),
           a3 = _mm512_set1_ps(b4[3]);
    __m512 c0 = a0, c1 = a1, c2 = a2, c3 = a3;
    for (int64_t k = 0; k < taps; ++k) {
      const __m512 u = _mm512_loadu_ps(base + off[k]), v = _mm512_loadu_ps(base + off[k] + 16);
      const __m512 s0 = _mm512_set1_ps(w0[k]), s1 = _mm512_set1_ps(w1[k]), s2 = _mm512_set1_ps(w2[k]),
                   s3 = _mm512_set1_ps(w3[k]);
      a0 = _mm512_fmadd_ps(s0, u, a0);
      c0 = _mm512_fmadd_ps(s0, v, c0);
      a1 = _mm512_fmadd_ps(s1, u, a1);
      c1 = _mm512_fmadd_ps(s1, v, c1);
      a2 = _mm512_fmadd_ps(s2, u, a2);
      c2 = _mm512_fmadd_ps(s2, v, c2);
      a3 = _mm512_fmadd_ps(s3, u, a3);
      c3 = _mm512_fmadd_ps(s3, v, c3);
    }
    const __m512 acc[8] = {a0, c0, a1, c1, a2, c2, a3, c3};
    for (int64_t r = 0; r < channels; ++r)
      for (int64_t h = 0; h < 2; ++h) {
        const __m512 v = relu ? _mm512_max_ps(zero, acc[2 * r + h]) : acc[2 * r + h];
        // For the pool, each value as y would hold it: rounded into 16 bits, widened back exactly.
        const __m512 kept = !round_trip ? v
                            : f16 ? _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
                                  : _mm512_castsi512_ps(_mm512_slli_epi32(bf16_round_epi32(v), 16));
        _mm512_storeu_ps(planes + r * pstride + q + 16 * h, kept);
      }
  }
}

// The same on AVX2 hosts, 16 outputs a step (two vectors of 8 for each of the four channels).
__attribute__((target("avx2,fma,f16c"))) void forward_four_channels_avx2(const float* xp, const int64_t* off,
                                                                         int64_t taps, int64_t qn, const float* w4,
                                                                         const float* b4, int64_t channels, bool relu,
                                                                         bool round_trip, bool f16, float* planes,
                                                                         int64_t pstride) {
  const __m256 zero = _mm256_setzero_ps();
  const float *w0 = w4, *w1 = w4 + taps, *w2 = w4 + 2 * taps, *w3 = w4 + 3 * taps;
  for (int64_t q = 0; q < qn; q += 16) {
    const float* base = xp + q;
    __m256 a0 = _mm256_set1_ps(b4[0]), a1 = _mm256_set1_ps(b4[1]), a2 = _mm256_set1_ps(b4[2]),
           a3 = _mm256_set1_ps(b4[3]);
    __m256 c0 = a0, c1 = a1, c2 = a2, c3 = a3;
    for (int64_t k = 0; k < taps; ++k) {
      const __m256 u = _mm256_loadu_ps(base + off[k]), v = _mm256_loadu_ps(base + off[k] + 8);
      const __m256 s0 = _mm256_set1_ps(w0[k]), s1 = _mm256_set1_ps(w1[k]), s2 = _mm256_set1_ps(w2[k]),
                   s3 = _mm256_set1_ps(w3[k]);
      a0 = _mm256_fmadd_ps(s0, u, a0);
      c0 = _mm256_fmadd_ps(s0, v, c0);
      a1 = _mm256_fmadd_ps(s1, u, a1);
      c1 = _mm256_fmadd_ps(s1, v, c1);
      a2 = _mm256_fmadd_ps(s2, u, a2);
      c2 = _mm256_fmadd_ps(s2, v, c2);
      a3 = _mm256_fmadd_ps(s3, u, a3);
      c3 = _mm256_fmadd_ps(s3, v, c3);
    }
    const __m256 acc[8] = {a0, c0, a1, c1, a2, c2, a3, c3};
    for (int64_t r = 0; r < channels; ++r)
      for (int64_t h = 0; h < 2; ++h) {
        const __m256 v = relu ? _mm256_max_ps(zero, acc[2 * r + h]) : acc[2 * r + h];
        _mm256_storeu_ps(planes + r * pstride + q + 8 * h, round_trip ? round16_keep_avx2(v, f16) : v);
      }
  }
}

// The four (`channels`) f32 planes forward_four_channels_avx2 computed (rows pw apart) into y's
// planes (dtype t, rows ow apart): f32 copied, 16-bit ones rounded once
// (round16_avx2: convert()'s bits), with non-temporal stores where `stream` (each output plane
// whole vectors of 8, 32-byte aligned, and rows of at least 8, so that a vector spans two rows at
// most), a row's last piece under 8 otherwise by convert().
__attribute__((target("avx2,f16c"))) void store_planes(const float* planes, int64_t pstride, int64_t pw,
                                                       const ConvGeometry& g, int64_t channels, bool stream, DType t,
                                                       char* y) {
  const int64_t plane = g.oh * g.ow;
  const size_t es = dtype_size(t);
  for (int64_t r = 0; r < channels; ++r) {
    const float* src = planes + r * pstride;
    char* dst = y + size_t(r * plane) * es;
    if (stream) {  // the plane in whole, aligned vectors of 8 (plane % 8 == 0), each gathered across rows
      for (int64_t i = 0; i < plane; i += 8) {
        const int64_t oy = i / g.ow, ox = i % g.ow, n = std::min<int64_t>(8, g.ow - ox);
        const float* s = src + oy * pw + ox;
        // The vector's first n outputs end row oy; the rest begin row oy + 1, which sits pw - ow
        // floats further than they would in a packed plane.
        __m256 v = _mm256_loadu_ps(s);
        if (n < 8) v = _mm256_blendv_ps(_mm256_loadu_ps(s + (pw - g.ow)), v, _mm256_castsi256_ps(first_lanes8(n)));
        if (t == DType::f32)
          _mm256_stream_ps(reinterpret_cast<float*>(dst) + i, v);
        else
          _mm_stream_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint16_t*>(dst) + i),
                           round16_avx2(v, t == DType::f16));
      }
      continue;
    }
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const float* s = src + oy * pw;
      char* d = dst + size_t(oy * g.ow) * es;
      int64_t i = 0;
      for (; i + 8 <= g.ow; i += 8) {
        const __m256 v = _mm256_loadu_ps(s + i);
        if (t == DType::f32)
          _mm256_storeu_ps(reinterpret_cast<float*>(d) + i, v);
        else
          _mm_storeu_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint16_t*>(d) + i),
                           round16_avx2(v, t == DType::f16));
      }
      if (i < g.ow) convert(s + i, DType::f32, d + size_t(i) * es, t, size_t(g.ow - i));
    }
  }
}

// 16 f32 into 16-bit: bf16 by the scalar rule (bf16_round_epi32), f16 by VCVTPS2PH to nearest
// (convert()'s instruction).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m256i round16(__m512 v, bool f16) {
  return f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
             : _mm512_cvtepi32_epi16(bf16_round_epi32(v));  // not vpmovdw to memory: slow on AMD
}

// The same for 16-bit outputs on AVX-512 hosts, 16 outputs a vector: each row of ow in vectors
// of 16 and a masked tail (round16); where `stream`, each plane in whole, aligned vectors of 16
// (plane % 16 == 0, 32-byte aligned, rows of at least 16), each gathered across two rows at most.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void store_planes16(const float* planes, int64_t pstride,
                                                                         int64_t pw, const ConvGeometry& g,
                                                                         int64_t channels, bool stream, bool f16,
                                                                         uint16_t* y) {
  const int64_t plane = g.oh * g.ow;
  for (int64_t r = 0; r < channels; ++r) {
    const float* src = planes + r * pstride;
    uint16_t* dst = y + r * plane;
    if (stream) {
      for (int64_t i = 0; i < plane; i += 16) {
        const int64_t oy = i / g.ow, ox = i % g.ow, n = std::min<int64_t>(16, g.ow - ox);
        const float* s = src + oy * pw + ox;
        // The vector's first n outputs end row oy; the rest begin row oy + 1, pw - ow floats further.
        __m512 v = _mm512_loadu_ps(s);
        if (n < 16) v = _mm512_mask_loadu_ps(v, static_cast<__mmask16>(~first_lanes(n)), s + (pw - g.ow));
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), round16(v, f16));
      }
      continue;
    }
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ox += 16) {
        const __mmask16 m = first_lanes(g.ow - ox);
        _mm256_mask_storeu_epi16(dst + oy * g.ow + ox, m, round16(_mm512_maskz_loadu_ps(m, src + oy * pw + ox), f16));
      }
  }
}

constexpr size_t kStreamBytes = size_t(8) << 20;

// The four (`channels`) planes just computed (f32, each value as the output of dtype t holds it;
// plane r at planes + r * pstride, its rows row_stride apart), max-pooled by `pool` into planes p0
// .. of out.dst and out.argmax by the pool's own plane kernel (max_pool_plane_f32), the maxima
// stored exactly. maxima: 4 pooled planes of f32.
void pool_planes(const float* planes, int64_t pstride, int64_t row_stride, int64_t channels, const PoolGeometry& pool,
                 DType t, float* maxima, int64_t p0, MaxPoolResult& out) {
  const int64_t pooled = pool.oh * pool.ow;
  for (int64_t r = 0; r < channels; ++r)
    max_pool_plane_f32(planes + r * pstride, row_stride, pool, maxima + r * pooled,
                       out.argmax.data<uint8_t>() + (p0 + r) * pooled);
  convert(maxima, DType::f32, static_cast<char*>(out.dst.data_ptr()) + size_t(p0 * pooled) * dtype_size(t), t,
          size_t(channels * pooled));
}

}  // namespace

bool first_layer_applies(const ConvGeometry& g, DType t) {
  const bool sixteen = t == DType::bf16 || t == DType::f16;
  const bool host =
      mixprec::cpu::has_avx512bw() ? sixteen : simd_lanes() == Lanes::avx2 && (sixteen || t == DType::f32);
  return host && g.groups == 1 && g.c <= kFirstLayerChannels && g.c * g.kh * g.kw <= kSmallKTaps && g.stride_h == 1 &&
         g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1;
}

void forward_first_layer(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                         Tensor& dst, const PoolGeometry* pool, MaxPoolResult* pooled) {
  const Padded pd(g);
  const int64_t taps = pd.taps, pplane = pd.pplane, oc4 = (g.oc + 3) / 4 * 4, plane = g.oh * g.ow;
  const int64_t pool_plane = pooled ? pool->oh * pool->ow : 0;
  // f32 weights and bias, padded to whole groups of four channels with zeros.
  std::vector<float> wf(size_t(oc4 * taps), 0.0f), bf(size_t(oc4), 0.0f);
  convert(weight.data_ptr(), weight.dtype(), wf.data(), DType::f32, size_t(g.oc * taps));
  if (bias.defined()) convert(bias.data_ptr(), bias.dtype(), bf.data(), DType::f32, size_t(g.oc));
  // Per thread: the padded image (and kRunStep floats after it that a kernel's last step may read),
  // four f32 output planes (rows pw apart, pstride apart), and where they are pooled, four pooled
  // planes; allocated before the parallel region.
  const bool avx2 = simd_lanes() == Lanes::avx2;
  const int64_t qn = g.oh > 0 && g.ow > 0 ? (g.oh - 1) * pd.pw + g.ow : 0,
                pstride = (qn + kRunStep - 1) / kRunStep * kRunStep;
  const int64_t image_floats = g.c * pplane + kRunStep;
  const int threads = omp_get_max_threads();
  const int64_t scratch_floats = image_floats + 4 * pstride + (pooled ? 4 * pool_plane : 0);
  WorkspaceBuffer scratch(size_t(threads) * size_t(scratch_floats) * sizeof(float));
  const char* const xb = static_cast<const char*>(x.data_ptr());
  char* const yb = static_cast<char*>(dst.data_ptr());
  const DType t = dst.dtype();
  const size_t es = dtype_size(t);
  // Non-temporal stores need aligned planes (vectors of 8 outputs on AVX2 hosts, 16 on AVX-512
  // ones, from rows of at least that many). On the AMD Zen 5
  // host (micro-benchmark, 2 threads) they took the wide cnn's first layer (64 x 420 x 28 x 28 out,
  // 42 MB) from 3.9-4.5 to 3.3-4.2 ms and the 256 x 32 x 28 x 28 one (13 MB) from 1.18-1.24 to
  // 1.09-1.17 ms.
  const bool f16 = t == DType::f16, round_trip = pooled && t != DType::f32;
  const int64_t vec = avx2 ? 8 : 16;
  const bool stream = !pooled && dst.nbytes() >= kStreamBytes && plane % vec == 0 && g.ow >= vec &&
                      reinterpret_cast<uintptr_t>(yb) % 32 == 0;
  profile::detail::note_impl("mixprec:first_layer_fwd");
  if (pooled) profile::detail::note_impl(kPoolFused);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < g.n; ++n) {
    float* const xp = static_cast<float*>(scratch.data()) + int64_t(omp_get_thread_num()) * scratch_floats;
    float* const planes = xp + image_floats;
    pad_image(xb, x.dtype(), n, g, pd, xp);
    std::fill(xp + g.c * pplane, xp + image_floats, 0.0f);
    for (int64_t o = 0; o < g.oc; o += 4) {
      const int64_t channels = std::min<int64_t>(4, g.oc - o);
      const float* const w4 = wf.data() + o * taps;
      if (avx2)
        forward_four_channels_avx2(xp, pd.off, taps, qn, w4, bf.data() + o, channels, relu, round_trip, f16, planes,
                                   pstride);
      else
        forward_four_channels(xp, pd.off, taps, qn, w4, bf.data() + o, channels, relu, round_trip, f16, planes,
                              pstride);
      if (pooled)
        pool_planes(planes, pstride, pd.pw, channels, *pool, t, planes + 4 * pstride, n * g.oc + o, *pooled);
      else if (avx2)
        store_planes(planes, pstride, pd.pw, g, channels, stream, t, yb + size_t((n * g.oc + o) * plane) * es);
      else
        store_planes16(planes, pstride, pd.pw, g, channels, stream, f16,
                       reinterpret_cast<uint16_t*>(yb) + (n * g.oc + o) * plane);
    }
    if (stream) _mm_sfence();  // the streamed lines are in memory before the region's barrier
  }
}

}  // namespace mixprec::kernels::cpu
