// The fused CPU attention's blocks (cpu/attention.cpp describes the algorithm): a call's shapes and
// workspace, rows read in place or copied as tiles, keys packed as the products' B operands, the
// stores of finished rows; and the tiles' forward and backward over them (attention_forward.cpp,
// attention_backward.cpp), which cpu/attention.cpp dispatches to. Internal to those three files.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/vec_exp.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu::attn_blocks {

using attn::gemm;
using attn::keep_bits;
using attn::kPair;
using attn::round_up;
using attn::Rows;

constexpr int64_t kBr = 64, kBc = 64;  // queries and keys per block: a 64 x 64 f32 tile is 16 KiB (L1)

struct Dims {
  int64_t bh, tq, tk, e, ev, e_pad, ev_pad, bc_pad, nqb, nkb;
  Dims(const Tensor& q, const Tensor& v)
      : bh(q.size(0) * q.size(1)),
        tq(q.size(2)),
        tk(v.size(2)),
        e(q.size(3)),
        ev(v.size(3)),
        e_pad(round_up(e, 16)),
        ev_pad(round_up(ev, 16)),
        bc_pad(round_up(std::min(kBc, tk), 16)),
        nqb((tq + kBr - 1) / kBr),
        nkb((tk + kBc - 1) / kBc) {}
};

// The probabilities' e^x, forward and backward alike (so the backward's P is the forward's): on
// bf16 tiles exp_bf16_ps (3e-6 relative; P and dS are rounded to bf16 for their products, and the
// sums of P keep an error far under that), on f32 tiles exp_ps (f32's accuracy).
template <class E>
MIXPREC_ATTN_TARGET inline __m512 prob_exp(__m512 x) {
  if constexpr (attn::kBf16Tile<E>)
    return exp_bf16_ps(x);
  else
    return exp_ps(x);
}

// Carves one workspace tensor into 64-byte aligned arrays.
class Carver {
 public:
  explicit Carver(char* base) : at_(base) {}
  template <class T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(at_);
    at_ += round_up(n * int64_t(sizeof(T)), 64);
    return p;
  }
  char* at() const { return at_; }

 private:
  char* at_;
};
template <class T>
int64_t bytes_of(int64_t n) {
  return round_up(n * int64_t(sizeof(T)), 64);
}

inline Tensor workspace(int64_t bytes) {
  const MemoryScope scope(MemCategory::workspace);
  return Tensor::empty({bytes + 64}, DType::u8);
}
inline char* aligned(const Tensor& w) {
  const auto p = reinterpret_cast<uintptr_t>(w.data_ptr());
  return reinterpret_cast<char*>(round_up(int64_t(p), 64));
}

// The lanes of the 16 keys from j0 (relative) that are at most lim.
inline __mmask16 up_to(int64_t j0, int64_t lim) { return first_lanes(lim - j0 + 1); }

// The causal part of the block of queries from i0 against the nc keys from j0, for a product of
// the given kind (attn::Live): all of it where the block's first row already sees its last key.
inline attn::Live live_of(const AttentionParams& p, const Dims& d, int64_t i0, int64_t j0, int64_t nc,
                          attn::Live::Kind kind) {
  if (!p.causal) return {};
  const int64_t diag = i0 + std::max<int64_t>(d.tk - d.tq, 0) - j0;
  if (diag >= nc - 1) return {};
  return {kind, diag};
}

// Whether rows of x `width` wide are tiles of E as they lie: E's own dtype (f32 for f32 tiles,
// bf16 for bf16 ones), unit element stride and a width that needs no padding. Such rows are read
// in place (the products' A operands, the packing and transposes' sources) instead of copied
// into a buffer first, as the gpt's q, k and v views of the packed qkv are.
template <class E>
bool in_place(const Rows& x, int64_t width, int64_t width_pad) {
  return x.se == 1 && width == width_pad && x.t == (std::is_same_v<E, float> ? DType::f32 : DType::bf16);
}

