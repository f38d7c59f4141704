// Fast CPU pooling: OpenMP over the N*C planes of an NCHW tensor, each plane converted to f32
// once, pooled in f32 and stored rounded once. f32/bf16/f16; f64 goes to the reference. The
// CNNs' 2x2/2 max pool instead runs over the whole tensor's rows in AVX-512 registers (AVX2 ones
// on a host without AVX-512; no per-plane buffers), forward and backward, in f32 and bf16, and in
// f16 with AVX-512 (16-bit values widened in registers; the forward's maxima rounded in bulk, the
// gradients in registers).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/simd.h"
#include "kernels/activation.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/pool.h"

#include "core/parallel.h"
#include "kernels/pool_window.h"
#include "mixprec/allocator.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

// The vector 2x2/2 kernels: every window inside the input (in ceil mode the last row or column of
// windows can hang over the edge; those go to the plane kernels, which skip the missing taps).
// AVX-512BW for the 16-bit and 8-bit masked loads, or AVX2 (8 outputs a step) without AVX-512.
bool avx512_rows() {
  static const bool ok = mixprec::cpu::has_avx512bw();
  return ok;
}
bool vector_2x2(const PoolGeometry& g) {
  return g.is_2x2_stride2() && 2 * g.oh <= g.h && 2 * g.ow <= g.w && (avx512_rows() || mixprec::cpu::has_avx2_fma());
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

// The four inputs of 16 (or m.out's) 2x2 windows, exactly as f32: a, b on the top row, c, d below.
struct Taps2x2 {
  __m512 a, b, c, d;
};

// From f32 rows: each row's 32 inputs split into even (left) and odd (right) columns.
__attribute__((target("avx512f"))) inline Taps2x2 taps_2x2(const float* r0, const float* r1, const ChunkMasks& m) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 lo0 = _mm512_maskz_loadu_ps(m.in_lo, r0), hi0 = _mm512_maskz_loadu_ps(m.in_hi, r0 + 16);
  const __m512 lo1 = _mm512_maskz_loadu_ps(m.in_lo, r1), hi1 = _mm512_maskz_loadu_ps(m.in_hi, r1 + 16);
  return {_mm512_permutex2var_ps(lo0, even, hi0), _mm512_permutex2var_ps(lo0, odd, hi0),
          _mm512_permutex2var_ps(lo1, even, hi1), _mm512_permutex2var_ps(lo1, odd, hi1)};
}

// From bf16 rows: a 32-bit lane holds one window's two neighbours of a row (the left one in its
// low half), and each widens exactly by moving its bits to the high half of a lane.
__attribute__((target("avx512f"))) inline Taps2x2 taps_2x2(const uint16_t* r0, const uint16_t* r1,
                                                           const ChunkMasks& m) {
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  const __m512i t = _mm512_maskz_loadu_epi32(m.out, r0), u = _mm512_maskz_loadu_epi32(m.out, r1);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(t, 16)), _mm512_castsi512_ps(_mm512_and_si512(t, high)),
          _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), _mm512_castsi512_ps(_mm512_and_si512(u, high))};
}

// From f16 rows: as bf16's, a 32-bit lane holds a window's two neighbours of a row; each is
// narrowed out of its lane and widened by VCVTPH2PS, exact (subnormals too), a signalling NaN
// quieted: the instruction the plane path's bulk conversion (convert.cpp) widens with.
__attribute__((target("avx512f"))) inline __m512 f16_low_ps(__m512i v) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}
__attribute__((target("avx512f"))) inline Taps2x2 taps_2x2(const f16_t* r0, const f16_t* r1, const ChunkMasks& m) {
  const __m512i t = _mm512_maskz_loadu_epi32(m.out, r0), u = _mm512_maskz_loadu_epi32(m.out, r1);
  return {f16_low_ps(t), f16_low_ps(_mm512_srli_epi32(t, 16)), f16_low_ps(u), f16_low_ps(_mm512_srli_epi32(u, 16))};
}

