// <immintrin.h> for the AVX-512 kernels (each function carries its own target attribute).
#pragma once

// GCC < 12.3 warns about the deliberately undefined merge operands inside its own AVX-512
// intrinsics once they are inlined (GCC bug 105593); the pragma covers only that header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "mixprec/cpu.h"

namespace mixprec {

// Which SIMD forms the fast kernels run on this CPU: AVX-512, AVX2 (with FMA: CPUs without
// AVX-512, such as AMD Zen 2), or none (their scalar loops).
enum class Lanes { none, avx2, avx512 };
inline Lanes simd_lanes() {
  static const Lanes l = cpu::has_avx512f() ? Lanes::avx512 : cpu::has_avx2_fma() ? Lanes::avx2 : Lanes::none;
  return l;
}

// dst[c][j] = src[j][c] for the 8 x 8 block of f32 at src ([8][lds]) into dst ([8][ldd]): pairs of
// rows interleaved, then pairs of pairs, then 128-bit lanes.
__attribute__((target("avx2"))) inline void transpose_8x8_avx2(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// The first n of 16 lanes (none for n <= 0, all from 16): a loop's masked tail or edge.
inline __mmask16 first_lanes(int64_t n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

// 16 rows of 16 f32 transposed in registers: pairs of rows interleaved, then pairs of pairs, then
// 128-bit lanes twice.
__attribute__((target("avx512f"))) inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols of 32-bit elements (rows, cols
// <= 16) through transpose_16x16, masked at the edges: nothing outside the block is read or written.
__attribute__((target("avx512f"))) inline void transpose_16x16_32bit(const float* src, int64_t ld_src, int64_t rows,
                                                                     int64_t cols, float* dst, int64_t ld_dst) {
  const __mmask16 in = first_lanes(cols), out = first_lanes(rows);
  __m512 v[16];
  for (int64_t i = 0; i < 16; ++i) v[i] = i < rows ? _mm512_maskz_loadu_ps(in, src + i * ld_src) : _mm512_setzero_ps();
  transpose_16x16(v);
  for (int64_t j = 0; j < cols; ++j) _mm512_mask_storeu_ps(dst + j * ld_dst, out, v[j]);
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols of 16-bit elements (rows, cols
// <= 32): source rows 2i and 2i + 1 interleaved element by element into 32-bit pairs (columns 0-15
// and 16-31), then two 16 x 16 transposes of those pairs, whose every output register is a whole
// destination row of 32 elements. Masked at the edges: nothing outside the rows x cols block is read
// or written.
__attribute__((target("avx512f,avx512bw"))) inline void transpose_32x32_16bit(const uint16_t* src, int64_t ld_src,
                                                                              int64_t rows, int64_t cols, uint16_t* dst,
                                                                              int64_t ld_dst) {
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  const auto first = [](int64_t n) { return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1; };
  const __mmask32 in = first(cols), out = first(rows);
  __m512 lo[16], hi[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t r = 2 * i;
    const __m512i a = r < rows ? _mm512_maskz_loadu_epi16(in, src + r * ld_src) : _mm512_setzero_si512();
    const __m512i b = r + 1 < rows ? _mm512_maskz_loadu_epi16(in, src + (r + 1) * ld_src) : _mm512_setzero_si512();
    lo[i] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(a, lo_idx, b));
    hi[i] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(a, hi_idx, b));
  }
  transpose_16x16(lo);
  transpose_16x16(hi);
  for (int64_t c = 0; c < cols; ++c)
    _mm512_mask_storeu_epi16(dst + c * ld_dst, out, _mm512_castps_si512(c < 16 ? lo[c] : hi[c - 16]));
}

// Asks for the cache lines of [p + 4 KiB, p + 4 KiB + bytes): a streaming kernel's loads 4 KiB
// ahead of where it reads. The hardware prefetchers stop at page boundaries, and on the AMX host
// (2 MiB of L2 a core) GELU, the 2x2 pool's forward, the bias sums and layer norm stalled on their
// loads of tensors of a few MiB (docs/hosts.md, 2026-12-05, fifth session; each call site has its
// measurement). A prefetch never faults, so the lines may lie past the tensor's end. Always
// inlined: GCC 12 finds a function of prefetches alone "pure" and drops calls it did not inline
// (cpu/attention_rows.cpp's row prefetch had none left in its object file).
__attribute__((always_inline)) inline void fetch_ahead(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p) + 4096;
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(c + b, _MM_HINT_T0);
}

// 16 f32 -> 16 bf16 (in 32-bit lanes) on AVX-512F alone (an AVX-512 Xeon without AVX512-BF16):
// the scalar rule in integer lanes, RNE on the low 16 bits and the quieted NaN, so no MXCSR
// setting reaches it. convert.cpp's bulk conversion on such hosts (the scalar loop it replaced
// made every bf16 store 5-10x slower than f32's), and the fused attention's emulated bf16 tiles.
__attribute__((target("avx512f"))) inline __m512i bf16_round_epi32(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(rne, nan, high, _mm512_set1_epi32(0x0040));  // 16-bit values in 32-bit lanes
}

// The lanes of x that are f32 denormals, tested on the bits (VFPCLASSPS and the float compares see
// them as zero under MXCSR.DAZ): |bits| - 1 < 0x7fffff, unsigned.
__attribute__((target("avx512f"))) inline __mmask16 denormal_lanes(__m512 x) {
  return _mm512_cmplt_epu32_mask(
      _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(1)),
      _mm512_set1_epi32(0x007fffff));
}

// 16 f32 -> 16 bf16 where the CPU has AVX512-BF16: bf16_round_epi32's bits in fewer instructions
// (the bulk conversion, the bf16 activations, attention and layer norm rows). VCVTNEPS2BF16 treats
// f32 denormal inputs as zero (DAZ, regardless of MXCSR), whereas the scalar reference rounds them;
// those lanes are redone by bf16_round_epi32. Denormals are rare, so the fix-up hides behind one
// predictable branch. NaNs need none: the scalar NaN rule was chosen to be the instruction's.
__attribute__((target("avx512f,avx512bf16"))) inline __m256i bf16_from_ps(__m512 x) {
  const __m256i r = (__m256i)_mm512_cvtneps_pbh(x);
  const __mmask16 denormal = denormal_lanes(x);
  if (denormal) [[unlikely]]
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(denormal, _mm512_cvtepu16_epi32(r), bf16_round_epi32(x)));
  return r;
}

// 32 f32 (lo, then hi) -> 32 bf16 in one vector: bf16_from_ps's bits, by one VCVTNE2PS2BF16 where
// neither half has a denormal.
__attribute__((target("avx512f,avx512bf16"))) inline __m512i bf16_pair_from_ps(__m512 lo, __m512 hi) {
  if (_kortestz_mask16_u8(denormal_lanes(lo), denormal_lanes(hi))) [[likely]]
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  return _mm512_inserti64x4(_mm512_castsi256_si512(bf16_from_ps(lo)), bf16_from_ps(hi), 1);
}

// 16 f32 -> 16 bf16 by convert()'s rule: bf16_from_ps where `native` (detail::native_bf16_rounding:
// the CPU has AVX512-BF16), else bf16_round_epi32 in integer lanes.
__attribute__((target("avx512f,avx512bf16"))) inline __m256i bf16_round_ps(__m512 x, bool native) {
  return native ? bf16_from_ps(x) : _mm512_cvtepi32_epi16(bf16_round_epi32(x));
}

// The 16 lanes' sum, in lane order from lane 0 (a fixed order; _mm512_reduce_add_ps's is a tree,
// and trips GCC 12's maybe-uninitialized).
__attribute__((target("avx512f"))) inline float lane_sum(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float s = 0.0f;
  for (float x : l) s += x;
  return s;
}

// The 8 lanes' sum, in lane order from lane 0 (AVX2).
__attribute__((target("avx2"))) inline float lane_sum(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  float s = 0.0f;
  for (float x : l) s += x;
  return s;
}

// The first n of 8 32-bit lanes set (none for n <= 0, all from 8): an AVX2 loop's masked tail.
__attribute__((target("avx2"))) inline __m256i first_lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n <= 0   ? 0
                                                  : n >= 8 ? 8
                                                           : n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first n (clamped to 0..8) f32 lanes at p, zeros in the others; nothing past them is read.
__attribute__((target("avx2"))) inline __m256 load_first8(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes8(n));
}

