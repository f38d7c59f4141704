// The tiles of the fused CPU attention (cpu/attention.cpp): rows loaded from strided views,
// operands packed for the register-blocked product C (f32) += A B, on bf16 pairs with
// AVX512-BF16 (_mm512_dpbf16_ps: two products per lane, f32 accumulation) or on f32 with FMA.
// Internal to the attention kernels.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/simd.h"
#include "mixprec/convert.h"

// Every SIMD function of the attention kernels: the f32 instantiations use no AVX512-BF16
// instruction, so they run on AVX-512 CPUs without it (the dispatch checks).
#define MIXPREC_ATTN_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace mixprec::kernels::cpu::attn {

// A bf16 tile element whose products and roundings are emulated in AVX-512F (EmulatedBf16Tiles,
// kernels/attention.h): uint16_t's bits and layout, the AVX512-BF16 instructions' results but for
// subnormals, which those flush. Lets a host without AVX512-BF16 run the bf16-tile path's tiling,
// pairing and masks in tests.
struct EmulatedBf16 {
  uint16_t bits;
};

// A tile element: bf16 bits (products on pairs along the contraction; uint16_t on AVX512-BF16) or
// f32.
template <class E>
constexpr bool kBf16Tile = std::is_same_v<E, uint16_t> || std::is_same_v<E, EmulatedBf16>;
template <class E>
constexpr int64_t kPair = kBf16Tile<E> ? 2 : 1;

// 16 f32 rounded to bf16 (to nearest even): VCVTNEPS2BF16, or for emulated tiles the same rule in
// integer lanes.
template <class E>
MIXPREC_ATTN_TARGET inline __m256i round_bf16(__m512 x) {
  if constexpr (std::is_same_v<E, uint16_t>)
    return (__m256i)_mm512_cvtneps_pbh(x);
  else
    return _mm512_cvtepi32_epi16(bf16_round_epi32(x));
}

// acc + a b over 16 lanes of bf16 pairs: VDPBF16PS (the odd elements' product added first, then
// the even ones'), or for emulated tiles the same two additions as fused multiply-adds (a product
// of two bf16 values is exact in f32, so each add rounds once, as the instruction's does).
template <class E>
MIXPREC_ATTN_TARGET inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  if constexpr (std::is_same_v<E, uint16_t>) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  } else {
    const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, high)),
                          _mm512_castsi512_ps(_mm512_and_si512(b, high)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)),
                           acc);
  }
}

constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// n elements of a row of dtype t (element stride se) into E: bf16 stays bits for a bf16 tile, every
// other dtype becomes f32; dst[n .. padded) is zeroed. Unit-stride 16-bit rows are widened here, 16
// lanes at a time (exactly, as convert does): the rows are a head's few dozen elements, for which
// a call of the bulk conversion costs more than the row.
template <class E>
MIXPREC_ATTN_TARGET void load_row(const char* src, DType t, int64_t se, int64_t n, E* dst, int64_t padded) {
  const size_t es = dtype_size(t);
  if constexpr (kBf16Tile<E>) {
    if (se == 1) {
      std::memcpy(dst, src, size_t(n) * 2);
    } else {
      for (int64_t e = 0; e < n; ++e) std::memcpy(dst + e, src + size_t(e * se) * es, 2);
    }
  } else if (se == 1 && (t == DType::bf16 || t == DType::f16)) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 in = first_lanes(n - i);
      const __m256i x = _mm256_maskz_loadu_epi16(in, h + i);
      const __m512 f = t == DType::bf16 ? bf16_widen_ps(x) : _mm512_cvtph_ps(x);
      _mm512_mask_storeu_ps(dst + i, in, f);
    }
  } else if (se == 1) {
    convert(src, t, dst, DType::f32, size_t(n));
  } else {
    for (int64_t e = 0; e < n; ++e) convert(src + size_t(e * se) * es, t, dst + e, DType::f32, 1);
  }
  std::fill(dst + n, dst + padded, E{});
}