// The winners of the windows: the maxima and their window positions (0..3). A pairwise tournament
// that picks what the sequential scan picks: the first of equal maxima, the last NaN.
struct Winners2x2 {
  __m512 max;
  __m512i k;
};
__attribute__((target("avx512f"))) inline Winners2x2 winners_2x2(const Taps2x2& t) {
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
  const __mmask16 top_b = beats(t.b, t.a), bottom_d = beats(t.d, t.c);
  const __m512 top = _mm512_mask_blend_ps(top_b, t.a, t.b), bottom = _mm512_mask_blend_ps(bottom_d, t.c, t.d);
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

// The same for bf16 gradients (bits in the low half of 32-bit lanes): a lane of a row takes the
// left input's bits low and the right one's high.
__attribute__((target("avx512f"))) inline void route_2x2(__m512i g, __m512i k, const ChunkMasks& m, uint16_t* g0,
                                                         uint16_t* g1) {
  __m512i v[4];
  for (int j = 0; j < 4; ++j) v[j] = _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(j)), g);
  _mm512_mask_storeu_epi32(g0, m.out, _mm512_or_si512(v[0], _mm512_slli_epi32(v[1], 16)));
  _mm512_mask_storeu_epi32(g1, m.out, _mm512_or_si512(v[2], _mm512_slli_epi32(v[3], 16)));
}

// f16 gradients are routed as bf16's bits are.
__attribute__((target("avx512f"))) inline void route_2x2(__m512i g, __m512i k, const ChunkMasks& m, f16_t* g0,
                                                         f16_t* g1) {
  route_2x2(g, k, m, reinterpret_cast<uint16_t*>(g0), reinterpret_cast<uint16_t*>(g1));
}

// A chunk's incoming gradients in the tensor's dtype: f32 as is; bf16 rounded by the scalar rule
// (bf16_round_epi32), which gives back a widened bf16 value's own bits, so the routed gradient is
// what rounding an f32 copy once gives, NaNs included; f16 widened and narrowed back by VCVTPH2PS
// and VCVTPS2PH, the plane path's instructions (the value's own bits, a signalling NaN quieted).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 load_grad(const float* gy, const ChunkMasks& m) {
  return _mm512_maskz_loadu_ps(m.out, gy);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i load_grad(const uint16_t* gy, const ChunkMasks& m) {
  return bf16_round_epi32(bf16_widen_ps(_mm256_maskz_loadu_epi16(m.out, gy)));
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i load_grad(const f16_t* gy, const ChunkMasks& m) {
  const __m512 g = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m.out, gy));
  return _mm512_cvtepu16_epi32(_mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The row kernels below take `rows` output rows of `ow` outputs each, one after another, whose
// windows read input rows 2j and 2j + 1 of `w` elements from `x` (a plane, or a run of planes
// whose every row is in a window): one call per plane or per block of rows, not per row (the
// nets' rows are 14 and 7 outputs wide, so a call, an index division and a zeroing per row cost
// as much as the row). 16 outputs per step, masked for the last step of a row.

// Each row pair asks for the rows 4 KiB ahead of it (fetch_ahead). On the AMX host the pool's
// loads stalled on memory (perf: 60% of the forward's samples on the instructions after its loads;
// the cnn 32/64's first pool reads 12.8 MB): `mixprec bench --model cnn --channels 32,64
// --batch-size 256 --precision amp-bf16 --profile`, alternating runs (2026-12-05), the forward
// 1.45-1.58 -> 1.10-1.17 ms a step. The backward kernels' loads ahead gained nothing there
// (1.29-1.39 against 1.38-1.44 ms), so they have none.

// The 2x2/2 max pool over f32, bf16 or f16 rows, the maxima in f32 (exactly a 16-bit input's value). The
// argmax is narrowed in registers, then stored (vpmovdb with a memory operand is microcoded and
// slow on AMD Zen).
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_rows_2x2_avx512(const T* x, int64_t w, int64_t ow,
                                                                              int64_t rows, float* out, uint8_t* arg) {
  for (int64_t j = 0; j < rows; ++j, x += 2 * w, out += ow, arg += ow) {
    fetch_ahead(x, 2 * w * int64_t(sizeof(T)));
    for (int64_t ox = 0; ox < ow; ox += 16) {
      const ChunkMasks m = chunk_masks(std::min<int64_t>(16, ow - ox));
      const Winners2x2 win = winners_2x2(taps_2x2(x + 2 * ox, x + w + 2 * ox, m));
      _mm512_mask_storeu_ps(out + ox, m.out, win.max);
      _mm_mask_storeu_epi8(arg + ox, m.out, _mm512_cvtepi32_epi8(win.k));
    }
  }
}

// Backward of the above from the stored argmax. Writes inputs [0, 2 * ow) of each row pair of gx.
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_rows_2x2_backward_avx512(const T* gy, const uint8_t* arg,
                                                                                       int64_t w, int64_t ow,
                                                                                       int64_t rows, T* gx) {
  for (int64_t j = 0; j < rows; ++j, gy += ow, arg += ow, gx += 2 * w)
    for (int64_t ox = 0; ox < ow; ox += 16) {
      const ChunkMasks m = chunk_masks(std::min<int64_t>(16, ow - ox));
      const __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m.out, arg + ox));
      route_2x2(load_grad(gy + ox, m), k, m, gx + 2 * ox, gx + w + 2 * ox);
    }
}

