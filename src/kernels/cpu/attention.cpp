// Fused CPU attention, FlashAttention's way: blocks of 64 queries against blocks of 64 keys, an
// online softmax in f32, key blocks past the causal diagonal skipped, and only the output and the
// log-sum-exp [B, H, Tq] kept; the backward (FlashAttention-2's) recomputes each block's
// probabilities from the log-sum-exp, so no [Tq, Tk] matrix is ever stored. bf16 inputs multiply
// on bf16 pairs with f32 accumulation where bf16 computes natively (AVX512-BF16; the probabilities
// and dS are rounded to bf16 before their products, as FlashAttention does; tiles_for says where);
// f32 and f16 inputs, and bf16 elsewhere, compute in f32 with FMA (converted on load: no 16-bit
// arithmetic here). Dropout's keep bits come from the same Philox words
// as the reference's (attention.h), recomputed by the backward. Where bf16 products run on AMX
// the forward (without dropout) transposes its scores instead (forward_transposed): a query's
// softmax runs down a column of S^T, 16 queries to a vector. OpenMP over (batch x head, query
// block) forward and over batch x head backward (each task owns its dK, dV and dQ).
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "core/profile_detail.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/vec_exp.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

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

Tensor workspace(int64_t bytes) {
  const MemoryScope scope(MemCategory::workspace);
  return Tensor::empty({bytes + 64}, DType::u8);
}
char* aligned(const Tensor& w) {
  const auto p = reinterpret_cast<uintptr_t>(w.data_ptr());
  return reinterpret_cast<char*>(round_up(int64_t(p), 64));
}

// The lanes of the 16 keys from j0 (relative) that are at most lim.
inline __mmask16 up_to(int64_t j0, int64_t lim) { return first_lanes(lim - j0 + 1); }

// The causal part of the block of queries from i0 against the nc keys from j0, for a product of
// the given kind (attn::Live): all of it where the block's first row already sees its last key.
attn::Live live_of(const AttentionParams& p, const Dims& d, int64_t i0, int64_t j0, int64_t nc, attn::Live::Kind kind) {
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

// Row i's softmax step over one key block (FlashAttention's online softmax): s holds the raw
// scores; on return it holds the probabilities relative to the new running max (dropped ones
// zero), and m, l, the output row o are rescaled.
MIXPREC_ATTN_TARGET void online_softmax_row(float* s, int64_t bc_pad, int64_t lim, float scale, float& m, float& l,
                                            float* o, int64_t ev_pad, const AttentionParams& p, int64_t bh, int64_t i,
                                            int64_t j0, int64_t tq, int64_t tk) {
  const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
  // Chunks past the one holding key lim are masked whole: never read (the product may not have
  // written them), zero in P.
  const int64_t live_end = round_up(lim + 1, 16);
  __m512 vmax = ninf;
  for (int64_t c = 0; c < live_end; c += 16) {
    const __m512 x = _mm512_mask_mov_ps(ninf, up_to(c, lim), _mm512_mul_ps(_mm512_loadu_ps(s + c), vscale));
    _mm512_storeu_ps(s + c, x);
    vmax = _mm512_max_ps(vmax, x);
  }
  const float m_new = std::max(m, _mm512_reduce_max_ps(vmax));
  const float alpha = std::exp(m - m_new);  // 0 for the first block (m = -inf)
  const __m512 vm = _mm512_set1_ps(m_new);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t c = 0; c < live_end; c += 16) {
    const __mmask16 in = up_to(c, lim);
    __m512 e = _mm512_maskz_mov_ps(in, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm)));
    vsum = _mm512_add_ps(vsum, e);
    if (p.dropout > 0.0 && in) e = _mm512_maskz_mov_ps(__mmask16(keep_bits(p, bh, i, j0 + c, tq, tk)), e);
    _mm512_storeu_ps(s + c, e);
  }
  std::fill(s + live_end, s + bc_pad, 0.f);
  l = l * alpha + _mm512_reduce_add_ps(vsum);
  m = m_new;
  if (alpha != 1.f) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t c = 0; c < ev_pad; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), va));
  }
}