// f32 -> E (bf16 rounded to nearest even, as every bf16 store of mixprec).
template <class E>
MIXPREC_ATTN_TARGET inline void to_tile(const float* src, E* dst, int64_t n) {
  if constexpr (kBf16Tile<E>) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), round_bf16<E>(_mm512_loadu_ps(src + i)));
    for (; i < n; ++i) {
      const uint16_t h = f32_to_bf16(src[i]);
      std::memcpy(dst + i, &h, 2);
    }
  } else {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
}

// 16 + 16 16-bit elements interleaved, x0 y0 x1 y1 ... x15 y15, into dst[0, 32): a pair of rows
// as the bf16 B operand's pairs.
MIXPREC_ATTN_TARGET inline void store_interleaved(__m256i x, __m256i y, void* dst) {
  const __m256i lo = _mm256_unpacklo_epi16(x, y), hi = _mm256_unpackhi_epi16(x, y);  // per 128-bit lane
  auto* d = static_cast<__m256i*>(dst);
  _mm256_storeu_si256(d, _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(d + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
}

// 16 + 16 f32 of two rows rounded to bf16 (round_bf16's bits) side by side, x in the low half and
// y in the high: one VCVTNE2PS2BF16 for bf16 tiles.
template <class E>
MIXPREC_ATTN_TARGET inline __m512i round_bf16_pair(__m512 x, __m512 y) {
  if constexpr (std::is_same_v<E, uint16_t>)
    return (__m512i)_mm512_cvtne2ps_pbh(y, x);
  else
    return _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16<E>(x)), round_bf16<E>(y), 1);
}
// round_bf16_pair's halves interleaved, x0 y0 x1 y1 ... x15 y15 (store_interleaved's order), by one
// VPERMW.
MIXPREC_ATTN_TARGET inline __m512i interleave_halves(__m512i xy) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), xy);
}

// An f32 tile (rows of ld) as the B operand of a product that contracts over its rows: bf16 pairs
// of rows interleaved ([rows_pad / 2][cols][2], an odd last row paired with zeros); cols a
// multiple of 16.
template <class E>
MIXPREC_ATTN_TARGET inline void pack_row_pairs(const float* src, int64_t ld, int64_t rows, int64_t cols, E* dst) {
  static_assert(kBf16Tile<E>);
  for (int64_t r = 0; r < rows; r += 2) {
    const float* a = src + r * ld;
    const float* b = r + 1 < rows ? a + ld : nullptr;
    E* d = dst + r * cols;
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512 y = b ? _mm512_loadu_ps(b + c) : _mm512_setzero_ps();  // rounds to bf16 zeros
      _mm512_storeu_si512(d + 2 * c, interleave_halves(round_bf16_pair<E>(_mm512_loadu_ps(a + c), y)));
    }
  }
}