// Backward from the input rows instead: the winners found again, routed at once.
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_rows_2x2_backward_from_input_avx512(const T* x,
                                                                                                  const T* gy,
                                                                                                  int64_t w, int64_t ow,
                                                                                                  int64_t rows, T* gx) {
  for (int64_t j = 0; j < rows; ++j, x += 2 * w, gy += ow, gx += 2 * w)
    for (int64_t ox = 0; ox < ow; ox += 16) {
      const ChunkMasks m = chunk_masks(std::min<int64_t>(16, ow - ox));
      const Winners2x2 win = winners_2x2(taps_2x2(x + 2 * ox, x + w + 2 * ox, m));
      route_2x2(load_grad(gy + ox, m), win.k, m, gx + 2 * ox, gx + w + 2 * ox);
    }
}

// ---------------------------------------------------------------- AVX2 (hosts without AVX-512)
// The same row kernels, 8 outputs a step: the same tournament, the same routing, with AVX2's masked
// loads on a row's last chunk (32-bit lanes: a bf16 row's window pair is one lane, as above).

// A chunk of n outputs: a full one loads and stores whole vectors, a row's last one loads masked
// and stores its lanes in pieces (core/simd.h's load_first8 and store_first8; bf16 pairs, only
// 2-byte aligned, and the argmax bytes, load_first_bytes and store_first_bytes).
// n 32-bit lanes (bf16 pairs) at a 2-byte aligned p: the bits as they are.
__attribute__((target("avx2"))) inline void store_pairs8(uint16_t* p, __m256i v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    return;
  }
  const int64_t nb = 4 * std::max<int64_t>(n, 0);
  store_first_bytes(p, _mm256_castsi256_si128(v), std::min<int64_t>(nb, 16));
  if (nb > 16) store_first_bytes(p + 8, _mm256_extracti128_si256(v, 1), nb - 16);
}
struct Taps8 {
  __m256 a, b, c, d;
};
// Even and odd columns of 16 f32 inputs (lo, hi), in order.
__attribute__((target("avx2"))) inline void split8(__m256 lo, __m256 hi, __m256& even, __m256& odd) {
  const __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
               o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}
__attribute__((target("avx2"))) inline Taps8 taps8(const float* r0, const float* r1, int64_t n) {
  Taps8 t;
  split8(load_first8(r0, 2 * n), load_first8(r0 + 8, 2 * n - 8), t.a, t.b);
  split8(load_first8(r1, 2 * n), load_first8(r1 + 8, 2 * n - 8), t.c, t.d);
  return t;
}
__attribute__((target("avx2"))) inline Taps8 taps8(const uint16_t* r0, const uint16_t* r1, int64_t n) {
  const __m256i high = _mm256_set1_epi32(int(0xFFFF0000u));
  const __m256i t = _mm256_castps_si256(load_first8(reinterpret_cast<const float*>(r0), n));
  const __m256i u = _mm256_castps_si256(load_first8(reinterpret_cast<const float*>(r1), n));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(t, 16)), _mm256_castsi256_ps(_mm256_and_si256(t, high)),
          _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), _mm256_castsi256_ps(_mm256_and_si256(u, high))};
}
// b > a, or b is NaN (all-ones lanes).
__attribute__((target("avx2"))) inline __m256 beats8(__m256 b, __m256 a) {
  return _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}
