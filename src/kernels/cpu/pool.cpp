// Fast CPU pooling: OpenMP over the N*C planes of an NCHW tensor, each plane converted to f32
// once, pooled in f32 and stored rounded once. f32/bf16/f16; f64 goes to the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/pool.h"

#include "kernels/pool_window.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

bool is_2x2_stride2(const PoolGeometry& g) {
  return g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0 && g.dil_h == 1 &&
         g.dil_w == 1;
}

// b > a, or b is NaN: b wins the comparison.
__attribute__((target("avx512f"))) inline __mmask16 beats(__m512 b, __m512 a) {
  return __mmask16(_mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q));
}

// Masks for a chunk of `outputs` (<= 16) outputs: their inputs in two 16-lane halves, and themselves.
struct ChunkMasks {
  __mmask16 in_lo, in_hi, out;
};
inline ChunkMasks chunk_masks(int64_t outputs) {
  const int64_t inputs = 2 * outputs;
  return {first_lanes(inputs), first_lanes(inputs - 16), first_lanes(outputs)};
}

// The winners of 16 (or `m.out`'s) 2x2 windows whose rows start at r0 and r1: the maxima and
// their window positions (0..3). A pairwise tournament that picks what the sequential scan picks:
// the first of equal maxima, the last NaN.
struct Winners2x2 {
  __m512 max;
  __m512i k;
};
__attribute__((target("avx512f"))) inline Winners2x2 winners_2x2(const float* r0, const float* r1,
                                                                 const ChunkMasks& m) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  const __m512 lo0 = _mm512_maskz_loadu_ps(m.in_lo, r0), hi0 = _mm512_maskz_loadu_ps(m.in_hi, r0 + 16);
  const __m512 lo1 = _mm512_maskz_loadu_ps(m.in_lo, r1), hi1 = _mm512_maskz_loadu_ps(m.in_hi, r1 + 16);
  const __m512 a = _mm512_permutex2var_ps(lo0, even, hi0), b = _mm512_permutex2var_ps(lo0, odd, hi0);
  const __m512 c = _mm512_permutex2var_ps(lo1, even, hi1), d = _mm512_permutex2var_ps(lo1, odd, hi1);
  const __mmask16 top_b = beats(b, a), bottom_d = beats(d, c);
  const __m512 top = _mm512_mask_blend_ps(top_b, a, b), bottom = _mm512_mask_blend_ps(bottom_d, c, d);
  const __mmask16 use_bottom = beats(bottom, top);
  return {_mm512_mask_blend_ps(use_bottom, top, bottom),
          _mm512_mask_blend_epi32(use_bottom, _mm512_maskz_mov_epi32(top_b, one),
                                  _mm512_add_epi32(two, _mm512_maskz_mov_epi32(bottom_d, one)))};
}

// Each output's gradient g on the input its window position k names, zeros on the other three:
// rows g0 and g1 of the chunk's 2 x 32 inputs (windows do not overlap).
__attribute__((target("avx512f"))) inline void route_2x2(__m512 g, __m512i k, const ChunkMasks& m, float* g0,
                                                         float* g1) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  __m512 v[4];
  for (int j = 0; j < 4; ++j) v[j] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(j)), g);
  _mm512_mask_storeu_ps(g0, m.in_lo, _mm512_permutex2var_ps(v[0], lo, v[1]));
  _mm512_mask_storeu_ps(g0 + 16, m.in_hi, _mm512_permutex2var_ps(v[0], hi, v[1]));
  _mm512_mask_storeu_ps(g1, m.in_lo, _mm512_permutex2var_ps(v[2], lo, v[3]));
  _mm512_mask_storeu_ps(g1 + 16, m.in_hi, _mm512_permutex2var_ps(v[2], hi, v[3]));
}