// dst[c * ld_dst + r] = src[r * ld_src + c]: rows x cols of f32 or 16-bit elements through
// registers (core/simd.h), masked at the edges: f32 in 16 x 16 blocks, 16-bit ones in 32 x 32 (a
// pair of rows interleaved into 32-bit lanes, a destination row a register: a gpt layer's bf16
// attention backward 1.18-1.22 ms against 1.19-1.30 through 16 x 16 blocks of widened lanes,
// docs/design.md, "Transposes"). Each block of rows asks for the next one's lines
// first: in a training step the rows were last written by another op (the gpt's q, k, v, dO are
// rows of 64-128 bytes 768 bytes apart in the packed qkv), the hardware prefetchers stop at every
// 4 KiB page, and the gpt's bf16 attention backward took 1.35-1.46 ms a call in a step against
// 1.02-1.28 on the same rows already in cache (attention_bench); the prefetch took 9-17% off it in
// the step (docs/hosts.md).
template <class E>
MIXPREC_ATTN_TARGET void transpose(const E* src, int64_t ld_src, int64_t rows, int64_t cols, E* dst, int64_t ld_dst) {
  static_assert(std::is_same_v<E, float> || kBf16Tile<E>);
  if constexpr (kBf16Tile<E>) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    auto* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
      for (int64_t i = r0 + 32; i < std::min<int64_t>(rows, r0 + 64); ++i)  // the next 32 rows, as below
        for (int64_t b = 0; b < std::min<int64_t>(cols * 2, 256); b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(s + i * ld_src) + b, _MM_HINT_T0);
      for (int64_t c0 = 0; c0 < cols; c0 += 32)
        transpose_32x32_16bit(s + r0 * ld_src + c0, ld_src, std::min<int64_t>(32, rows - r0),
                              std::min<int64_t>(32, cols - c0), d + c0 * ld_dst + r0, ld_dst);
    }
  } else {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        if (c0 == 0)  // the next 16 rows (their first 256 bytes), fetched while this block moves
          for (int64_t i = r0 + 16; i < std::min<int64_t>(rows, r0 + 32); ++i)
            for (int64_t b = 0; b < std::min<int64_t>(cols * 4, 256); b += 64)
              _mm_prefetch(reinterpret_cast<const char*>(src + i * ld_src) + b, _MM_HINT_T0);
        transpose_16x16_32bit(src + r0 * ld_src + c0, ld_src, std::min<int64_t>(16, rows - r0),
                              std::min<int64_t>(16, cols - c0), dst + c0 * ld_dst + r0, ld_dst);
      }
  }
}

// B operand of the product, packed as [k_pad / kPair][n_pad][kPair]: from src = B itself (k rows
// of n elements, row stride ld; rows k .. k_pad are zeros) ...
template <class E>
MIXPREC_ATTN_TARGET void pack_b(const E* src, int64_t ld, int64_t k, int64_t k_pad, int64_t n, int64_t n_pad, E* dst) {
  constexpr int64_t P = kPair<E>;
  if constexpr (P == 1) {  // f32: the rows themselves, zero-padded
    for (int64_t r = 0; r < k_pad; ++r) {
      E* d = dst + r * n_pad;
      const int64_t len = r < k ? n : 0;
      if (len) std::memcpy(d, src + r * ld, size_t(len) * sizeof(E));
      std::fill(d + len, d + n_pad, E{});
    }
  } else {  // bf16: rows r and r + 1 interleaved, 16 columns at a time (zeros past k and n)
    for (int64_t r = 0; r < k_pad; r += 2) {
      const auto* a = r < k ? reinterpret_cast<const uint16_t*>(src + r * ld) : nullptr;
      const auto* b = r + 1 < k ? a + ld : nullptr;
      auto* d = reinterpret_cast<uint16_t*>(dst + r * n_pad);
      for (int64_t c = 0; c < n_pad; c += 16) {
        const __mmask16 in = first_lanes(n - c);
        const __m256i x = a ? _mm256_maskz_loadu_epi16(in, a + c) : _mm256_setzero_si256();
        const __m256i y = b ? _mm256_maskz_loadu_epi16(in, b + c) : _mm256_setzero_si256();
        store_interleaved(x, y, d + 2 * c);
      }
    }
  }
}
// ... or from src = B^T (n rows of k elements, row stride ld; k a multiple of kPair).
template <class E>
MIXPREC_ATTN_TARGET void pack_bt(const E* src, int64_t ld, int64_t k, int64_t n, int64_t n_pad, E* dst) {
  constexpr int64_t P = kPair<E>;
  if constexpr (P == 1) {  // f32: B itself, transposed in blocks, zero-padded
    transpose(src, ld, n, k, dst, n_pad);
    for (int64_t r = 0; r < k; ++r) std::fill(dst + r * n_pad + n, dst + (r + 1) * n_pad, E{});
  } else if (ld % 2) {  // bf16 rows of odd stride: element by element
    for (int64_t r = 0; r < k; r += P)
      for (int64_t c = 0; c < n_pad; ++c)
        for (int64_t h = 0; h < P; ++h) dst[(r / P) * n_pad * P + c * P + h] = c < n ? src[c * ld + r + h] : E{};
  } else {  // bf16: a pair of B's rows is one 32-bit word of a row of B^T, so the words transpose
    const auto* words = reinterpret_cast<const float*>(src);
    auto* out = reinterpret_cast<float*>(dst);
    transpose(words, ld / 2, n, k / 2, out, n_pad);
    for (int64_t r = 0; r < k / 2; ++r) std::fill(out + r * n_pad + n, out + (r + 1) * n_pad, 0.f);
  }
}