struct Winners8 {
  __m256 max;
  __m256i k;
};
__attribute__((target("avx2"))) inline Winners8 winners8(const Taps8& t) {
  const __m256 top_b = beats8(t.b, t.a), bottom_d = beats8(t.d, t.c);
  const __m256 top = _mm256_blendv_ps(t.a, t.b, top_b), bottom = _mm256_blendv_ps(t.c, t.d, bottom_d);
  const __m256 use_bottom = beats8(bottom, top);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i top_k = _mm256_and_si256(_mm256_castps_si256(top_b), one);
  const __m256i bottom_k = _mm256_add_epi32(_mm256_set1_epi32(2), _mm256_and_si256(_mm256_castps_si256(bottom_d), one));
  return {_mm256_blendv_ps(top, bottom, use_bottom),
          _mm256_blendv_epi8(top_k, bottom_k, _mm256_castps_si256(use_bottom))};
}
// Lanes of g where k == j, zeros elsewhere.
__attribute__((target("avx2"))) inline __m256i pick8(__m256i g, __m256i k, int j) {
  return _mm256_and_si256(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(j)), g);
}
__attribute__((target("avx2"))) inline void route8(__m256 g, __m256i k, int64_t n, float* g0, float* g1) {
  const __m256i gi = _mm256_castps_si256(g);
  for (int row = 0; row < 2; ++row) {
    const __m256 l = _mm256_castsi256_ps(pick8(gi, k, 2 * row)), r = _mm256_castsi256_ps(pick8(gi, k, 2 * row + 1));
    const __m256 lo = _mm256_unpacklo_ps(l, r), hi = _mm256_unpackhi_ps(l, r);
    float* dst = row == 0 ? g0 : g1;
    store_first8(dst, _mm256_permute2f128_ps(lo, hi, 0x20), 2 * n);
    store_first8(dst + 8, _mm256_permute2f128_ps(lo, hi, 0x31), 2 * n - 8);
  }
}
__attribute__((target("avx2"))) inline void route8(__m256i g, __m256i k, int64_t n, uint16_t* g0, uint16_t* g1) {
  store_pairs8(g0, _mm256_or_si256(pick8(g, k, 0), _mm256_slli_epi32(pick8(g, k, 1), 16)), n);
  store_pairs8(g1, _mm256_or_si256(pick8(g, k, 2), _mm256_slli_epi32(pick8(g, k, 3), 16)), n);
}
// The incoming gradients: f32 as is; bf16 bits in 32-bit lanes, a signalling NaN quieted (the
// scalar rounding rule applied to a widened bf16 value: its own bits otherwise).
__attribute__((target("avx2"))) inline __m256 grad8(const float* gy, int64_t n) { return load_first8(gy, n); }
__attribute__((target("avx2"))) inline __m256i grad8(const uint16_t* gy, int64_t n) {
  const __m256i low = _mm256_cvtepu16_epi32(load_first_bytes(gy, 2 * std::min<int64_t>(n, 8)));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(low, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7f80));
  return _mm256_or_si256(low, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040)));
}
template <class T>
__attribute__((target("avx2"))) void max_rows_2x2_avx2(const T* x, int64_t w, int64_t ow, int64_t rows, float* out,
                                                       uint8_t* arg) {
  for (int64_t j = 0; j < rows; ++j, x += 2 * w, out += ow, arg += ow)
    for (int64_t ox = 0; ox < ow; ox += 8) {
      const int64_t n = std::min<int64_t>(8, ow - ox);
      const Winners8 win = winners8(taps8(x + 2 * ox, x + w + 2 * ox, n));
      store_first8(out + ox, win.max, n);
      const __m128i k16 = _mm_packus_epi32(_mm256_castsi256_si128(win.k), _mm256_extracti128_si256(win.k, 1));
      store_first_bytes(arg + ox, _mm_packus_epi16(k16, k16), n);
    }
}