// rows x n f32 values (row r at src + r * ld, times factor[r] or f) -> rows i0 .. i0 + rows of
// head bh of dst (dtype t, unit-stride rows). f32 and bf16 rows are stored as they are scaled, bf16
// rounded by convert()'s rule (bf16_from_ps where the CPU has AVX512-BF16, else bf16_round_epi32: the
// scalar RNE and NaN rule, subnormals kept; then a masked 16-bit store, not VPMOVDW to memory, which
// is slow on AMD): the gpt's outputs and gradients are rows of 32 in views of stride 128 or 384, where
// a convert() call per row cost more than the row (about 10% of a layer's attention). f16 rows go through tmp
// (rows x n f32, may be src itself: n <= ld) and convert(), one call for the block where its rows
// are contiguous.
MIXPREC_ATTN_TARGET void store_rows(const float* src, int64_t ld, int64_t rows, int64_t n, const float* factor, float f,
                                    float* tmp, const Rows& dst, int64_t bh, int64_t i0) {
  const bool direct = dst.t == DType::f32 || dst.t == DType::bf16;
  const bool native = detail::native_bf16_rounding();
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

template <class E>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, AttentionForward& dst) {
  const Dims d(q, v);
  const Rows rq(q), rk(k), rv(v);
  constexpr int64_t P = kPair<E>;
  const int64_t kv_elems = d.e_pad * d.bc_pad + d.bc_pad * d.ev_pad;  // one packed key block
  const int64_t threads = omp_get_max_threads();
  const int64_t tmp_bytes = bytes_of<E>(d.bc_pad * std::max(d.e_pad, d.ev_pad));
  const int64_t per_thread = bytes_of<E>(kBr * d.e_pad) + bytes_of<float>(kBr * d.bc_pad) +
                             bytes_of<E>(kBr * d.bc_pad) + bytes_of<float>(kBr * d.ev_pad) + 2 * bytes_of<float>(kBr) +
                             bytes_of<float>(kBr * d.ev) + tmp_bytes;
  const Tensor ws = workspace(bytes_of<E>(d.bh * d.nkb * kv_elems) + threads * per_thread);
  E* packs = reinterpret_cast<E*>(aligned(ws));
  char* scratch = aligned(ws) + bytes_of<E>(d.bh * d.nkb * kv_elems);
  const float scale = float(p.scale), keep_scale = float(1.0 / (1.0 - p.dropout));
  const Rows rout(dst.out);
  float* lse = static_cast<float*>(dst.lse.data_ptr());

  // One parallel region for both passes (each region first wakes the other threads: 60-80 us under
  // OMP_WAIT_POLICY=passive, docs/design.md, Threads); the first loop's barrier orders them.
#pragma omp parallel
  {
    const attn::AmxScope amx(std::is_same_v<E, uint16_t>);  // the tiles configured once a thread
    // K^T and V of every key block, packed once for all the query blocks that read them.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.bh * d.nkb; ++task) {
      // The thread's last array (see the main loop's carving): the rows being packed.
      E* tmp = reinterpret_cast<E*>(scratch + (omp_get_thread_num() + 1) * per_thread - tmp_bytes);
      const int64_t bh = task / d.nkb, j0 = (task % d.nkb) * kBc, nc = std::min(kBc, d.tk - j0);
      E* kt = packs + task * kv_elems;
      pack_keys<E>(rk, bh, j0, nc, d.e, d.e_pad, d.bc_pad, tmp, kt, nullptr);
      pack_keys<E>(rv, bh, j0, nc, d.ev, d.ev_pad, d.bc_pad, tmp, nullptr, kt + d.e_pad * d.bc_pad);
    }

    // Static, as forward_transposed's (the gpt's bf16 forward calls in rows took 4.9-5.1 ms a step
    // against 5.4-5.5 with a dynamic schedule, its f32 ones 7.0-7.2 against 7.9-8.0).
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.bh * d.nqb; ++task) {
      Carver c(scratch + omp_get_thread_num() * per_thread);
      E* qt = c.take<E>(kBr * d.e_pad);
      float* s = c.take<float>(kBr * d.bc_pad);
      E* pt = c.take<E>(kBr * d.bc_pad);
      float* o = c.take<float>(kBr * d.ev_pad);
      float* m = c.take<float>(kBr);
      float* l = c.take<float>(kBr);
      float* block = c.take<float>(kBr * d.ev);
      const int64_t bh = task / d.nqb, i0 = (task % d.nqb) * kBr, nr = std::min(kBr, d.tq - i0);
      const E* qa = qt;  // the block's query rows: S's A operand
      int64_t lda = d.e_pad;
      if (in_place<E>(rq, d.e, d.e_pad)) {
        qa = reinterpret_cast<const E*>(rq.row(bh, i0));
        lda = rq.st;
      } else {
        for (int64_t r = 0; r < nr; ++r)
          attn::load_row(rq.row(bh, i0 + r), rq.t, rq.se, d.e, qt + r * d.e_pad, d.e_pad);
      }
      std::fill(m, m + nr, -INFINITY);
      std::fill(l, l + nr, 0.f);
      std::fill(o, o + nr * d.ev_pad, 0.f);
      // Key blocks past the last row's last key are masked for every row: skipped.
      const int64_t nkb = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) / kBc + 1;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBc, nc = std::min(kBc, d.tk - j0);
        const E* kt = packs + (bh * d.nkb + kb) * kv_elems;
        gemm<E>(nr, d.bc_pad, d.e_pad, qa, lda, kt, s, d.bc_pad, false, live_of(p, d, i0, j0, nc, attn::Live::scores));
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t lim = std::min(attention_last_key(p, i0 + r, d.tq, d.tk), j0 + nc - 1) - j0;
          float* sr = s + r * d.bc_pad;
          if (lim < 0)
            std::fill(sr, sr + d.bc_pad, 0.f);
          else
            online_softmax_row(sr, d.bc_pad, lim, scale, m[r], l[r], o + r * d.ev_pad, d.ev_pad, p, bh, i0 + r, j0,
                               d.tq, d.tk);
          if constexpr (P == 2) attn::to_tile(sr, pt + r * d.bc_pad, d.bc_pad);
        }
        // P's rows, rounded to bf16 for a bf16 tile; an f32 tile's are the scores' buffer itself.
        const E* pa = reinterpret_cast<const E*>(s);
        if constexpr (P == 2) pa = pt;
        gemm<E>(nr, d.ev_pad, round_up(d.bc_pad, P), pa, d.bc_pad, kt + d.e_pad * d.bc_pad, o, d.ev_pad, true,
                live_of(p, d, i0, j0, nc, attn::Live::k_end));
      }
      for (int64_t r = 0; r < nr; ++r) {
        lse[bh * d.tq + i0 + r] = m[r] + std::log(l[r]);
        l[r] = keep_scale / l[r];
      }
      store_rows(o, d.ev_pad, nr, d.ev, l, 0.f, block, rout, bh, i0);
    }
  }
}

// The lanes (queries) that see key j: j at most their last key.
MIXPREC_ATTN_TARGET inline __mmask16 sees(int64_t j, __m512i last) {
  return _mm512_cmp_epi32_mask(_mm512_set1_epi32(int32_t(j)), last, _MM_CMPINT_LE);
}
// P's 16 lanes of key row j of S^T (zero past nc): e^(scale s - max) of the live scores only. A
// masked one's e^-inf, as every result below the normal range, takes a microcode assist (perf
// put 30% of this pass's samples on the instruction after VSCALEFPS when every lane took e^x).
MIXPREC_ATTN_TARGET inline __m512 prob_row(const float* row, int64_t j, int64_t nc, __m512i last, __m512 vscale,
                                           __m512 vmax) {
  if (j >= nc) return _mm512_setzero_ps();
  const __mmask16 in = sees(j, last);
  return _mm512_maskz_mov_ps(in, exp_ps(_mm512_maskz_sub_ps(in, _mm512_mul_ps(_mm512_loadu_ps(row), vscale), vmax)));
}

