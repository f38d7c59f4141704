// The fused CPU attention's forward on tiles (cpu/attention.cpp describes the algorithm;
// attention_blocks.h the blocks): the scores in rows, FlashAttention's online softmax a row at a
// time, and, where bf16 products run on AMX, transposed (forward_transposed).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "core/profile_detail.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/vec_exp.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu::attn_blocks {
namespace {

// Row i's softmax step over one key block (FlashAttention's online softmax): s holds the raw
// scores; on return it holds the probabilities relative to the new running max (dropped ones
// zero), and m, l, the output row o are rescaled.
template <class E>
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
    __m512 e = _mm512_maskz_mov_ps(in, prob_exp<E>(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm)));
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

// The lanes (queries) that see key j: j at most their last key.
MIXPREC_ATTN_TARGET inline __mmask16 sees(int64_t j, __m512i last) {
  return _mm512_cmp_epi32_mask(_mm512_set1_epi32(int32_t(j)), last, _MM_CMPINT_LE);
}
// P's 16 lanes of key row j of S^T (zero past nc): e^(scale s - max) of the live scores only, by
// exp_bf16_ps (P is rounded to bf16 for its product; the gpt layer's forward on AMX took 0.62-0.67
// ms in attention_bench against 0.76-0.78 with exp_ps, four alternating pairs). A masked lane is zeroed
// before the exponential: e^-inf, as every result below the normal range, takes a microcode
// assist (perf put 30% of this pass's samples on the instruction after VSCALEFPS when every lane
// took e^x).
MIXPREC_ATTN_TARGET inline __m512 prob_row(const float* row, int64_t j, int64_t nc, __m512i last, __m512 vscale,
                                           __m512 vmax) {
  if (j >= nc) return _mm512_setzero_ps();
  const __mmask16 in = sees(j, last);
  return _mm512_maskz_mov_ps(in, exp_bf16_ps(_mm512_maskz_fmsub_ps(in, _mm512_loadu_ps(row), vscale, vmax)));
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
    // Key rows from `live` on are masked for every query of the chunk (past the causal diagonal):
    // not read, and zero in P^T (a gpt layer's bf16 forward on AMX 0.48-0.50 ms against 0.53-0.55
    // reading them, attention_bench, four alternating pairs).
    const int64_t live = std::clamp<int64_t>(int64_t(_mm512_reduce_max_epi32(last)) + 1, 0, nc);
    // Four running maxima (a max is exact: any order gives the same), so the chain of VMAXPS
    // latencies is a quarter as long; of the raw scores, scaled once after (scale > 0, and rounding
    // is monotonic: the max of the scaled scores, bit for bit).
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx[4] = {ninf, ninf, ninf, ninf};
    int64_t j = 0;
    for (; j + 4 <= live; j += 4)
      for (int u = 0; u < 4; ++u)
        mx[u] = _mm512_mask_max_ps(mx[u], sees(j + u, last), mx[u], _mm512_loadu_ps(st + (j + u) * nq_pad + c));
    for (; j < live; ++j) mx[0] = _mm512_mask_max_ps(mx[0], sees(j, last), mx[0], _mm512_loadu_ps(st + j * nq_pad + c));
    const __m512 raw = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
    const __m512 vmax = _mm512_max_ps(m_old, _mm512_mul_ps(raw, vscale));
    __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();  // the sums of the even and odd keys
    for (j = 0; j < live; j += 2) {
      const __m512 p0 = prob_row(st + j * nq_pad + c, j, nc, last, vscale, vmax);
      const __m512 p1 = prob_row(st + (j + 1) * nq_pad + c, j + 1, nc, last, vscale, vmax);
      even = _mm512_add_ps(even, p0);
      odd = _mm512_add_ps(odd, p1);
      _mm512_storeu_si512(pairs + j * nq_pad + 2 * c, attn::interleave_halves(attn::round_bf16_pair<E>(p0, p1)));
    }
    for (; j < n32; j += 2) _mm512_storeu_si512(pairs + j * nq_pad + 2 * c, _mm512_setzero_si512());
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

}  // namespace

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
            online_softmax_row<E>(sr, d.bc_pad, lim, scale, m[r], l[r], o + r * d.ev_pad, d.ev_pad, p, bh, i0 + r, j0,
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
      store_columns(ot, nq_pad, d.ev, nr, factor, 0.f, block, rout, bh, i0);
    }
  }
}

template void forward<float>(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, AttentionForward&);
template void forward<uint16_t>(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, AttentionForward&);
template void forward<attn::EmulatedBf16>(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                                          AttentionForward&);
template void forward_transposed<uint16_t>(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                                           AttentionForward&);
template void forward_transposed<attn::EmulatedBf16>(const Tensor&, const Tensor&, const Tensor&,
                                                     const AttentionParams&, AttentionForward&);

}  // namespace mixprec::kernels::cpu::attn_blocks