template <class T>
__attribute__((target("avx2"))) void max_rows_2x2_backward_avx2(const T* gy, const uint8_t* arg, int64_t w, int64_t ow,
                                                                int64_t rows, T* gx) {
  for (int64_t j = 0; j < rows; ++j, gy += ow, arg += ow, gx += 2 * w)
    for (int64_t ox = 0; ox < ow; ox += 8) {
      const int64_t n = std::min<int64_t>(8, ow - ox);
      const __m256i k = _mm256_cvtepu8_epi32(load_first_bytes(arg + ox, n));
      route8(grad8(gy + ox, n), k, n, gx + 2 * ox, gx + w + 2 * ox);
    }
}

template <class T>
__attribute__((target("avx2"))) void max_rows_2x2_backward_from_input_avx2(const T* x, const T* gy, int64_t w,
                                                                           int64_t ow, int64_t rows, T* gx) {
  for (int64_t j = 0; j < rows; ++j, x += 2 * w, gy += ow, gx += 2 * w)
    for (int64_t ox = 0; ox < ow; ox += 8) {
      const int64_t n = std::min<int64_t>(8, ow - ox);
      const Winners8 win = winners8(taps8(x + 2 * ox, x + w + 2 * ox, n));
      route8(grad8(gy + ox, n), win.k, n, gx + 2 * ox, gx + w + 2 * ox);
    }
}

// The row kernels of this host (f16 has AVX-512's only: tensor_2x2 sends it nowhere else).
template <class T>
void max_rows_2x2(const T* x, int64_t w, int64_t ow, int64_t rows, float* out, uint8_t* arg) {
  if constexpr (std::is_same_v<T, f16_t>)
    max_rows_2x2_avx512<T>(x, w, ow, rows, out, arg);
  else
    (avx512_rows() ? max_rows_2x2_avx512<T> : max_rows_2x2_avx2<T>)(x, w, ow, rows, out, arg);
}
template <class T>
void max_rows_2x2_backward(const T* gy, const uint8_t* arg, int64_t w, int64_t ow, int64_t rows, T* gx) {
  if constexpr (std::is_same_v<T, f16_t>)
    max_rows_2x2_backward_avx512<T>(gy, arg, w, ow, rows, gx);
  else
    (avx512_rows() ? max_rows_2x2_backward_avx512<T> : max_rows_2x2_backward_avx2<T>)(gy, arg, w, ow, rows, gx);
}
template <class T>
void max_rows_2x2_backward_from_input(const T* x, const T* gy, int64_t w, int64_t ow, int64_t rows, T* gx) {
  if constexpr (std::is_same_v<T, f16_t>)
    max_rows_2x2_backward_from_input_avx512<T>(x, gy, w, ow, rows, gx);
  else
    (avx512_rows() ? max_rows_2x2_backward_from_input_avx512<T>
                   : max_rows_2x2_backward_from_input_avx2<T>)(x, gy, w, ow, rows, gx);
}

// The vector kernels over whole f32, bf16 or f16 tensors, without per-plane buffers, in runs of output
// rows whose input row pairs follow each other: f(first output's offset, first input row's offset,
// rows) for every run, in parallel. Where every input row is in a window (h = 2 oh), output row r
// of the n * c * oh reads input rows 2r and 2r + 1 of the tensor, and a run is a block of rows
// across planes; otherwise a run is one plane, then zero_unreached(plane) after it.
constexpr int64_t kRowBlock = 64;

// Output rows per run (at most).
int64_t row_run(const PoolGeometry& g) { return g.h == 2 * g.oh ? kRowBlock : g.oh; }

template <class F>
void for_row_runs(const PoolGeometry& g, F&& f) {
  const int64_t rows = g.n * g.c * g.oh;
  if (rows == 0) return;  // nothing to pool (and no run length to divide by where oh is 0)
  const bool across = g.h == 2 * g.oh;
  const int64_t run = row_run(g), runs = (rows + run - 1) / run;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * g.ow, 4096))
  for (int64_t k = 0; k < runs; ++k) {
    const int64_t r = k * run, n = std::min(run, rows - r);
    f(r * g.ow, across ? 2 * r * g.w : k * g.h * g.w, n);
  }
}