// C[MR x 16 NV] (+)= A[MR x k] B: the accumulators stay in registers across the contraction.
// Every loop over MR and NV is unrolled before GCC's scalar replacement of the accumulator array:
// without the pragmas it built acc in a stack array and moved it to and from registers around
// the contraction (48 extra loads and stores a call of micro<4, 4>, where the gpt's k = 32 makes
// 256 dot products; docs/hosts.md, 2026-12-07, seventh session).
template <class E, int MR, int NV>
MIXPREC_ATTN_TARGET void micro(const E* a, int64_t lda, const E* b, int64_t n_pad, int64_t k, float* c, int64_t ldc,
                               bool accumulate) {
  constexpr int64_t P = kPair<E>;
  __m512 acc[MR][NV];
  if (accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(c + r * ldc + 16 * v);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k / P; ++p) {
    const E* bp = b + p * n_pad * P;
    if constexpr (kBf16Tile<E>) {
      __m512i bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(bp + 32 * v);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        int32_t pair;
        std::memcpy(&pair, a + r * lda + 2 * p, 4);
        const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = dot_pairs<E>(acc[r][v], av, bv[v]);
      }
    } else {
      __m512 bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(bp + 16 * v);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

template <class E>
using MicroFn = void (*)(const E*, int64_t, const E*, int64_t, int64_t, float*, int64_t, bool);

template <class E, int NV, int... MR>
constexpr std::array<MicroFn<E>, sizeof...(MR)> micro_table(std::integer_sequence<int, MR...>) {
  return {&micro<E, MR + 1, NV>...};
}

// The part of a causal score block a product needs: element (i, j) of the block (query row i, key
// column j, both relative to the block) is live where j <= i + diag, and zero in P and dS elsewhere.
// A product over a block the diagonal crosses skips what only non-live elements would give:
//   scores:   C = scores (rows: queries, columns: keys): each row block's columns end after its last
//             row's last live key (the rest of C is not written);
//   k_end:    the contraction runs over keys (P V, dS K): each row block's ends there too;
//   k_begin:  C's columns are keys and the contraction runs over queries (dO^T P, Q^T dS): each
//             32-column chunk's contraction begins at the first query that sees its first key.
struct Live {
  enum Kind { all, scores, k_end, k_begin } kind = all;
  int64_t diag = 0;
};

// Whether bf16 tiles multiply on AMX (cpu/attention_amx.cpp): where the host has AMX-BF16 (and
// the OS gave the process the tile state), unless MIXPREC_ATTENTION_AMX=off; set_amx_products
// switches it (tests: the vector kernels on the same host).
bool amx_products();
void set_amx_products(bool on);
// While one lives (and `use` and amx_products() say so), this thread's AMX tiles stay configured
// for amx_gemm and amx_row_dots, which otherwise load the configuration, and release the tiles, in
// each call (LDTILECFG took a seventh of amx_gemm's time in the gpt's attention). Nothing else
// may run AMX code on the thread meanwhile: oneDNN's AMX kernels load their own configuration.
class AmxScope {
 public:
  explicit AmxScope(bool use);
  ~AmxScope();
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;

 private:
  bool on_;
};
// Whether a bf16 product of m rows contracting over k runs (its first m / 16 * 16 rows) on AMX:
// TDPBF16PS takes the contraction 32 at a time.
inline bool amx_shape(int64_t m, int64_t k) { return m >= 16 && k % 32 == 0 && amx_products(); }
// gemm's product on AMX for the first m / 16 * 16 rows (amx_shape), in blocks of 32 x 32; returns
// the rows done. Live blocks as gemm's, at a block's granularity: a scores block writes the
// columns up to its last row's last live key (whole 16-column tiles), a k_end one contracts up to
// it (rounded up to 32), a k_begin one from its first live query (rounded down to 32); the
// skipped contraction adds only the zeros of P and dS past the diagonal.
int64_t amx_gemm(int64_t m, int64_t n_pad, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b, float* c,
                 int64_t ldc, bool accumulate, Live live);
// dst[i] = a_i . b_i for the first rows / 16 * 16 rows (a, b: rows of k bf16, k a multiple of 32),
// summed by the same tile instructions, in the same order, as amx_gemm sums a row of a against a
// column of its B: so a dP element whose key row equals the output row gives D's bits. pack holds
// 16 k bf16, tile 256 f32.
void amx_row_dots(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t rows, int64_t k, float* dst,
                  uint16_t* pack, float* tile);

// C[m x n_pad] (+)= A[m x k] B with B from pack_b/pack_bt (n_pad a multiple of 16, k of kPair):
// column chunks of up to 64, rows in register blocks of 4 to 8 (fewer rows for wider chunks, so
// the accumulators fit the 32 vector registers); `live` as above (k_begin takes 32-column chunks).
// bf16 tiles run their first m / 16 * 16 rows on AMX where amx_shape says so.
template <class E>
void gemm(int64_t m, int64_t n_pad, int64_t k, const E* a, int64_t lda, const E* b, float* c, int64_t ldc,
          bool accumulate, Live live = {}) {
  static const std::array<std::array<MicroFn<E>, 8>, 4> table = {
      micro_table<E, 1>(std::make_integer_sequence<int, 8>()), micro_table<E, 2>(std::make_integer_sequence<int, 8>()),
      micro_table<E, 3>(std::make_integer_sequence<int, 8>()), micro_table<E, 4>(std::make_integer_sequence<int, 8>())};
  constexpr int64_t P = kPair<E>;
  if constexpr (std::is_same_v<E, uint16_t>) {
    if (amx_shape(m, k)) {
      const int64_t done = amx_gemm(m, n_pad, k, a, lda, b, c, ldc, accumulate, live);
      if (done == m) return;
      // The last rows on the vector kernels: row `done` becomes row 0, so a diagonal over rows moves.
      if (live.kind == Live::scores || live.kind == Live::k_end) live.diag += done;
      m -= done, a += done * lda, c += done * ldc;
    }
  }
  const int64_t chunk = live.kind == Live::k_begin ? 32 : 64;
  for (int64_t n0 = 0; n0 < n_pad; n0 += chunk) {
    const int64_t nv = std::min<int64_t>(chunk / 16, (n_pad - n0) / 16);
    const int64_t mr = nv == 4 ? 4 : nv == 3 ? 6 : 8;
    // k_begin: the rows of B (queries) before the first that sees key n0 add nothing.
    const int64_t k0 = live.kind == Live::k_begin ? std::clamp<int64_t>((n0 - live.diag) / P * P, 0, k) : 0;
    // The packed rows are n_pad wide: the micro-kernel steps through them with that stride.
    const E* bn = b + n0 * P + k0 * n_pad;
    for (int64_t r0 = 0; r0 < m; r0 += mr) {
      const int64_t rows = std::min(mr, m - r0);
      // One past the last live key of the block's rows (scores, k_end).
      const int64_t end = r0 + rows + live.diag;
      int64_t v = nv, kk = k - k0;
      if (live.kind == Live::scores) {
        v = std::min(nv, (round_up(std::max<int64_t>(end, 0), 16) - n0) / 16);
        if (v <= 0) continue;
      } else if (live.kind == Live::k_end) {
        kk = std::clamp<int64_t>(round_up(end, P), 0, k);
      }
      table[size_t(v - 1)][size_t(rows - 1)](a + r0 * lda + k0, lda, bn, n_pad, kk, c + r0 * ldc + n0, ldc, accumulate);
    }
  }
}

}  // namespace mixprec::kernels::cpu::attn