// Stores the first n (clamped to 0..8) lanes of v at p, nothing past them: a whole vector, or 4-,
// 2- and 1-lane pieces (AVX2's masked store is microcoded on AMD Zen, a third of a pooling pass's
// time on Zen 2).
__attribute__((target("avx2"))) inline void store_first8(float* p, __m256 v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
    return;
  }
  __m128 part = _mm256_castps256_ps128(v);
  if (n >= 4) {
    _mm_storeu_ps(p, part);
    part = _mm256_extractf128_ps(v, 1);
    p += 4, n -= 4;
  }
  if (n >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
    part = _mm_movehl_ps(part, part);
    p += 2, n -= 2;
  }
  if (n >= 1) _mm_store_ss(p, part);
}

// The first nb (0..16) bytes at p in the low bytes of a vector, zeros above; nothing past them is
// read. Pieces of 8, 4, 2 and 1 bytes of constant size: a memcpy of a variable size was a libc
// call per row chunk, most of the bf16 2x2 pool's backward on AMD Zen 3 (its rows of 7 and 14).
inline __m128i load_first_bytes(const void* p, int64_t nb) {
  if (nb >= 16) return _mm_loadu_si128(static_cast<const __m128i*>(p));
  const auto* c = static_cast<const unsigned char*>(p);
  uint64_t lo = 0, tail = 0;
  int64_t off = 0;
  int shift = 0;
  if (nb & 8) std::memcpy(&lo, c, 8), off = 8;
  if (nb & 4) {
    uint32_t x;
    std::memcpy(&x, c + off, 4);
    tail = x, shift = 32, off += 4;
  }
  if (nb & 2) {
    uint16_t x;
    std::memcpy(&x, c + off, 2);
    tail |= uint64_t(x) << shift, shift += 16, off += 2;
  }
  if (nb & 1) tail |= uint64_t(c[off]) << shift;
  return (nb & 8) ? _mm_set_epi64x(int64_t(tail), int64_t(lo)) : _mm_set_epi64x(0, int64_t(tail));
}

