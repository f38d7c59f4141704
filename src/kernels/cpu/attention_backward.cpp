// The fused CPU attention's backward on tiles (FlashAttention-2's: cpu/attention.cpp describes the
// algorithm, attention_blocks.h the blocks): each task a head, its probabilities recomputed from the
// log-sum-exp a block at a time, its dK, dV and dQ its own.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

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
// backward_pairs both compute them here, so their values are the same bits. P's exponential is the
// forward's (prob_exp).
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
template <class E>
MIXPREC_ATTN_TARGET inline RowChunk row_chunk(const RowOfDs& w, int64_t c, int64_t bh, int64_t j0, const Dims& d,
                                              __m512 vscale, const AttentionParams& p) {
  if (c > w.lim) return {_mm512_setzero_ps(), _mm512_setzero_ps()};
  const __mmask16 in = up_to(c, w.lim);
  const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(w.s + c), vscale, _mm512_set1_ps(w.lse));
  const __m512 pr = _mm512_maskz_mov_ps(in, prob_exp<E>(x));
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
template <class E>
MIXPREC_ATTN_TARGET void backward_rows(float* s, float* dp, int64_t nr, int64_t bc_pad, const Dims& d, int64_t bh,
                                       int64_t i0, int64_t j0, int64_t nc, const float* lse, const float* dsum,
                                       const AttentionParams& p) {
  const __m512 vscale = _mm512_set1_ps(float(p.scale));
  for (int64_t r = 0; r < nr; ++r) {
    const RowOfDs w = row_of_ds(s, dp, r, nr, bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
    for (int64_t c = 0; c < bc_pad; c += 16) {
      const RowChunk x = row_chunk<E>(w, c, bh, j0, d, vscale, p);  // reads the chunk before it is stored
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
      const RowChunk a = row_chunk<E>(w0, c, bh, j0, d, vscale, p);
      const RowChunk b = row_chunk<E>(w1, c, bh, j0, d, vscale, p);
      _mm512_storeu_si512(p_pairs + r * bc_pad + 2 * c, attn::interleave_halves(attn::round_bf16_pair<E>(a.p, b.p)));
      const __m512i ds = attn::round_bf16_pair<E>(a.ds, b.ds);  // row r's in the low half, r + 1's in the high
      _mm512_storeu_si512(ds_pairs + r * bc_pad + 2 * c, attn::interleave_halves(ds));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_rows + r * bc_pad + c), _mm512_castsi512_si256(ds));
      if (r + 1 < nr)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_rows + (r + 1) * bc_pad + c),
                            _mm512_extracti64x4_epi64(ds, 1));
    }
  }
}

}  // namespace

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
    // dQ, dK^T and dV^T are not zeroed first: their first product writes them (accumulate off),
    // and a product over masked queries or keys writes zeros (attn::Live). dQ's first is key block
    // 0's, which every query block sees; only without keys is dQ never written.
    if (d.nkb == 0) std::fill(dq, dq + tq_pad * d.e_pad, 0.f);

    for (int64_t kb = 0; kb < d.nkb; ++kb) {
      const int64_t j0 = kb * kBc, nc = std::min(kBc, d.tk - j0);
      const E* kt = kt_pack + kb * d.bc_pad * d.e_pad;
      const E* kp = k_pack + kb * d.bc_pad * d.e_pad;
      const E* vt = vt_pack + kb * d.bc_pad * d.ev_pad;
      // Query blocks before the first row that sees key j0 are masked: skipped.
      const int64_t first_row = p.causal ? std::max<int64_t>(0, j0 - std::max<int64_t>(d.tk - d.tq, 0)) : 0;
      if (first_row / kBr >= d.nqb) {  // no query: dK and dV are zero
        std::fill(dk_t, dk_t + d.bc_pad * d.e_pad, 0.f);
        std::fill(dv_t, dv_t + d.bc_pad * d.ev_pad, 0.f);
      }
      for (int64_t qb = first_row / kBr; qb < d.nqb; ++qb) {
        const bool first_q = qb == first_row / kBr;
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
            backward_rows<E>(s, dp, nr, d.bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
            attn::pack_row_pairs(s, d.bc_pad, nr, d.bc_pad, p_pairs);
            attn::pack_row_pairs(dp, d.bc_pad, nr, d.bc_pad, ds_pairs);
            for (int64_t r = 0; r < nr; ++r) attn::to_tile(dp + r * d.bc_pad, ds_rows + r * d.bc_pad, d.bc_pad);
          }
          pb = p_pairs, dsb = ds_pairs, dsa = ds_rows;
        } else {
          backward_rows<E>(s, dp, nr, d.bc_pad, d, bh, i0, j0, nc, lse, dsum, p);
        }
        const attn::Live by_key = live_of(p, d, i0, j0, nc, attn::Live::k_begin);
        gemm<E>(d.ev, d.bc_pad, nr_pad, do_t + i0, tq_pad, pb, dv_t, d.bc_pad, !first_q, by_key);
        gemm<E>(d.e, d.bc_pad, nr_pad, q_t + i0, tq_pad, dsb, dk_t, d.bc_pad, !first_q, by_key);
        gemm<E>(nr, d.e_pad, d.bc_pad, dsa, d.bc_pad, kp, dq + i0 * d.e_pad, d.e_pad, kb > 0,
                live_of(p, d, i0, j0, nc, attn::Live::k_end));
      }
      store_columns(dk_t, d.bc_pad, d.e, nc, nullptr, scale, block, rdk, bh, j0);
      store_columns(dv_t, d.bc_pad, d.ev, nc, nullptr, 1.f, block, rdv, bh, j0);
    }
    store_rows(dq, d.e_pad, d.tq, d.e, nullptr, scale, dq, rdq, bh, 0);
  }
}

template void backward<float>(const Tensor&, const Tensor&, const Tensor&, const AttentionForward&, const Tensor&,
                              const AttentionParams&, AttentionGrads&);
template void backward<uint16_t>(const Tensor&, const Tensor&, const Tensor&, const AttentionForward&, const Tensor&,
                                 const AttentionParams&, AttentionGrads&);
template void backward<attn::EmulatedBf16>(const Tensor&, const Tensor&, const Tensor&, const AttentionForward&,
                                           const Tensor&, const AttentionParams&, AttentionGrads&);

}  // namespace mixprec::kernels::cpu::attn_blocks