// One block's online softmax down the columns of S^T (nc key rows of nq_pad queries; lim: each
// query's last key in the block): m, l and the columns of O^T (ev rows) rescaled where `rescale`,
// P^T's rows written as O^T's B operand (pairs of key rows interleaved, zeros from nc to n32).
template <class E>
MIXPREC_ATTN_TARGET void softmax_columns(const float* st, int64_t nq_pad, int64_t nc, int64_t n32, const int32_t* lim,
                                         float scale, float* m, float* l, float* ot, int64_t ev, bool rescale,
                                         E* pairs) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t c = 0; c < nq_pad; c += 16) {
    const __m512i last = _mm512_loadu_si512(lim + c);
    const __m512 m_old = _mm512_loadu_ps(m + c);
    // Four running maxima (a max is exact: any order gives the same), so the chain of VMAXPS
    // latencies is a quarter as long.
    __m512 mx[4] = {m_old, m_old, m_old, m_old};
    int64_t j = 0;
    for (; j + 4 <= nc; j += 4)
      for (int u = 0; u < 4; ++u)
        mx[u] = _mm512_mask_max_ps(mx[u], sees(j + u, last), mx[u],
                                   _mm512_mul_ps(_mm512_loadu_ps(st + (j + u) * nq_pad + c), vscale));
    for (; j < nc; ++j)
      mx[0] =
          _mm512_mask_max_ps(mx[0], sees(j, last), mx[0], _mm512_mul_ps(_mm512_loadu_ps(st + j * nq_pad + c), vscale));
    const __m512 vmax = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
    __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();  // the sums of the even and odd keys
    for (j = 0; j < n32; j += 2) {
      const __m512 p0 = prob_row(st + j * nq_pad + c, j, nc, last, vscale, vmax);
      const __m512 p1 = prob_row(st + (j + 1) * nq_pad + c, j + 1, nc, last, vscale, vmax);
      even = _mm512_add_ps(even, p0);
      odd = _mm512_add_ps(odd, p1);
      attn::store_interleaved(attn::round_bf16<E>(p0), attn::round_bf16<E>(p1), pairs + j * nq_pad + 2 * c);
    }
    const __m512 vsum = _mm512_add_ps(even, odd);
    // The first block has no O or l to rescale (and m = -inf: e^-inf would take the assist too).
    const __m512 alpha = rescale ? exp_ps(_mm512_sub_ps(m_old, vmax)) : _mm512_setzero_ps();
    _mm512_storeu_ps(l + c, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + c), alpha), vsum));
    _mm512_storeu_ps(m + c, vmax);
    if (rescale)
      for (int64_t r = 0; r < ev; ++r)
        _mm512_storeu_ps(ot + r * nq_pad + c, _mm512_mul_ps(_mm512_loadu_ps(ot + r * nq_pad + c), alpha));
  }
}

// Keys per block of the transposed forward: a query block's whole S^T up to here (512 x 64 f32,
// 128 KiB, in L2) is one product and one softmax, so a head of up to 512 keys needs no online
// rescaling of O and one O^T product without accumulation (on the gpt's 128 keys no faster than
// 64-key blocks, attention_bench: it saves passes, not time, there).
constexpr int64_t kTc = 512;

