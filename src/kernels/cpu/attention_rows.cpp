// The fused CPU attention of hosts with AVX2 and FMA but no AVX-512 (the tile kernel of
// cpu/attention.cpp needs AVX-512): FlashAttention-2's algorithm one query row at a time against
// all the keys it sees. A row's scores fill a buffer of Tk floats, its softmax is exact (no online
// rescaling: the whole row is there), and the forward keeps only the output and the log-sum-exp;
// the backward recomputes each row's probabilities from the log-sum-exp, so nothing of size
// Tq x Tk is ever stored. Every input dtype computes in f32 (16-bit rows widened on load, the
// results rounded once on store), the products as register-blocked FMA loops on packed K^T and V^T
// (keys along the lanes) and on K and V rows (head dims along the lanes). Dropout's keep bits come
// from the same Philox words as the reference's (attention.h). OpenMP over (batch x head, block of
// query rows) forward and over batch x head backward (each task owns its dK and dV).
#include "kernels/cpu/attention_rows.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/vec_exp.h"
#include "mixprec/allocator.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu::attn {
namespace {

constexpr int64_t kRowsPerTask = 64;   // forward: query rows per task, which packs its keys once
constexpr int64_t kRowsPerUpdate = 4;  // backward: query rows per update of dK and dV

constexpr int64_t pad8(int64_t n) { return (n + 7) / 8 * 8; }

struct Dims {
  int64_t bh, tq, tk, e, ev, e8, ev8, tk8;
  Dims(const Tensor& q, const Tensor& v)
      : bh(q.size(0) * q.size(1)),
        tq(q.size(2)),
        tk(v.size(2)),
        e(q.size(3)),
        ev(v.size(3)),
        e8(pad8(e)),
        ev8(pad8(ev)),
        tk8(pad8(tk)) {}
};

// n elements of row i of head bh as f32 into dst, zeros in [n, padded).
void load_row(const Rows& x, int64_t bh, int64_t i, int64_t n, float* dst, int64_t padded) {
  const char* src = x.row(bh, i);
  if (x.se == 1) {
    convert(src, x.t, dst, DType::f32, size_t(n));
  } else {
    const size_t es = dtype_size(x.t);
    for (int64_t c = 0; c < n; ++c) convert(src + size_t(c * x.se) * es, x.t, dst + c, DType::f32, 1);
  }
  std::fill(dst + n, dst + padded, 0.f);
}

// src[0, n) times f into row i of head bh (rounded once to its dtype); tmp holds n floats.
void store_row(const float* src, int64_t n, float f, float* tmp, const Rows& x, int64_t bh, int64_t i) {
  for (int64_t c = 0; c < n; ++c) tmp[c] = src[c] * f;
  char* dst = x.row(bh, i);
  if (x.se == 1) return convert(tmp, DType::f32, dst, x.t, size_t(n));
  const size_t es = dtype_size(x.t);
  for (int64_t c = 0; c < n; ++c) convert(tmp + c, DType::f32, dst + size_t(c * x.se) * es, x.t, 1);
}

// Rows [0, n) of head bh's x as the columns of dst ([width_pad][ld], zero past width and n) and,
// where rows_out is given, as rows ([n][width_pad], zero past width); row is a width_pad buffer.
void pack(const Rows& x, int64_t bh, int64_t n, int64_t width, int64_t width_pad, int64_t ld, float* dst,
          float* rows_out, float* row) {
  std::fill(dst, dst + width_pad * ld, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    float* r = rows_out ? rows_out + j * width_pad : row;
    load_row(x, bh, j, width, r, width_pad);
    for (int64_t c = 0; c < width; ++c) dst[c * ld + j] = r[c];
  }
}

// out[j] = sum over c < k of a[c] b[c][j] (b: [k][ldb]) for j < n8 (a multiple of 8): per lane one
// fused multiply-add per c, in order from zero, 32 lanes of out in registers at a time.
__attribute__((target("avx2,fma"))) void dot_rows(const float* a, int64_t k, const float* b, int64_t ldb, int64_t n8,
                                                  float* out) {
  int64_t j = 0;
  for (; j + 32 <= n8; j += 32) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t c = 0; c < k; ++c) {
      const __m256 ac = _mm256_broadcast_ss(a + c);
      const float* bc = b + c * ldb + j;
      acc0 = _mm256_fmadd_ps(ac, _mm256_loadu_ps(bc), acc0);
      acc1 = _mm256_fmadd_ps(ac, _mm256_loadu_ps(bc + 8), acc1);
      acc2 = _mm256_fmadd_ps(ac, _mm256_loadu_ps(bc + 16), acc2);
      acc3 = _mm256_fmadd_ps(ac, _mm256_loadu_ps(bc + 24), acc3);
    }
    _mm256_storeu_ps(out + j, acc0);
    _mm256_storeu_ps(out + j + 8, acc1);
    _mm256_storeu_ps(out + j + 16, acc2);
    _mm256_storeu_ps(out + j + 24, acc3);
  }
  for (; j < n8; j += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; ++c)
      acc = _mm256_fmadd_ps(_mm256_broadcast_ss(a + c), _mm256_loadu_ps(b + c * ldb + j), acc);
    _mm256_storeu_ps(out + j, acc);
  }
}