// Rows i0 .. i0 + n of head bh as tiles of E `width_pad` wide: the rows themselves where they are
// tiles as they lie (in_place), else copies in buf ([n][width_pad], zeros past width).
template <class E>
struct TileRows {
  const E* p;
  int64_t ld;
};
template <class E>
TileRows<E> tile_rows(const Rows& x, int64_t bh, int64_t i0, int64_t n, int64_t width, int64_t width_pad, E* buf) {
  if (in_place<E>(x, width, width_pad)) return {reinterpret_cast<const E*>(x.row(bh, i0)), x.st};
  for (int64_t r = 0; r < n; ++r) attn::load_row(x.row(bh, i0 + r), x.t, x.se, width, buf + r * width_pad, width_pad);
  return {buf, width_pad};
}

// Keys j0 .. j0 + nc of head bh as the B operands: K^T ([e_pad / P][bc_pad][P], for S = Q K^T)
// and, where wanted, K ([bc_pad / P][e_pad][P], for dQ = dS K) and V or V^T.
template <class E>
void pack_keys(const Rows& src, int64_t bh, int64_t j0, int64_t nc, int64_t width, int64_t width_pad, int64_t bc_pad,
               E* tmp, E* transposed, E* plain) {
  const E* rows = tmp;
  int64_t ld = width_pad;
  if (in_place<E>(src, width, width_pad)) {
    rows = reinterpret_cast<const E*>(src.row(bh, j0));
    ld = src.st;
  } else {
    for (int64_t r = 0; r < nc; ++r)
      attn::load_row(src.row(bh, j0 + r), src.t, src.se, width, tmp + r * width_pad, width_pad);
  }
  if (transposed) attn::pack_bt(rows, ld, width_pad, nc, bc_pad, transposed);
  if (plain) attn::pack_b(rows, ld, nc, bc_pad, width_pad, width_pad, plain);
}

// dst[c][r] = src row r's element c for r < rows, and 0 for rows <= r < ld_dst: width columns of
// rows source rows (row stride ld) as the transposed operand [width][ld_dst].
template <class E>
void to_columns(const E* src, int64_t ld, int64_t rows, int64_t width, E* dst, int64_t ld_dst) {
  attn::transpose(src, ld, rows, width, dst, ld_dst);
  for (int64_t c = 0; c < width; ++c) std::fill(dst + c * ld_dst + rows, dst + (c + 1) * ld_dst, E{});
}

// rows x n f32 values (row r at src + r * ld, times factor[r] or f) -> rows i0 .. i0 + rows of
// head bh of dst (dtype t, unit-stride rows). f32 and bf16 rows are stored as they are scaled, bf16
// rounded by convert()'s rule (bf16_from_ps where the CPU has AVX512-BF16, else bf16_round_epi32: the
// scalar RNE and NaN rule, subnormals kept; then a masked 16-bit store, not VPMOVDW to memory, which
// is slow on AMD): the gpt's outputs and gradients are rows of 32 in views of stride 128 or 384, where
// a convert() call per row cost more than the row (about 10% of a layer's attention); bf16 rows 32
// elements at a time where the CPU rounds natively (one VCVTNE2PS2BF16 and one 64-byte store: the
// gpt layer's bf16 attention backward 1.13-1.15 ms against 1.17-1.18 with 16). f16 rows go through tmp
// (rows x n f32, may be src itself: n <= ld) and convert(), one call for the block where its rows
// are contiguous.
MIXPREC_ATTN_TARGET inline void store_rows(const float* src, int64_t ld, int64_t rows, int64_t n, const float* factor,
                                           float f, float* tmp, const Rows& dst, int64_t bh, int64_t i0) {
  const bool direct = dst.t == DType::f32 || dst.t == DType::bf16;
  const bool native = detail::native_bf16_rounding();
  if (dst.t == DType::bf16 && native) {
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 fr = _mm512_set1_ps(factor ? factor[r] : f);
      const float* s = src + r * ld;
      auto* out = reinterpret_cast<uint16_t*>(dst.row(bh, i0 + r));
      for (int64_t c = 0; c < n; c += 32) {
        const __mmask16 in0 = first_lanes(n - c), in1 = first_lanes(n - c - 16);
        const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(in0, s + c), fr);
        const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(in1, s + c + 16), fr);
        _mm512_mask_storeu_epi16(out + c, __mmask32(in0) | (__mmask32(in1) << 16), bf16_pair_from_ps(lo, hi));
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 fr = _mm512_set1_ps(factor ? factor[r] : f);
    char* out = direct ? dst.row(bh, i0 + r) : nullptr;
    for (int64_t c = 0; c < n; c += 16) {
      const __mmask16 in = first_lanes(n - c);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, src + r * ld + c), fr);
      if (dst.t == DType::f32)
        _mm512_mask_storeu_ps(reinterpret_cast<float*>(out) + c, in, v);
      else if (dst.t == DType::bf16)
        _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(out) + c, in, bf16_round_ps(v, native));
      else
        _mm512_mask_storeu_ps(tmp + r * n + c, in, v);
    }
  }
  if (direct) return;
  if (dst.st == n) return convert(tmp, DType::f32, dst.row(bh, i0), dst.t, size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) convert(tmp + r * n, DType::f32, dst.row(bh, i0 + r), dst.t, size_t(n));
}