// The CNNs' 2x2/2 max pool over one output row, 16 outputs per step (masked loads for the last
// step: the nets' rows are 14 and 7 outputs wide).
__attribute__((target("avx512f"))) void max_row_2x2_avx512(const float* r0, const float* r1, int64_t ow, float* out,
                                                           uint8_t* arg) {
  for (int64_t ox = 0; ox < ow; ox += 16) {
    const ChunkMasks m = chunk_masks(std::min<int64_t>(16, ow - ox));
    const Winners2x2 w = winners_2x2(r0 + 2 * ox, r1 + 2 * ox, m);
    _mm512_mask_storeu_ps(out + ox, m.out, w.max);
    _mm512_mask_cvtepi32_storeu_epi8(arg + ox, m.out, w.k);
  }
}

// Backward of the above from the stored argmax. Writes rows 2*oy and 2*oy+1.
__attribute__((target("avx512f"))) void max_row_2x2_backward_avx512(const float* gy, const uint8_t* arg, int64_t ow,
                                                                    float* g0, float* g1) {
  for (int64_t ox = 0; ox < ow; ox += 16) {
    const int64_t count = std::min<int64_t>(16, ow - ox);
    const ChunkMasks m = chunk_masks(count);
    alignas(16) uint8_t karg[16] = {};
    std::memcpy(karg, arg + ox, size_t(count));
    const __m512i k = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(karg)));
    route_2x2(_mm512_maskz_loadu_ps(m.out, gy + ox), k, m, g0 + 2 * ox, g1 + 2 * ox);
  }
}

// Backward from the input rows r0, r1 instead: the winners found again, routed at once.
__attribute__((target("avx512f"))) void max_row_2x2_backward_from_input_avx512(const float* r0, const float* r1,
                                                                               const float* gy, int64_t ow, float* g0,
                                                                               float* g1) {
  for (int64_t ox = 0; ox < ow; ox += 16) {
    const ChunkMasks m = chunk_masks(std::min<int64_t>(16, ow - ox));
    const Winners2x2 w = winners_2x2(r0 + 2 * ox, r1 + 2 * ox, m);
    route_2x2(_mm512_maskz_loadu_ps(m.out, gy + ox), w.k, m, g0 + 2 * ox, g1 + 2 * ox);
  }
}

// Max over one plane: out[oy*ow+ox] and the window position of the winner.
template <class Arg>
void max_plane(const float* src, const PoolGeometry& g, float* out, Arg* arg) {
  if constexpr (std::is_same_v<Arg, uint8_t>) {
    if (is_2x2_stride2(g) && mixprec::cpu::has_avx512f()) {
      for (int64_t oy = 0; oy < g.oh; ++oy)
        max_row_2x2_avx512(src + 2 * oy * g.w, src + (2 * oy + 1) * g.w, g.ow, out + oy * g.ow, arg + oy * g.ow);
      return;
    }
  }
  max_plane_forward(src, g, out, arg);
}

template <class Arg>
void max_plane_backward_fast(const float* gy, const Arg* arg, const PoolGeometry& g, float* gx) {
  if constexpr (std::is_same_v<Arg, uint8_t>) {
    if (is_2x2_stride2(g) && mixprec::cpu::has_avx512f()) {
      for (int64_t oy = 0; oy < g.oh; ++oy)
        max_row_2x2_backward_avx512(gy + oy * g.ow, arg + oy * g.ow, g.ow, gx + 2 * oy * g.w, gx + (2 * oy + 1) * g.w);
      return;
    }
  }
  max_plane_backward(gy, arg, g, gx);
}

// f(plane, in_buf, out_buf) for every plane, in parallel.
template <class F>
void for_planes(const PoolGeometry& g, F&& f) {
  const int64_t planes = g.n * g.c;
#pragma omp parallel
  {
    std::vector<float> a, b;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) f(p, a, b);
  }
}

}  // namespace

bool max_pool2d_forward(const Tensor& x, const PoolGeometry& g, MaxPoolResult& r) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous()) return false;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  for_planes(g, [&](int64_t p, std::vector<float>& in_buf, std::vector<float>& out) {
    const float* src = in_f32(x, p * in_plane, in_plane, in_buf);
    out.resize(static_cast<size_t>(out_plane));
    if (r.argmax.dtype() == DType::u8)
      max_plane(src, g, out.data(), r.argmax.data<uint8_t>() + p * out_plane);
    else
      max_plane(src, g, out.data(), r.argmax.data<int64_t>() + p * out_plane);
    store_f32(r.dst, p * out_plane, out_plane, out.data());
  });
  return true;
}