// The first nb (0..16) bytes of v at p, nothing past them written: pieces as above.
inline void store_first_bytes(void* p, __m128i v, int64_t nb) {
  if (nb >= 16) {
    _mm_storeu_si128(static_cast<__m128i*>(p), v);
    return;
  }
  auto* c = static_cast<unsigned char*>(p);
  uint64_t w = uint64_t(_mm_cvtsi128_si64(v));
  if (nb & 8) std::memcpy(c, &w, 8), c += 8, w = uint64_t(_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)));
  if (nb & 4) {
    const auto x = uint32_t(w);
    std::memcpy(c, &x, 4);
    c += 4, w >>= 32;
  }
  if (nb & 2) {
    const auto x = uint16_t(w);
    std::memcpy(c, &x, 2);
    c += 2, w >>= 16;
  }
  if (nb & 1) *c = static_cast<unsigned char>(w);
}

// 16 bf16 (bits) -> 16 f32, exactly: each value's bits moved to the high half of its lane.
__attribute__((target("avx512f"))) inline __m512 bf16_widen_ps(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

// 8 bf16 (bits) at p -> 8 f32, exactly (AVX2).
__attribute__((target("avx2"))) inline __m256 bf16_widen_avx2(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// 8 f32 -> 8 bf16 (bits), round to nearest even, NaNs kept quiet with their sign and top payload
// bits: the scalar rule's bits (AVX2's integer lanes; bf16_round_epi32's rule on 8 lanes).
__attribute__((target("avx2"))) inline __m128i bf16_round_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rne = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));  // signed compare: both sides >= 0
  const __m256i r = _mm256_blendv_epi8(rne, _mm256_or_si256(high, _mm256_set1_epi32(0x0040)), nan);
  // 32-bit lanes holding 16-bit values -> 8 packed uint16 (packus per 128-bit half, then the halves' order).
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

// 8 f32 -> each rounded into bf16 by bf16_round_avx2's rule and widened back (exact) in its own
// lane: bf16_round_avx2 then bf16_widen_avx2's values, without the packing and unpacking.
__attribute__((target("avx2"))) inline __m256 bf16_round_keep_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x), top = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i bias =
      _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rne = _mm256_and_si256(_mm256_add_epi32(u, bias), top);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_and_si256(u, top), _mm256_set1_epi32(0x00400000));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rne, quiet, nan));
}

// 8 f16 (bits) at p -> 8 f32, exactly (F16C).
__attribute__((target("avx2,f16c"))) inline __m256 f16_widen_avx2(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 f32 -> 8 f16 (bits), round to nearest even whatever MXCSR says (VCVTPS2PH with an explicit RNE
// immediate): the scalar rule's bits, subnormal outputs kept, NaNs quiet with sign and top payload.
__attribute__((target("avx2,f16c"))) inline __m128i f16_round_avx2(__m256 x) {
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// The pairs above by the 16-bit dtype: f16 (true) or bf16 (false).
__attribute__((target("avx2,f16c"))) inline __m256 widen16_avx2(const uint16_t* p, bool f16) {
  return f16 ? f16_widen_avx2(p) : bf16_widen_avx2(p);
}
__attribute__((target("avx2,f16c"))) inline __m128i round16_avx2(__m256 x, bool f16) {
  return f16 ? f16_round_avx2(x) : bf16_round_avx2(x);
}
// 8 f32 -> the values round16_avx2 gives them, widened back (exact) to f32.
__attribute__((target("avx2,f16c"))) inline __m256 round16_keep_avx2(__m256 x, bool f16) {
  return f16 ? _mm256_cvtph_ps(f16_round_avx2(x)) : bf16_round_keep_avx2(x);
}

}  // namespace mixprec