// The bf16 tiles' forward with the scores transposed (transposed_scores says where): each key
// block's S^T = K Q^T ([keys][queries]: K's rows are the A operand in place, the query block's Q^T
// the packed B one), so a query's softmax runs down a column, 16 queries to a vector: the running
// max, the sum and the rescaling of O are vertical operations on 16 queries at once, where the
// row form pays two horizontal reductions, a scalar exp and a call for each 64-key row (the row
// form's online_softmax_row had 40% of the gpt layer's bf16 forward on AMX). P^T comes out of the
// exponentials already as the bf16 pairs of O^T = V^T P^T's B operand, and O^T is transposed once
// at the end. The same products (each score the dot of the same pairs in the same order), the same
// exponentials, the same roundings of P to bf16 as the row form; the sums l add the even and the
// odd keys apart (the row form adds 16 lanes, then across them), so O may differ from it in the
// last bit. No
// dropout (its keep bits come in 16-key words of one query row): that takes the row form.
template <class E>
void forward_transposed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                        AttentionForward& dst) {
  static_assert(attn::kBf16Tile<E>);
  const Dims d(q, v);
  const Rows rq(q), rk(k), rv(v);
  const int64_t tc = std::min(kTc, d.tk), ntb = (d.tk + tc - 1) / tc, tc32 = round_up(tc, 32);
  const bool k_in_place = in_place<E>(rk, d.e, d.e_pad);
  // One key block, shared by the query blocks that read it: its K rows (S^T's A operand) where they
  // are not tiles as they lie, and V^T ([ev_pad][tc32], O^T's A operand).
  const int64_t k_elems = k_in_place ? 0 : tc * d.e_pad, kv_elems = k_elems + d.ev_pad * tc32;
  const int64_t threads = omp_get_max_threads();
  const int64_t tmp_bytes = bytes_of<E>(std::max(kBr, tc) * std::max(d.e_pad, d.ev_pad));
  const int64_t per_thread = bytes_of<E>(d.e_pad * kBr) + bytes_of<float>(tc * kBr) + bytes_of<E>(tc32 * kBr) +
                             bytes_of<float>(d.ev_pad * kBr) + 3 * bytes_of<float>(kBr) + bytes_of<int32_t>(kBr) +
                             bytes_of<float>(kBr * d.ev) + tmp_bytes;
  const Tensor ws = workspace(bytes_of<E>(d.bh * ntb * kv_elems) + threads * per_thread);
  E* packs = reinterpret_cast<E*>(aligned(ws));
  char* scratch = aligned(ws) + bytes_of<E>(d.bh * ntb * kv_elems);
  const float scale = float(p.scale);
  const Rows rout(dst.out);
  float* lse = static_cast<float*>(dst.lse.data_ptr());
  const int64_t shift = std::max<int64_t>(d.tk - d.tq, 0);  // causal: query i sees keys up to i + shift

#pragma omp parallel
  {
    const attn::AmxScope amx(std::is_same_v<E, uint16_t>);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.bh * ntb; ++task) {
      E* tmp = reinterpret_cast<E*>(scratch + (omp_get_thread_num() + 1) * per_thread - tmp_bytes);
      const int64_t bh = task / ntb, j0 = (task % ntb) * tc, nc = std::min(tc, d.tk - j0);
      E* kr = packs + task * kv_elems;
      if (!k_in_place)
        for (int64_t r = 0; r < nc; ++r)
          attn::load_row(rk.row(bh, j0 + r), rk.t, rk.se, d.e, kr + r * d.e_pad, d.e_pad);
      const TileRows<E> vrows = tile_rows(rv, bh, j0, nc, d.ev, d.ev_pad, tmp);
      to_columns(vrows.p, vrows.ld, nc, d.ev_pad, kr + k_elems, tc32);
    }

    // Static: a thread's tasks are consecutive, so a head's query blocks, and the heads of the same
    // tokens, share its caches (the gpt's forward calls took 3.9-4.1 ms a step against 4.4-4.6
    // with a dynamic schedule, four alternating pairs).
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.bh * d.nqb; ++task) {
      Carver c(scratch + omp_get_thread_num() * per_thread);
      E* qt = c.take<E>(d.e_pad * kBr);           // Q^T: S^T's B operand, [e_pad / 2][nq_pad][2]
      float* st = c.take<float>(tc * kBr);        // S^T, [keys][nq_pad]
      E* pairs = c.take<E>(tc32 * kBr);           // P^T: O^T's B operand, [keys / 2][nq_pad][2]
      float* ot = c.take<float>(d.ev_pad * kBr);  // O^T, [ev][nq_pad]
      float* m = c.take<float>(kBr);
      float* l = c.take<float>(kBr);
      float* factor = c.take<float>(kBr);
      int32_t* lim = c.take<int32_t>(kBr);
      float* block = c.take<float>(kBr * d.ev);
      E* tmp = reinterpret_cast<E*>(c.at());
      const int64_t bh = task / d.nqb, i0 = (task % d.nqb) * kBr, nr = std::min(kBr, d.tq - i0);
      const int64_t nq_pad = round_up(nr, 16);
      const TileRows<E> qrows = tile_rows(rq, bh, i0, nr, d.e, d.e_pad, tmp);
      attn::pack_bt(qrows.p, qrows.ld, d.e_pad, nr, nq_pad, qt);
      std::fill(m, m + nq_pad, -INFINITY);
      std::fill(l, l + nq_pad, 0.f);
      // Keys past the block's last row's last key are masked for every row: not computed.
      const int64_t end = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) + 1;
      for (int64_t tb = 0; tb * tc < end; ++tb) {
        const int64_t j0 = tb * tc, nc = std::min(tc, end - j0), n32 = round_up(nc, 32);
        // Each query's last key in the block, relative to j0 (negative: none; the padded queries
        // past tq see all).
        for (int64_t x = 0; x < nq_pad; ++x) {
          const int64_t i = i0 + x;
          const int64_t key = !p.causal || i >= d.tq ? d.tk - 1 : std::min(i + shift, d.tk - 1);
          lim[x] = int32_t(std::min(key, j0 + nc - 1) - j0);
        }
        const E* kt = packs + (bh * ntb + tb) * kv_elems;
        const E* ka = kt;
        int64_t ldk = d.e_pad;
        if (k_in_place) {
          ka = reinterpret_cast<const E*>(rk.row(bh, j0));
          ldk = rk.st;
        }
        gemm<E>(nc, nq_pad, d.e_pad, ka, ldk, qt, st, nq_pad, false);
        softmax_columns<E>(st, nq_pad, nc, n32, lim, scale, m, l, ot, d.ev, tb > 0, pairs);
        gemm<E>(d.ev, nq_pad, n32, kt + k_elems, tc32, pairs, ot, nq_pad, tb > 0);
      }
      for (int64_t r = 0; r < nr; ++r) {
        lse[bh * d.tq + i0 + r] = m[r] + std::log(l[r]);
        factor[r] = 1.f / l[r];
      }
      attn::transpose(ot, nq_pad, d.ev, nr, block, d.ev);
      store_rows(block, d.ev, nr, d.ev, factor, 0.f, block, rout, bh, i0);
    }
  }
}

// 16 tile elements from p as f32 lanes (bf16 bits widened).
template <class E>
MIXPREC_ATTN_TARGET inline __m512 f32_lanes(const E* p) {
  if constexpr (std::is_same_v<E, float>)
    return _mm512_loadu_ps(p);
  else
    return bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// D_i = dO_i . O_i for i < n, 16 rows at a time from dO^T and O^T ([k][ld] tiles), computed as the
// product kernel computes dP_ij = dO_i . V_j: on f32 tiles one fused multiply-add per element in
// order from zero; on bf16 ones per pair of elements the odd one's product first, then the even
// one's (VDPBF16PS's order; a bf16 product is exact in f32). So where O_i is V_j (a single key),
// dP - D, and with it dS, is exactly zero instead of the difference of two roundings.
template <class E>
MIXPREC_ATTN_TARGET void dot_columns(const E* a_t, const E* b_t, int64_t ld, int64_t k, int64_t n, float* dst) {
  constexpr int64_t P = kPair<E>;
  for (int64_t i = 0; i < n; i += 16) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t e = 0; e < k; e += P)
      for (int64_t h = P - 1; h >= 0; --h)
        acc = _mm512_fmadd_ps(f32_lanes(a_t + (e + h) * ld + i), f32_lanes(b_t + (e + h) * ld + i), acc);
    _mm512_mask_storeu_ps(dst + i, first_lanes(n - i), acc);
  }
}