// f16 rows with AVX-512 only (the AVX2 kernels' 8-lane loads have no f16 form; there f16 takes the
// plane path, whose bits are the same).
bool tensor_2x2(const PoolGeometry& g, DType t) {
  return (t == DType::f32 || t == DType::bf16 || (t == DType::f16 && avx512_rows())) && vector_2x2(g);
}

// f(T{}) with T the row kernels' element for a dtype tensor_2x2 takes: float, bf16's uint16_t, f16_t.
template <class F>
void with_row_type(DType t, F&& f) {
  if (t == DType::f32)
    f(float{});
  else if (t == DType::bf16)
    f(uint16_t{});
  else
    f(f16_t{});
}

template <class T>
T* elems(Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}
template <class T>
const T* elems(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}

// The forward over the tensor's rows: f32 maxima stored as they are; 16-bit ones staged in f32, a
// run at a time, then rounded into dst by one bulk conversion (the plane path's bits). Storing a
// bf16 row kernel's maxima from registers (masked 16-bit stores, 14 or 7 outputs a row) was slower
// than the plane path on the AMD Zen 5 host, 1.76 against 1.41 ms for the cnn 32/64's two pools;
// the plane path pays two conversion calls per plane (the cnn 32/64 has 24,576 planes of 784 or
// 196 inputs). Staged, on the AMD Zen 4 host (2026-12-03, `bench --profile`, three alternating
// pairs): the cnn 32/64's two pools 2.45-3.05 -> 1.77-2.00 ms, the wide cnn's 8.2-9.6 -> 5.1-6.4.
template <class T>
void max_forward_2x2(const Tensor& x, const PoolGeometry& g, MaxPoolResult& r) {
  uint8_t* arg = r.argmax.data<uint8_t>();
  const T* src = elems<T>(x);
  if constexpr (std::is_same_v<T, float>) {
    float* dst = elems<float>(r.dst);
    for_row_runs(g,
                 [&](int64_t o, int64_t i, int64_t rows) { max_rows_2x2(src + i, g.w, g.ow, rows, dst + o, arg + o); });
    return;
  }
  const int64_t stage_len = row_run(g) * g.ow;  // a thread's staged maxima
  Tensor stage;
  {
    const MemoryScope scope(MemCategory::workspace);
    stage = Tensor::empty({omp_get_max_threads(), stage_len}, DType::f32);
  }
  float* const stages = elems<float>(stage);
  for_row_runs(g, [&](int64_t o, int64_t i, int64_t rows) {
    float* const mine = stages + int64_t(omp_get_thread_num()) * stage_len;
    max_rows_2x2(src + i, g.w, g.ow, rows, mine, arg + o);
    store_f32(r.dst, o, rows * g.ow, mine);
  });
}

// The inputs no window reaches in a run of `rows` row pairs from gx (a last odd column of each
// row; after a plane, its last odd row) get zeros; the windows' rows are written whole by the
// kernels. Nothing to do where w = 2 ow and h = 2 oh.
template <class T>
void zero_unreached(T* gx, const PoolGeometry& g, int64_t rows) {
  if (g.w > 2 * g.ow)
    for (int64_t row = 0; row < 2 * rows; ++row) std::fill(gx + row * g.w + 2 * g.ow, gx + (row + 1) * g.w, T{});
  if (g.h > 2 * g.oh) std::fill(gx + 2 * g.oh * g.w, gx + g.h * g.w, T{});  // a run is one plane here
}

template <class T>
void max_backward_2x2(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x) {
  const T* gy = elems<T>(grad_y);
  const uint8_t* arg = argmax.data<uint8_t>();
  T* gx = elems<T>(grad_x);
  for_row_runs(g, [&](int64_t o, int64_t i, int64_t rows) {
    max_rows_2x2_backward(gy + o, arg + o, g.w, g.ow, rows, gx + i);
    zero_unreached(gx + i, g, rows);
  });
}