// out[j][0, n8) += sum over r < nr, in order, of w[r][j] x[r][0, n8) (w: [nr][ldw], x: [nr][ldx],
// out: [n][n8]) for j < n, zero weights skipped: an outer-product update of nr rows at once, each
// out[j] loaded and stored once (32 lanes in registers at a time).
__attribute__((target("avx2,fma"))) void add_outer(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t nr,
                                                   int64_t n, int64_t n8, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    float* o = out + j * n8;
    int64_t c = 0;
    for (; c + 32 <= n8; c += 32) {
      __m256 a0 = _mm256_loadu_ps(o + c), a1 = _mm256_loadu_ps(o + c + 8), a2 = _mm256_loadu_ps(o + c + 16),
             a3 = _mm256_loadu_ps(o + c + 24);
      for (int64_t r = 0; r < nr; ++r) {
        const float wr = w[r * ldw + j];
        if (wr == 0.f) continue;
        const __m256 vw = _mm256_set1_ps(wr);
        const float* xr = x + r * ldx + c;
        a0 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(xr), a0);
        a1 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(xr + 8), a1);
        a2 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(xr + 16), a2);
        a3 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(xr + 24), a3);
      }
      _mm256_storeu_ps(o + c, a0);
      _mm256_storeu_ps(o + c + 8, a1);
      _mm256_storeu_ps(o + c + 16, a2);
      _mm256_storeu_ps(o + c + 24, a3);
    }
    for (; c < n8; c += 8) {
      __m256 acc = _mm256_loadu_ps(o + c);
      for (int64_t r = 0; r < nr; ++r)
        if (const float wr = w[r * ldw + j]; wr != 0.f)
          acc = _mm256_fmadd_ps(_mm256_set1_ps(wr), _mm256_loadu_ps(x + r * ldx + c), acc);
      _mm256_storeu_ps(o + c, acc);
    }
  }
}

// out[0, n8) = sum over j < n, in order, of w[j] rows[j][0, n8) (rows: [n][n8]), zero weights
// skipped, 32 lanes of out in registers at a time.
__attribute__((target("avx2,fma"))) void weighted_rows(const float* w, const float* rows, int64_t n, int64_t n8,
                                                       float* out) {
  int64_t c = 0;
  for (; c + 32 <= n8; c += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < n; ++j) {
      if (w[j] == 0.f) continue;
      const __m256 vw = _mm256_set1_ps(w[j]);
      const float* rj = rows + j * n8 + c;
      a0 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(rj), a0);
      a1 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(rj + 8), a1);
      a2 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(rj + 16), a2);
      a3 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(rj + 24), a3);
    }
    _mm256_storeu_ps(out + c, a0);
    _mm256_storeu_ps(out + c + 8, a1);
    _mm256_storeu_ps(out + c + 16, a2);
    _mm256_storeu_ps(out + c + 24, a3);
  }
  for (; c < n8; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j)
      if (w[j] != 0.f) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(rows + j * n8 + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
}

// Dropout's keep flags of keys [0, n) of row (bh, i), from keep_bits' 16-key masks.
void keep_flags(const AttentionParams& p, int64_t bh, int64_t i, int64_t n, int64_t tq, int64_t tk, uint8_t* keep) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const uint32_t bits = keep_bits(p, bh, i, j0, tq, tk);
    for (int64_t l = 0; l < std::min<int64_t>(16, n - j0); ++l) keep[j0 + l] = (bits >> l) & 1u;
  }
}