// One query row of the backward's two elementwise results, chunk by chunk: P after dropout and
// dS = P (dP - D), zero past the row's last live key (and for a row past nr). backward_rows and
// backward_pairs both compute them here, so their values are the same bits.
struct RowOfDs {
  const float *s, *dp;
  int64_t i, lim;  // lim < 0: no live key (or no row)
  float lse, dsum;
};
RowOfDs row_of_ds(const float* s, const float* dp, int64_t r, int64_t nr, int64_t bc_pad, const Dims& d, int64_t bh,
                  int64_t i0, int64_t j0, int64_t nc, const float* lse, const float* dsum, const AttentionParams& p) {
  if (r >= nr) return RowOfDs{s, dp, 0, -1, 0.f, 0.f};
  const int64_t i = i0 + r;
  return RowOfDs{
      s + r * bc_pad,     dp + r * bc_pad, i, std::min(attention_last_key(p, i, d.tq, d.tk), j0 + nc - 1) - j0,
      lse[bh * d.tq + i], dsum[i]};
}
struct RowChunk {
  __m512 p, ds;
};
MIXPREC_ATTN_TARGET inline RowChunk row_chunk(const RowOfDs& w, int64_t c, int64_t bh, int64_t j0, const Dims& d,
                                              __m512 vscale, const AttentionParams& p) {
  if (c > w.lim) return {_mm512_setzero_ps(), _mm512_setzero_ps()};
  const __mmask16 in = up_to(c, w.lim);
  const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w.s + c), vscale);
  const __m512 pr = _mm512_maskz_mov_ps(in, exp_ps(_mm512_sub_ps(x, _mm512_set1_ps(w.lse))));
  __m512 pd = pr, dpv = _mm512_loadu_ps(w.dp + c);
  if (p.dropout > 0.0) {
    const __m512 vkeep = _mm512_set1_ps(float(1.0 / (1.0 - p.dropout)));
    const __mmask16 keep = in ? __mmask16(keep_bits(p, bh, w.i, j0 + c, d.tq, d.tk)) : __mmask16(0);
    pd = _mm512_maskz_mul_ps(keep, pr, vkeep);
    dpv = _mm512_maskz_mul_ps(keep, dpv, vkeep);
  }
  return {pd, _mm512_mul_ps(pr, _mm512_sub_ps(dpv, _mm512_set1_ps(w.dsum)))};
}

// One query block's probabilities and dS against one key block, in place: s (raw scores) becomes
// P after dropout (the dV product's operand), dp (dO V^T) becomes dS = P (dP - D).
MIXPREC_ATTN_TARGET void backward_rows(float* s, float* dp, int64_t nr, int64_t bc_pad, const Dims& d, int64_t bh,
                                       int64_t i0, int64_t j0, int64_t nc, const float* lse, const float* dsum,
                                       const AttentionParams& p) {
  const __m512 vscale = _mm512_set1_ps(float(p.scale));
  for (int64_t r = 0; r < nr; ++r) {
    const RowOfDs w = row_of_ds(s, dp, r, nr, bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
    for (int64_t c = 0; c < bc_pad; c += 16) {
      const RowChunk x = row_chunk(w, c, bh, j0, d, vscale, p);  // reads the chunk before it is stored
      _mm512_storeu_ps(s + r * bc_pad + c, x.p);
      _mm512_storeu_ps(dp + r * bc_pad + c, x.ds);
    }
  }
}

// backward_rows for bf16 tiles, two query rows at a time, stored straight into the operands the
// products read, each element rounded once to bf16 (to nearest even): P and dS as pairs of rows
// interleaved (the B operands of dV^T and dK^T, [nr_pad / 2][bc_pad][2], an odd last row paired
// with zeros) and dS's rows (dQ's A operand): row_chunk's values, as backward_rows stores them,
// rounded as pack_row_pairs and to_tile round them, in one pass where those took three more (7% of a gpt layer's bf16
// attention on AMX). With each row's constants taken once for its chunks, the gpt layer's
// backward on AMX took 1.58-1.60 ms against 1.73-1.82 (attention_bench).
template <class E>
MIXPREC_ATTN_TARGET void backward_pairs(const float* s, const float* dp, int64_t nr, int64_t bc_pad, const Dims& d,
                                        int64_t bh, int64_t i0, int64_t j0, int64_t nc, const float* lse,
                                        const float* dsum, const AttentionParams& p, E* p_pairs, E* ds_pairs,
                                        E* ds_rows) {
  const __m512 vscale = _mm512_set1_ps(float(p.scale));
  for (int64_t r = 0; r < nr; r += 2) {  // each row's constants once for its chunks
    const RowOfDs w0 = row_of_ds(s, dp, r, nr, bc_pad, d, bh, i0, j0, nc, lse, dsum, p),
                  w1 = row_of_ds(s, dp, r + 1, nr, bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
    for (int64_t c = 0; c < bc_pad; c += 16) {
      const RowChunk a = row_chunk(w0, c, bh, j0, d, vscale, p);
      const RowChunk b = row_chunk(w1, c, bh, j0, d, vscale, p);
      attn::store_interleaved(attn::round_bf16<E>(a.p), attn::round_bf16<E>(b.p), p_pairs + r * bc_pad + 2 * c);
      const __m256i ds0 = attn::round_bf16<E>(a.ds), ds1 = attn::round_bf16<E>(b.ds);
      attn::store_interleaved(ds0, ds1, ds_pairs + r * bc_pad + 2 * c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_rows + r * bc_pad + c), ds0);
      if (r + 1 < nr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_rows + (r + 1) * bc_pad + c), ds1);
    }
  }
}