bool max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x) {
  if (!f32_compute(grad_y.dtype()) || !grad_y.is_contiguous() || !argmax.is_contiguous()) return false;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  for_planes(g, [&](int64_t p, std::vector<float>& gy_buf, std::vector<float>& gx) {
    const float* gy = in_f32(grad_y, p * out_plane, out_plane, gy_buf);
    gx.assign(size_t(in_plane), 0.f);  // windows may overlap: accumulate in f32, round once
    if (argmax.dtype() == DType::u8)
      max_plane_backward_fast(gy, argmax.data<uint8_t>() + p * out_plane, g, gx.data());
    else
      max_plane_backward_fast(gy, argmax.data<int64_t>() + p * out_plane, g, gx.data());
    store_f32(grad_x, p * in_plane, in_plane, gx.data());
  });
  return true;
}

bool max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g, Tensor& grad_x) {
  if (!f32_compute(grad_y.dtype()) || !grad_y.is_contiguous() || !f32_compute(x.dtype()) || !x.is_contiguous())
    return false;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow, planes = g.n * g.c;
  const bool small = g.argmax_dtype() == DType::u8;
  const bool fused = is_2x2_stride2(g) && mixprec::cpu::has_avx512f();
  // Per plane: the winners again, by the forward's kernel, into a plane-sized argmax; then the
  // argmax form's backward (the 2x2/2 pool routes each chunk's winners at once, no argmax at all).
  // No argmax exists for more than one plane per thread.
#pragma omp parallel
  {
    // The plane's maxima and argmax: only where the winners are not routed at once.
    const size_t scan = fused ? 0 : static_cast<size_t>(out_plane);
    std::vector<float> x_buf, gy_buf, gx(static_cast<size_t>(in_plane)), best(scan);
    std::vector<uint8_t> arg8(small ? scan : 0);
    std::vector<int64_t> arg64(small ? 0 : scan);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const float* src = in_f32(x, p * in_plane, in_plane, x_buf);
      const float* gy = in_f32(grad_y, p * out_plane, out_plane, gy_buf);
      std::fill(gx.begin(), gx.end(), 0.f);
      if (fused) {
        for (int64_t oy = 0; oy < g.oh; ++oy)
          max_row_2x2_backward_from_input_avx512(src + 2 * oy * g.w, src + (2 * oy + 1) * g.w, gy + oy * g.ow, g.ow,
                                                 gx.data() + 2 * oy * g.w, gx.data() + (2 * oy + 1) * g.w);
      } else if (small) {
        max_plane(src, g, best.data(), arg8.data());
        max_plane_backward_fast(gy, arg8.data(), g, gx.data());
      } else {
        max_plane(src, g, best.data(), arg64.data());
        max_plane_backward_fast(gy, arg64.data(), g, gx.data());
      }
      store_f32(grad_x, p * in_plane, in_plane, gx.data());
    }
  }
  return true;
}

bool avg_pool2d_forward(const Tensor& x, const PoolGeometry& g, Tensor& dst) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous()) return false;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  for_planes(g, [&](int64_t p, std::vector<float>& in_buf, std::vector<float>& out) {
    const float* src = in_f32(x, p * in_plane, in_plane, in_buf);
    out.resize(static_cast<size_t>(out_plane));
    avg_plane_forward(src, g, out.data());
    store_f32(dst, p * out_plane, out_plane, out.data());
  });
  return true;
}

bool avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g, Tensor& grad_x) {
  if (!f32_compute(grad_y.dtype()) || !grad_y.is_contiguous()) return false;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  for_planes(g, [&](int64_t p, std::vector<float>& gy_buf, std::vector<float>& gx) {
    const float* gy = in_f32(grad_y, p * out_plane, out_plane, gy_buf);
    gx.assign(size_t(in_plane), 0.f);
    avg_plane_backward(gy, g, gx.data());
    store_f32(grad_x, p * in_plane, in_plane, gx.data());
  });
  return true;
}

}  // namespace mixprec::kernels::cpu