// s[j] = e^(scale s[j] - shift) for j < n, 0 for n <= j < n8.
__attribute__((target("avx2,fma"))) void exp_shifted(float* s, int64_t n, int64_t n8, float scale, float shift) {
  const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(shift);
  for (int64_t j = 0; j < n8; j += 8)
    _mm256_storeu_ps(s + j, exp256_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(s + j), vs), vm)));
  std::fill(s + n, s + n8, 0.f);
}

Tensor workspace(int64_t floats) {
  const MemoryScope scope(MemCategory::workspace);
  return Tensor::empty({floats}, DType::f32);
}

}  // namespace

void forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, AttentionForward& dst) {
  const Dims d(q, v);
  const Rows rq(q), rk(k), rv(v), ro(dst.out);
  float* lse = static_cast<float*>(dst.lse.data_ptr());
  const float scale = float(p.scale), keep_scale = float(1.0 / (1.0 - p.dropout));
  const int64_t nqb = (d.tq + kRowsPerTask - 1) / kRowsPerTask;
  // Per thread: K^T [e8][tk8], V rows [tk8][ev8], a query row, the scores, the output row, a row
  // being packed, and the keep flags (as floats' room).
  const int64_t wmax = std::max(d.e8, d.ev8);
  const int64_t per_thread = d.e8 * d.tk8 + d.tk8 * d.ev8 + d.e8 + d.tk8 + d.ev8 + wmax + d.tk8;
  const Tensor ws = workspace(omp_get_max_threads() * per_thread);

#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < d.bh * nqb; ++task) {
    float* base = static_cast<float*>(ws.data_ptr()) + omp_get_thread_num() * per_thread;
    float* kt = base;
    float* vrows = kt + d.e8 * d.tk8;
    float* qrow = vrows + d.tk8 * d.ev8;
    float* s = qrow + d.e8;
    float* o = s + d.tk8;
    float* row = o + d.ev8;
    auto* keep = reinterpret_cast<uint8_t*>(row + wmax);
    const int64_t bh = task / nqb, i0 = (task % nqb) * kRowsPerTask, nr = std::min(kRowsPerTask, d.tq - i0);
    // The keys the block's last row sees (all that any of its rows sees).
    const int64_t nk = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) + 1;
    pack(rk, bh, nk, d.e, d.e8, d.tk8, kt, nullptr, row);
    for (int64_t j = 0; j < nk; ++j) load_row(rv, bh, j, d.ev, vrows + j * d.ev8, d.ev8);
    for (int64_t i = i0; i < i0 + nr; ++i) {
      const int64_t n = attention_last_key(p, i, d.tq, d.tk) + 1, n8 = pad8(n);
      load_row(rq, bh, i, d.e, qrow, d.e8);
      dot_rows(qrow, d.e, kt, d.tk8, n8, s);
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j] * scale);
      exp_shifted(s, n, n8, scale, m);
      float l = 0.f;
      for (int64_t j = 0; j < n; ++j) l += s[j];
      lse[bh * d.tq + i] = m + std::log(l);
      if (p.dropout > 0.0) {
        keep_flags(p, bh, i, n, d.tq, d.tk, keep);
        for (int64_t j = 0; j < n; ++j)
          if (!keep[j]) s[j] = 0.f;
      }
      weighted_rows(s, vrows, n, d.ev8, o);
      store_row(o, d.ev, keep_scale / l, row, ro, bh, i);
    }
  }
}