template <class E>
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd, const Tensor& grad_out,
              const AttentionParams& p, AttentionGrads& dst) {
  const Dims d(q, v);
  const Rows rq(q), rk(k), rv(v), rgo(grad_out), ro(fwd.out);
  constexpr bool kBf16 = attn::kBf16Tile<E>;
  constexpr int64_t P = kPair<E>;
  const int64_t tq_pad = d.nqb * kBr, tk_pad = d.nkb * d.bc_pad, wmax = std::max(d.e_pad, d.ev_pad);
  const int64_t per_thread =
      2 * bytes_of<E>(tq_pad * d.e_pad) + 2 * bytes_of<E>(tq_pad * d.ev_pad) + 2 * bytes_of<E>(tk_pad * d.e_pad) +
      bytes_of<E>(tk_pad * d.ev_pad) + bytes_of<float>(d.tq) + bytes_of<float>(tq_pad * d.e_pad) +
      bytes_of<float>(d.bc_pad * d.e_pad) + bytes_of<float>(d.bc_pad * d.ev_pad) + 2 * bytes_of<float>(kBr * d.bc_pad) +
      3 * bytes_of<E>(kBr * d.bc_pad) + bytes_of<E>(std::max(kBr, d.bc_pad) * wmax) + bytes_of<float>(d.bc_pad * wmax) +
      2 * bytes_of<E>(tq_pad * d.ev_pad);
  const Tensor ws = workspace(omp_get_max_threads() * per_thread);
  const float scale = float(p.scale);
  const float* lse = static_cast<const float*>(fwd.lse.data_ptr());
  const Rows rdq(dst.dq), rdk(dst.dk), rdv(dst.dv);
  // P and dS rounded and paired by the elementwise pass itself (backward_pairs) where the products
  // run on AMX; elsewhere backward_rows' f32 results and three passes over them (the same
  // operations and roundings, so the same bits): on the Zen 5 kind a fused pass measured no
  // faster (docs/hosts.md, 2026-12-05, later).
  const bool fused_pairs = attn::amx_products();

  // A static schedule: each thread's heads are consecutive, so the heads of a token's rows, which
  // share their cache lines' neighbours, go to the same thread (the gpt's 4 backward calls took
  // 7.0-7.8 ms a step against 7.7-8.4 with a dynamic schedule, seven alternating pairs; every head
  // does the same work).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.bh; ++bh) {
    const attn::AmxScope amx(std::is_same_v<E, uint16_t>);  // the tiles configured once a head
    Carver c(aligned(ws) + omp_get_thread_num() * per_thread);
    E* q_rows = c.take<E>(tq_pad * d.e_pad);    // A of S = Q K^T
    E* q_t = c.take<E>(tq_pad * d.e_pad);       // A of dK^T = Q^T dS: [e_pad][tq_pad]
    E* do_rows = c.take<E>(tq_pad * d.ev_pad);  // A of dP = dO V^T
    E* do_t = c.take<E>(tq_pad * d.ev_pad);     // A of dV^T = dO^T P: [ev_pad][tq_pad]
    E* kt_pack = c.take<E>(tk_pad * d.e_pad);   // B of S, per key block
    E* k_pack = c.take<E>(tk_pad * d.e_pad);    // B of dQ = dS K, per key block
    E* vt_pack = c.take<E>(tk_pad * d.ev_pad);  // B of dP, per key block
    float* dsum = c.take<float>(d.tq);          // D = rowsum(dO * O)
    float* dq = c.take<float>(tq_pad * d.e_pad);
    float* dk_t = c.take<float>(d.bc_pad * d.e_pad);   // [e_pad][bc_pad]
    float* dv_t = c.take<float>(d.bc_pad * d.ev_pad);  // [ev_pad][bc_pad]
    float* s = c.take<float>(kBr * d.bc_pad);
    float* dp = c.take<float>(kBr * d.bc_pad);
    E* p_pairs = c.take<E>(kBr * d.bc_pad);   // dropped P, pairs of rows (bf16 only)
    E* ds_pairs = c.take<E>(kBr * d.bc_pad);  // dS, pairs of rows (bf16 only)
    E* ds_rows = c.take<E>(kBr * d.bc_pad);   // dS rows (bf16 only)
    E* tmp = c.take<E>(std::max(kBr, d.bc_pad) * wmax);
    float* block = c.take<float>(d.bc_pad * wmax);  // key rows on their way out
    E* o_rows = c.take<E>(tq_pad * d.ev_pad);       // O: with dO^T, D's operand as O^T
    E* o_t = c.take<E>(tq_pad * d.ev_pad);

    // Q and dO rows (S's and dP's A operands) in place where they are tiles as they lie, else
    // copied; O's rows are only D's operand, through O^T.
    const bool q_in_place = in_place<E>(rq, d.e, d.e_pad), do_in_place = in_place<E>(rgo, d.ev, d.ev_pad),
               o_in_place = in_place<E>(ro, d.ev, d.ev_pad);
    const E* qa = q_in_place ? reinterpret_cast<const E*>(rq.row(bh, 0)) : q_rows;
    const E* doa = do_in_place ? reinterpret_cast<const E*>(rgo.row(bh, 0)) : do_rows;
    const int64_t ldq = q_in_place ? rq.st : d.e_pad, ldo = do_in_place ? rgo.st : d.ev_pad;
    for (int64_t i = 0; i < d.tq; ++i) {
      if (!q_in_place) attn::load_row(rq.row(bh, i), rq.t, rq.se, d.e, q_rows + i * d.e_pad, d.e_pad);
      if (!do_in_place) attn::load_row(rgo.row(bh, i), rgo.t, rgo.se, d.ev, do_rows + i * d.ev_pad, d.ev_pad);
      if (!o_in_place) attn::load_row(ro.row(bh, i), ro.t, ro.se, d.ev, o_rows + i * d.ev_pad, d.ev_pad);
    }
    to_columns(qa, ldq, d.tq, d.e_pad, q_t, tq_pad);
    to_columns(doa, ldo, d.tq, d.ev_pad, do_t, tq_pad);
    // D from the stored (rounded) output, as FlashAttention-2. The rows whose dP the AMX tiles sum
    // (amx_shape: query blocks start at multiples of 64, so the first tq / 16 * 16) get D summed by
    // the same instructions; the others 16 rows at a time from dO^T and O^T (over the padded width,
    // as the dP product: zeros past ev), O^T transposed only for them.
    int64_t amx_rows = 0;
    if constexpr (std::is_same_v<E, uint16_t>) {
      if (attn::amx_shape(d.tq, d.ev_pad)) {
        const E* oa = o_in_place ? reinterpret_cast<const E*>(ro.row(bh, 0)) : o_rows;
        attn::amx_row_dots(doa, ldo, oa, o_in_place ? ro.st : d.ev_pad, d.tq, d.ev_pad, dsum, tmp, block);
        amx_rows = d.tq / 16 * 16;
      }
    }
    if (amx_rows < d.tq) {
      if (o_in_place)
        to_columns(reinterpret_cast<const E*>(ro.row(bh, 0)), ro.st, d.tq, d.ev_pad, o_t, tq_pad);
      else
        to_columns(o_rows, d.ev_pad, d.tq, d.ev_pad, o_t, tq_pad);
      dot_columns(do_t + amx_rows, o_t + amx_rows, tq_pad, d.ev_pad, d.tq - amx_rows, dsum + amx_rows);
    }
    for (int64_t kb = 0; kb < d.nkb; ++kb) {
      const int64_t j0 = kb * kBc, nc = std::min(kBc, d.tk - j0);
      pack_keys<E>(rk, bh, j0, nc, d.e, d.e_pad, d.bc_pad, tmp, kt_pack + kb * d.bc_pad * d.e_pad,
                   k_pack + kb * d.bc_pad * d.e_pad);
      pack_keys<E>(rv, bh, j0, nc, d.ev, d.ev_pad, d.bc_pad, tmp, vt_pack + kb * d.bc_pad * d.ev_pad, nullptr);
    }
    std::fill(dq, dq + tq_pad * d.e_pad, 0.f);

    for (int64_t kb = 0; kb < d.nkb; ++kb) {
      const int64_t j0 = kb * kBc, nc = std::min(kBc, d.tk - j0);
      const E* kt = kt_pack + kb * d.bc_pad * d.e_pad;
      const E* kp = k_pack + kb * d.bc_pad * d.e_pad;
      const E* vt = vt_pack + kb * d.bc_pad * d.ev_pad;
      std::fill(dk_t, dk_t + d.bc_pad * d.e_pad, 0.f);
      std::fill(dv_t, dv_t + d.bc_pad * d.ev_pad, 0.f);
      // Query blocks before the first row that sees key j0 are masked: skipped.
      const int64_t first_row = p.causal ? std::max<int64_t>(0, j0 - std::max<int64_t>(d.tk - d.tq, 0)) : 0;
      for (int64_t qb = first_row / kBr; qb < d.nqb; ++qb) {
        const int64_t i0 = qb * kBr, nr = std::min(kBr, d.tq - i0), nr_pad = round_up(nr, P);
        const attn::Live scores = live_of(p, d, i0, j0, nc, attn::Live::scores);
        gemm<E>(nr, d.bc_pad, d.e_pad, qa + i0 * ldq, ldq, kt, s, d.bc_pad, false, scores);
        gemm<E>(nr, d.bc_pad, d.ev_pad, doa + i0 * ldo, ldo, vt, dp, d.bc_pad, false, scores);
        // f32 tiles are their own B operands (rows = the contraction); bf16 ones are rounded and
        // their row pairs interleaved.
        const E* pb = reinterpret_cast<const E*>(s);
        const E* dsb = reinterpret_cast<const E*>(dp);
        const E* dsa = reinterpret_cast<const E*>(dp);
        if constexpr (kBf16) {
          if (fused_pairs) {
            backward_pairs(s, dp, nr, d.bc_pad, d, bh, i0, j0, nc, lse, dsum, p, p_pairs, ds_pairs, ds_rows);
          } else {
            backward_rows(s, dp, nr, d.bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
            attn::pack_row_pairs(s, d.bc_pad, nr, d.bc_pad, p_pairs);
            attn::pack_row_pairs(dp, d.bc_pad, nr, d.bc_pad, ds_pairs);
            for (int64_t r = 0; r < nr; ++r) attn::to_tile(dp + r * d.bc_pad, ds_rows + r * d.bc_pad, d.bc_pad);
          }
          pb = p_pairs, dsb = ds_pairs, dsa = ds_rows;
        } else {
          backward_rows(s, dp, nr, d.bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
        }
        const attn::Live by_key = live_of(p, d, i0, j0, nc, attn::Live::k_begin);
        gemm<E>(d.ev, d.bc_pad, nr_pad, do_t + i0, tq_pad, pb, dv_t, d.bc_pad, true, by_key);
        gemm<E>(d.e, d.bc_pad, nr_pad, q_t + i0, tq_pad, dsb, dk_t, d.bc_pad, true, by_key);
        gemm<E>(nr, d.e_pad, d.bc_pad, dsa, d.bc_pad, kp, dq + i0 * d.e_pad, d.e_pad, true,
                live_of(p, d, i0, j0, nc, attn::Live::k_end));
      }
      attn::transpose(dk_t, d.bc_pad, d.e, nc, block, d.e);
      store_rows(block, d.e, nc, d.e, nullptr, scale, block, rdk, bh, j0);
      attn::transpose(dv_t, d.bc_pad, d.ev, nc, block, d.ev);
      store_rows(block, d.ev, nc, d.ev, nullptr, 1.f, block, rdv, bh, j0);
    }
    store_rows(dq, d.e_pad, d.tq, d.e, nullptr, scale, dq, rdq, bh, 0);
  }
}

bool supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  const DType t = q.dtype();
  return (t == DType::f32 || t == DType::bf16 || t == DType::f16) && k.dtype() == t && v.dtype() == t &&
         simd_lanes() != Lanes::none;
}
// Hosts without AVX-512 run the row kernel (cpu/attention_rows.cpp) instead of the tiles.
bool rows_kernel() { return simd_lanes() == Lanes::avx2; }
thread_local bool emulate_bf16_tiles = false;