template <class T>
void max_backward_from_input_2x2(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g, Tensor& grad_x) {
  const T* gy = elems<T>(grad_y);
  const T* src = elems<T>(x);
  T* gx = elems<T>(grad_x);
  for_row_runs(g, [&](int64_t o, int64_t i, int64_t rows) {
    max_rows_2x2_backward_from_input(src + i, gy + o, g.w, g.ow, rows, gx + i);
    zero_unreached(gx + i, g, rows);
  });
}

// Max over one plane: out[oy*ow+ox] and the window position of the winner.
template <class Arg>
void max_plane(const float* src, const PoolGeometry& g, float* out, Arg* arg) {
  if constexpr (std::is_same_v<Arg, uint8_t>) {
    if (vector_2x2(g)) {
      max_rows_2x2(src, g.w, g.ow, g.oh, out, arg);
      return;
    }
  }
  max_plane_forward(src, g, out, arg);
}

template <class Arg>
void max_plane_backward_fast(const float* gy, const Arg* arg, const PoolGeometry& g, float* gx) {
  if constexpr (std::is_same_v<Arg, uint8_t>) {
    if (vector_2x2(g)) {
      max_rows_2x2_backward(gy, arg, g.w, g.ow, g.oh, gx);
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

void max_pool_plane_f32(const float* src, int64_t row_stride, const PoolGeometry& g, float* out, uint8_t* argmax) {
  if (row_stride == g.w) {
    max_plane(src, g, out, argmax);
  } else if (vector_2x2(g)) {  // the row kernels take any stride
    max_rows_2x2(src, row_stride, g.ow, g.oh, out, argmax);
  } else {  // the general kernel reads packed rows
    thread_local std::vector<float> packed;
    packed.resize(size_t(g.h * g.w));
    for (int64_t r = 0; r < g.h; ++r) std::copy_n(src + r * row_stride, g.w, packed.data() + r * g.w);
    max_plane(packed.data(), g, out, argmax);
  }
}

void max_unpool_plane(const void* gy, const uint8_t* argmax, const PoolGeometry& g, DType t, void* gx, float* scratch,
                      const void* relu_y) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  if (relu_y != nullptr) {  // masked into the scratch's last out_plane floats
    float* masked = scratch + out_plane + in_plane;
    relu_mask(gy, relu_y, t, out_plane, masked);
    gy = masked;
  }
  if (tensor_2x2(g, t)) {  // max_backward_2x2's kernels on one plane's rows
    with_row_type(t, [&](auto e) {
      using T = decltype(e);
      max_rows_2x2_backward(static_cast<const T*>(gy), argmax, g.w, g.ow, g.oh, static_cast<T*>(gx));
      zero_unreached(static_cast<T*>(gx), g, g.oh);
    });
    return;
  }
  // max_pool2d_backward's plane path.
  const float* gyf = in_f32(gy, t, 0, out_plane, scratch);
  float* gxf = scratch + out_plane;
  std::fill(gxf, gxf + in_plane, 0.0f);
  max_plane_backward_fast(gyf, argmax, g, gxf);
  store_f32(gx, t, 0, in_plane, gxf);
}

bool max_pool2d_forward(const Tensor& x, const PoolGeometry& g, MaxPoolResult& r) {
  if (!f32_compute(x.dtype()) || !x.is_contiguous()) return false;
  if (tensor_2x2(g, x.dtype())) {
    with_row_type(x.dtype(), [&](auto e) { max_forward_2x2<decltype(e)>(x, g, r); });
    return true;
  }
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
  if (tensor_2x2(g, grad_y.dtype())) {
    with_row_type(grad_y.dtype(), [&](auto e) { max_backward_2x2<decltype(e)>(grad_y, argmax, g, grad_x); });
    return true;
  }
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
  if (tensor_2x2(g, x.dtype()) && grad_y.dtype() == x.dtype()) {
    with_row_type(x.dtype(), [&](auto e) { max_backward_from_input_2x2<decltype(e)>(grad_y, x, g, grad_x); });
    return true;
  }
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow, planes = g.n * g.c;
  const bool small = g.argmax_dtype() == DType::u8;
  const bool fused = vector_2x2(g);
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
        max_rows_2x2_backward_from_input(src, gy, g.w, g.ow, g.oh, gx.data());
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