// store_rows of a transposed block: src holds width rows of n values (row stride ld), value (w, c)
// times factor[c] or f going to element w of row i0 + c of head bh. Into bf16 rows of unit element
// stride where the CPU rounds natively, 32 x 32 blocks are scaled and rounded (store_rows' bits)
// into a 16-bit block in L1, then transposed 16-bit (transpose_32x32_16bit) straight into the
// destination rows: one pass of half the bytes where an f32 transpose and store_rows made two (the
// transposed forward's O^T, the backward's dK^T and dV^T: the gpt layer's bf16 attention 1.69 ms
// against 1.76, attention_bench, five alternating pairs on the AMX kind). Elsewhere src goes
// through block (n x width f32) to store_rows.
MIXPREC_ATTN_TARGET inline void store_columns(const float* src, int64_t ld, int64_t width, int64_t n,
                                              const float* factor, float f, float* block, const Rows& dst, int64_t bh,
                                              int64_t i0) {
  if (dst.t != DType::bf16 || dst.se != 1 || !detail::native_bf16_rounding()) {
    attn::transpose(src, ld, width, n, block, width);
    store_rows(block, width, n, width, factor, f, block, dst, bh, i0);
    return;
  }
  alignas(64) uint16_t blk[32 * 32];
  for (int64_t c0 = 0; c0 < n; c0 += 32) {  // 32 destination rows
    const int64_t nn = std::min<int64_t>(32, n - c0);
    const __mmask16 in0 = first_lanes(nn), in1 = first_lanes(nn - 16);
    const __m512 f0 = factor ? _mm512_maskz_loadu_ps(in0, factor + c0) : _mm512_set1_ps(f);
    const __m512 f1 = factor ? _mm512_maskz_loadu_ps(in1, factor + c0 + 16) : _mm512_set1_ps(f);
    auto* out = reinterpret_cast<uint16_t*>(dst.row(bh, i0 + c0));
    for (int64_t w0 = 0; w0 < width; w0 += 32) {  // 32 of their elements
      const int64_t ww = std::min<int64_t>(32, width - w0);
      for (int64_t r = 0; r < ww; ++r) {
        const float* s = src + (w0 + r) * ld + c0;
        const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(in0, s), f0);
        const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(in1, s + 16), f1);
        _mm512_store_si512(blk + r * 32, bf16_pair_from_ps(lo, hi));
      }
      transpose_32x32_16bit(blk, 32, ww, nn, out + w0, dst.st);
    }
  }
}

// The tiles' forward with the scores in rows (f32 and bf16 tiles), with them transposed (bf16 tiles
// on AMX: a query's softmax down a column of S^T), and the backward: attention_forward.cpp,
// attention_backward.cpp, instantiated for float, uint16_t (bf16) and attn::EmulatedBf16 tiles.
template <class E>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, AttentionForward& dst);
template <class E>
void forward_transposed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                        AttentionForward& dst);
template <class E>
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd, const Tensor& grad_out,
              const AttentionParams& p, AttentionGrads& dst);

}  // namespace mixprec::kernels::cpu::attn_blocks