// Which tiles a dtype's attention runs on: bf16 data on bf16 tiles where AVX512-BF16 is there and
// bf16 products compute natively (or, under EmulatedBf16Tiles, on emulated ones), everything else
// on f32 tiles (16-bit data widened on load). On the by_size kind (dnnl_common.h: Intel's
// AVX512-BF16 without AMX, whose VDPBF16PS runs at FMA's flop rate) the bf16 tiles' pair packing
// and roundings made the gpt's layer slower than f32 tiles (docs/hosts.md), so bf16 takes f32
// tiles there as on the f32 road; MIXPREC_BF16_PRODUCTS=native forces the bf16 tiles.
enum class Tiles { f32, bf16, emulated_bf16 };
Tiles tiles_for(DType t) {
  if (t != DType::bf16) return Tiles::f32;
  if (emulate_bf16_tiles) return Tiles::emulated_bf16;
  return mixprec::cpu::has_avx512_bf16() && !bf16_in_f32(true) ? Tiles::bf16 : Tiles::f32;
}
thread_local int transposed_override = -1;  // TransposedScores alive: 0 or 1
bool transposed_asked_off() {
  static const bool off = [] {
    const char* env = std::getenv("MIXPREC_ATTENTION_TRANSPOSED");
    return env != nullptr && std::string_view(env) == "off";
  }();
  return off;
}
// Whether the bf16 tiles' forward transposes its scores (forward_transposed): without dropout,
// where the products run on AMX (the kind it was measured on: docs/hosts.md), unless
// MIXPREC_ATTENTION_TRANSPOSED=off; a TransposedScores decides instead while one lives.
bool transposed_scores(Tiles t, const AttentionParams& p) {
  if (t == Tiles::f32 || p.dropout > 0.0) return false;
  if (transposed_override >= 0) return transposed_override == 1;
  return attn::amx_products() && !transposed_asked_off();
}
// The kernel's name in the profile's implementation column.
constexpr const char* kRowsImpl = "mixprec:attention_rows_avx2";
const char* impl_of(Tiles t, bool transposed = false) {
  switch (t) {
    case Tiles::bf16:
      if (attn::amx_products())
        return transposed ? "mixprec:attention_tiles_bf16_amx_transposed" : "mixprec:attention_tiles_bf16_amx";
      return transposed ? "mixprec:attention_tiles_bf16_transposed" : "mixprec:attention_tiles_bf16";
    case Tiles::emulated_bf16:
      return transposed ? "mixprec:attention_tiles_emulated_bf16_transposed" : "mixprec:attention_tiles_emulated_bf16";
    case Tiles::f32:
      break;
  }
  return "mixprec:attention_tiles_f32";
}

}  // namespace