void backward_rows(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                   const Tensor& grad_out, const AttentionParams& p, AttentionGrads& dst) {
  const Dims d(q, v);
  const Rows rq(q), rk(k), rv(v), rgo(grad_out), ro(fwd.out), rdq(dst.dq), rdk(dst.dk), rdv(dst.dv);
  const float* lse = static_cast<const float*>(fwd.lse.data_ptr());
  const float scale = float(p.scale), keep_scale = float(1.0 / (1.0 - p.dropout));
  const int64_t wmax = std::max(d.e8, d.ev8);
  constexpr int64_t R = kRowsPerUpdate;
  // Per thread: K^T [e8][tk8] and K rows [tk8][e8], V^T [ev8][tk8], dK [tk8][e8], dV [tk8][ev8];
  // for a block of R query rows their q, dO, P and dP (dS) rows; the rows of O and dQ, a row being
  // packed, the keep flags.
  const int64_t per_thread =
      3 * d.e8 * d.tk8 + 2 * d.ev8 * d.tk8 + R * (d.e8 + d.ev8 + 2 * d.tk8) + d.ev8 + d.e8 + wmax + d.tk8;
  const Tensor ws = workspace(omp_get_max_threads() * per_thread);

#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < d.bh; ++bh) {
    float* kt = static_cast<float*>(ws.data_ptr()) + omp_get_thread_num() * per_thread;
    float* krows = kt + d.e8 * d.tk8;
    float* vt = krows + d.tk8 * d.e8;
    float* dk = vt + d.ev8 * d.tk8;
    float* dv = dk + d.tk8 * d.e8;
    float* qrows = dv + d.tk8 * d.ev8;  // [R][e8]
    float* dorows = qrows + R * d.e8;   // [R][ev8]
    float* pr = dorows + R * d.ev8;     // [R][tk8]
    float* ds = pr + R * d.tk8;         // [R][tk8]
    float* orow = ds + R * d.tk8;
    float* dqrow = orow + d.ev8;
    float* row = dqrow + d.e8;
    auto* keep = reinterpret_cast<uint8_t*>(row + wmax);
    pack(rk, bh, d.tk, d.e, d.e8, d.tk8, kt, krows, row);
    pack(rv, bh, d.tk, d.ev, d.ev8, d.tk8, vt, nullptr, row);
    std::fill(dk, dk + d.tk8 * d.e8, 0.f);
    std::fill(dv, dv + d.tk8 * d.ev8, 0.f);
    for (int64_t i0 = 0; i0 < d.tq; i0 += R) {
      const int64_t nr = std::min(R, d.tq - i0);
      const int64_t n_max = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) + 1;  // keys any row of the block sees
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t i = i0 + r, n = attention_last_key(p, i, d.tq, d.tk) + 1, n8 = pad8(n);
        float *qrow = qrows + r * d.e8, *dorow = dorows + r * d.ev8, *prow = pr + r * d.tk8, *dsrow = ds + r * d.tk8;
        load_row(rq, bh, i, d.e, qrow, d.e8);
        load_row(rgo, bh, i, d.ev, dorow, d.ev8);
        load_row(ro, bh, i, d.ev, orow, d.ev8);
        // D = dO . O from the stored (rounded) output, as FlashAttention-2, summed as dot_rows sums
        // dP = dO V^T (one fused multiply-add per element, in order from zero): where O is V_j (a
        // single key), dP - D, and with it dS, is exactly zero.
        float dsum = 0.f;
        for (int64_t c = 0; c < d.ev; ++c) dsum = std::fma(dorow[c], orow[c], dsum);
        dot_rows(qrow, d.e, kt, d.tk8, n8, prow);
        dot_rows(dorow, d.ev, vt, d.tk8, n8, dsrow);
        exp_shifted(prow, n, n8, scale, lse[bh * d.tq + i]);
        if (p.dropout > 0.0) keep_flags(p, bh, i, n, d.tq, d.tk, keep);
        // dS = P (dP' - D) with dP' dP's dropped and rescaled values; P becomes P' (dV's weights).
        // Without dropout both are the values themselves (keep_scale is 1). Keys past the row's
        // last (up to the block's) weigh zero in the updates below.
        for (int64_t j = 0; j < n; ++j) {
          const bool kept = p.dropout <= 0.0 || keep[j];
          dsrow[j] = prow[j] * ((kept ? dsrow[j] * keep_scale : 0.f) - dsum);
          prow[j] = kept ? prow[j] * keep_scale : 0.f;
        }
        std::fill(prow + n, prow + n_max, 0.f);
        std::fill(dsrow + n, dsrow + n_max, 0.f);
        weighted_rows(dsrow, krows, n, d.e8, dqrow);
        store_row(dqrow, d.e, scale, row, rdq, bh, i);
      }
      // dV_j += sum over the block's rows of P'_ij dO_i, dK_j += dS_ij q_i (scaled on store), in
      // row order.
      add_outer(pr, d.tk8, dorows, d.ev8, nr, n_max, d.ev8, dv);
      add_outer(ds, d.tk8, qrows, d.e8, nr, n_max, d.e8, dk);
    }
    for (int64_t j = 0; j < d.tk; ++j) {
      store_row(dk + j * d.e8, d.e, scale, row, rdk, bh, j);
      store_row(dv + j * d.ev8, d.ev, 1.f, row, rdv, bh, j);
    }
  }
}

}  // namespace mixprec::kernels::cpu::attn