EmulatedBf16Tiles::EmulatedBf16Tiles() : previous_(emulate_bf16_tiles) { emulate_bf16_tiles = true; }
EmulatedBf16Tiles::~EmulatedBf16Tiles() { emulate_bf16_tiles = previous_; }
TransposedScores::TransposedScores(bool on) : previous_(transposed_override) { transposed_override = on ? 1 : 0; }
TransposedScores::~TransposedScores() { transposed_override = previous_; }

bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       AttentionForward& dst) {
  if (!supported(q, k, v)) return false;
  // [B, H, Tq, Ev] as a view of a [B, Tq, H, Ev] tensor (as PyTorch's flash attention returns it):
  // the heads' rows of one token lie side by side, so the [B, Tq, H * Ev] input of the projection
  // after attention is a view of the output, not a copy, and the two save one tensor for backward.
  dst.out = Tensor::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.dtype()).transpose(1, 2);
  dst.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::f32);
  if (q.numel() == 0) return true;
  if (rows_kernel()) {
    profile::detail::note_impl(kRowsImpl);
    attn::forward_rows(q, k, v, p, dst);
    return true;
  }
  const Tiles tiles = tiles_for(q.dtype());
  const bool transposed = transposed_scores(tiles, p);
  profile::detail::note_impl(impl_of(tiles, transposed));
  switch (tiles) {
    case Tiles::bf16:
      transposed ? forward_transposed<uint16_t>(q, k, v, p, dst) : forward<uint16_t>(q, k, v, p, dst);
      break;
    case Tiles::emulated_bf16:
      transposed ? forward_transposed<attn::EmulatedBf16>(q, k, v, p, dst)
                 : forward<attn::EmulatedBf16>(q, k, v, p, dst);
      break;
    case Tiles::f32:
      forward<float>(q, k, v, p, dst);
      break;
  }
  return true;
}

bool attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                        const Tensor& grad_out, const AttentionParams& p, AttentionGrads& dst) {
  if (!supported(q, k, v) || grad_out.dtype() != q.dtype() || fwd.lse.dtype() != DType::f32) return false;
  for (auto [g, like] : {std::pair{&dst.dq, &q}, std::pair{&dst.dk, &k}, std::pair{&dst.dv, &v}})
    if (!g->defined() || g->shape() != like->shape() || g->dtype() != like->dtype() || g->strides().back() != 1)
      *g = Tensor::empty(like->shape(), like->dtype());
  if (rows_kernel()) {
    profile::detail::note_impl(kRowsImpl);
    attn::backward_rows(q, k, v, fwd, grad_out, p, dst);
    return true;
  }
  profile::detail::note_impl(impl_of(tiles_for(q.dtype())));
  switch (tiles_for(q.dtype())) {
    case Tiles::bf16:
      backward<uint16_t>(q, k, v, fwd, grad_out, p, dst);
      break;
    case Tiles::emulated_bf16:
      backward<attn::EmulatedBf16>(q, k, v, fwd, grad_out, p, dst);
      break;
    case Tiles::f32:
      backward<float>(q, k, v, fwd, grad_out, p, dst);
      break;
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
