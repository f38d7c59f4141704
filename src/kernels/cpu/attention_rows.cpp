// The fused CPU attention of hosts with AVX2 and FMA but no AVX-512 (the tile kernel of
// cpu/attention.cpp needs AVX-512): FlashAttention-2's algorithm on blocks of query rows, each row
// against all the keys it sees. A row's scores fill a buffer of Tk floats, its softmax is exact (no
// online rescaling: the whole row is there), and the forward keeps only the output and the
// log-sum-exp; the backward recomputes each row's probabilities from the log-sum-exp, so nothing of
// size Tq x Tk is ever stored. Every input dtype computes in f32 (16-bit rows widened on load, the
// results rounded once on store; f32 rows of unit stride are read in place). Every product is
// one register-blocked GEMM micro-kernel, 6 rows x 16 lanes of the result: query rows against
// packed K^T and V^T (keys along the lanes) or K and V rows (head dims along the lanes), and dK, dV
// updated 6 keys at a time from blocks of 12 query rows. Dropout's keep bits come from the same Philox words
// as the reference's (attention.h). OpenMP over (batch x head, block of 64 query rows) forward and
// over batch x head backward (each task owns its dK and dV).
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

constexpr int64_t kRowsPerTask = 64;    // forward: query rows per task, which packs its keys once
constexpr int64_t kRowsPerUpdate = 12;  // backward: query rows per update of dK and dV

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

// n elements of a row of unit stride into f32. A row is a head's few dozen elements: bf16 and f16
// widen here, 8 lanes at a time, where convert()'s dispatch cost as much as its widening (a third of
// the gpt's bf16 attention layer was convert() and its dispatch, `perf`, AMD Zen 3).
__attribute__((target("avx2,f16c"))) void widen_row(const char* src, DType t, float* dst, int64_t n) {
  int64_t c = 0;
  if (t == DType::bf16 || t == DType::f16) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, widen16_avx2(s + c, t == DType::f16));
  }
  if (c < n) convert(src + size_t(c) * dtype_size(t), t, dst + c, DType::f32, size_t(n - c));
}

// Rows are read and written a row at a time, 8 rows ahead of their use: in a training step the
// inputs were last written by another op (the gpt's q, k, v and dO are rows of 64-128 bytes 768
// bytes apart in the packed qkv, its 3 MB of bf16 past L2), the hardware prefetchers stop at
// every 4 KiB page, and `perf` of `attention_bench gpt 200 bf16` put a fifth of the layer on the
// first use of each row's loaded line (AMD Zen 3). As the AVX-512 tiles do (attention_tile.h).
constexpr int64_t kRowsAhead = 8;

// The lines of row i of head bh's first n elements (unit stride; none past the last row), for a
// read or for a write. Always inlined: GCC 12 finds a function of prefetches alone "pure" and drops
// its calls (none was left in the object file).
template <bool Write = false>
__attribute__((always_inline)) inline void prefetch_row(const Rows& x, int64_t bh, int64_t i, int64_t n) {
  if (i >= x.t_count || x.se != 1) return;
  const char* r = x.row(bh, i);
  const size_t bytes = size_t(n) * dtype_size(x.t);
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, Write ? 1 : 0, 3);
  __builtin_prefetch(r + bytes - 1, Write ? 1 : 0, 3);  // the last line, where the row starts mid-line
}

// n elements of row i of head bh as f32 into dst, zeros in [n, padded).
void load_row(const Rows& x, int64_t bh, int64_t i, int64_t n, float* dst, int64_t padded) {
  prefetch_row(x, bh, i + kRowsAhead, n);
  const char* src = x.row(bh, i);
  if (x.se == 1) {
    widen_row(src, x.t, dst, n);
  } else {
    const size_t es = dtype_size(x.t);
    for (int64_t c = 0; c < n; ++c) convert(src + size_t(c * x.se) * es, x.t, dst + c, DType::f32, 1);
  }
  std::fill(dst + n, dst + padded, 0.f);
}

// dst[c] = src[c] * f for c < n.
__attribute__((target("avx2,fma"))) void scale_into(float* dst, const float* src, int64_t n, float f) {
  const __m256 vf = _mm256_set1_ps(f);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(src + c), vf));
  for (; c < n; ++c) dst[c] = src[c] * f;
}

// Rows [i0, i0 + nr) of head bh, n elements each, as f32 rows of `padded` floats (zeros in
// [n, padded)): the tensor's own rows where they are that already (f32, unit stride, n == padded;
// the leading dimension is then the tensor's row stride), else copies into buf ([nr][padded]).
struct RowBlock {
  const float* p;
  int64_t ld;
};
RowBlock row_block(const Rows& x, int64_t bh, int64_t i0, int64_t nr, int64_t n, int64_t padded, float* buf) {
  if (x.t == DType::f32 && x.se == 1 && n == padded) {  // the block's rows and the next ones, asked for
    for (int64_t r = 0; r < nr + kRowsAhead; ++r) prefetch_row(x, bh, i0 + r, n);
    return {reinterpret_cast<const float*>(x.row(bh, i0)), x.st};
  }
  for (int64_t r = 0; r < nr; ++r) load_row(x, bh, i0 + r, n, buf + r * padded, padded);
  return {buf, padded};
}

// dst[c] = src[c] * f rounded to bf16 or f16 (t) for c < n rounded down to 8; returns that count.
// The bits of scale_into then convert().
__attribute__((target("avx2,f16c"))) int64_t scale_round_into(uint16_t* dst, DType t, const float* src, int64_t n,
                                                              float f) {
  const __m256 vf = _mm256_set1_ps(f);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + c), vf);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), round16_avx2(v, t == DType::f16));
  }
  return c;
}

// src[0, n) times f into row i of head bh (rounded once to its dtype); tmp holds n floats.
void store_row(const float* src, int64_t n, float f, float* tmp, const Rows& x, int64_t bh, int64_t i) {
  prefetch_row<true>(x, bh, i + kRowsAhead, n);
  char* dst = x.row(bh, i);
  if (x.t == DType::f32 && x.se == 1) return scale_into(reinterpret_cast<float*>(dst), src, n, f);
  if (x.se == 1 && (x.t == DType::bf16 || x.t == DType::f16)) {
    const int64_t done = scale_round_into(reinterpret_cast<uint16_t*>(dst), x.t, src, n, f);
    src += done, n -= done, dst += size_t(done) * 2;
    if (n == 0) return;
  }
  scale_into(tmp, src, n, f);
  if (x.se == 1) return convert(tmp, DType::f32, dst, x.t, size_t(n));
  const size_t es = dtype_size(x.t);
  for (int64_t c = 0; c < n; ++c) convert(tmp + c, DType::f32, dst + size_t(c * x.se) * es, x.t, 1);
}

// Rows [0, nj) of b (nj <= 8, width_pad floats each, zeros past width) as columns [0, nj) of dst
// ([width_pad][ld]).
void put_columns(const RowBlock& b, int64_t nj, int64_t width, int64_t width_pad, int64_t ld, float* dst) {
  if (nj == 8) {
    for (int64_t c = 0; c + 8 <= width_pad; c += 8) transpose_8x8_avx2(b.p + c, b.ld, dst + c * ld, ld);
  } else {
    for (int64_t r = 0; r < nj; ++r)
      for (int64_t c = 0; c < width; ++c) dst[c * ld + r] = b.p[r * b.ld + c];
  }
}

// Rows [0, n) of head bh's x as the columns of dst ([width_pad][ld], zero past width and n); buf
// holds 8 rows of width_pad floats.
void pack(const Rows& x, int64_t bh, int64_t n, int64_t width, int64_t width_pad, int64_t ld, float* dst, float* buf) {
  std::fill(dst, dst + width_pad * ld, 0.f);
  for (int64_t j = 0; j < n; j += 8) {
    const int64_t nj = std::min<int64_t>(8, n - j);
    put_columns(row_block(x, bh, j, nj, width, width_pad, buf), nj, width, width_pad, ld, dst + j);
  }
}

// The same from rows already in f32 (a row_block of n rows).
void pack(const RowBlock& rows, int64_t n, int64_t width, int64_t width_pad, int64_t ld, float* dst) {
  std::fill(dst, dst + width_pad * ld, 0.f);
  for (int64_t j = 0; j < n; j += 8)
    put_columns({rows.p + j * rows.ld, rows.ld}, std::min<int64_t>(8, n - j), width, width_pad, ld, dst + j);
}

// Every product is one register-blocked micro-kernel on row-major f32 blocks, each output element
// one fused multiply-add per term, in order, from zero or from its stored value: so the results do
// not depend on the blocking (a row alone or in a block of six).

constexpr int kGemmRows = 6;  // rows of C per micro-kernel: 6 x 16 lanes of C in 12 of 16 registers

// C[r][0, n8) (+)= sum over p < k, in order, of A(r, p) B[p][0, n8) for r < R, with A(r, p) at
// a[r * a_rs + p * a_ks] (A or A^T in place); n8 a multiple of 8. Accumulate: C's stored values are
// the sums' starts, else zero.
template <int R, bool Accumulate>
__attribute__((target("avx2,fma"))) void gemm_block(const float* a, int64_t a_rs, int64_t a_ks, int64_t k,
                                                    const float* b, int64_t ldb, int64_t n8, float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 16 <= n8; j += 16) {
    __m256 acc[R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      acc[r][0] = Accumulate ? _mm256_loadu_ps(c + r * ldc + j) : _mm256_setzero_ps();
      acc[r][1] = Accumulate ? _mm256_loadu_ps(c + r * ldc + j + 8) : _mm256_setzero_ps();
    }
    for (int64_t p = 0; p < k; ++p) {
      const __m256 b0 = _mm256_loadu_ps(b + p * ldb + j), b1 = _mm256_loadu_ps(b + p * ldb + j + 8);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 ar = _mm256_broadcast_ss(a + r * a_rs + p * a_ks);
        acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
      }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(c + r * ldc + j, acc[r][0]);
      _mm256_storeu_ps(c + r * ldc + j + 8, acc[r][1]);
    }
  }
  if (j < n8) {
    __m256 acc[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) acc[r] = Accumulate ? _mm256_loadu_ps(c + r * ldc + j) : _mm256_setzero_ps();
    for (int64_t p = 0; p < k; ++p) {
      const __m256 b0 = _mm256_loadu_ps(b + p * ldb + j);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * a_rs + p * a_ks), b0, acc[r]);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(c + r * ldc + j, acc[r]);
  }
}

// gemm_block over `rows` rows of C, six at a time.
template <bool Accumulate>
void gemm_rows(const float* a, int64_t a_rs, int64_t a_ks, int64_t rows, int64_t k, const float* b, int64_t ldb,
               int64_t n8, float* c, int64_t ldc) {
  using Kernel = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t);
  static constexpr Kernel kernels[kGemmRows] = {gemm_block<1, Accumulate>, gemm_block<2, Accumulate>,
                                                gemm_block<3, Accumulate>, gemm_block<4, Accumulate>,
                                                gemm_block<5, Accumulate>, gemm_block<6, Accumulate>};
  for (int64_t r = 0; r < rows; r += kGemmRows)
    kernels[std::min<int64_t>(kGemmRows, rows - r) - 1](a + r * a_rs, a_rs, a_ks, k, b, ldb, n8, c + r * ldc, ldc);
}

// C = A B: A [rows][lda], B [k][ldb], C [rows][ldc].
void matmul_rows(const float* a, int64_t lda, int64_t rows, int64_t k, const float* b, int64_t ldb, int64_t n8,
                 float* c, int64_t ldc) {
  gemm_rows<false>(a, lda, 1, rows, k, b, ldb, n8, c, ldc);
}

// out[j] += sum over r < nr, in order, of w[r][j] x[r] for j < n (w: [nr][ldw], x: [nr][ldx], out:
// [n][n8]): out += W^T X, the outer-product update of nr rows at once.
void add_outer(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t nr, int64_t n, int64_t n8,
               float* out) {
  gemm_rows<true>(w, 1, ldw, n, nr, x, ldx, n8, out, n8);
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

// A row's softmax in place: s[j] = e^(scale s[j] - m) for j < n with m the largest scaled score,
// zeros in [n, n8); returns m and the sum l of the row (8 lanes, then across them).
struct RowSoftmax {
  float m, l;
};
__attribute__((target("avx2,fma"))) RowSoftmax softmax_row(float* s, int64_t n, int64_t n8, float scale) {
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 vm = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  // max_ps returns its second operand where either is NaN: a NaN score is passed over, as std::max
  // passes it over below.
  for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(s + j), vs), vm);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vm);
  float m = -INFINITY;
  for (float x : lanes) m = std::max(m, x);
  for (; j < n; ++j) m = std::max(m, s[j] * scale);
  exp_shifted(s, n, n8, scale, m);
  __m256 acc = _mm256_setzero_ps();
  for (j = 0; j < n8; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(s + j));
  _mm256_store_ps(lanes, acc);
  float l = 0.f;
  for (float x : lanes) l += x;
  return {m, l};
}

// dS = P (dP - D) in place of dP, for j < n (no dropout: P' is P).
__attribute__((target("avx2,fma"))) void ds_row(const float* pr, float* ds, int64_t n, float dsum) {
  const __m256 vd = _mm256_set1_ps(dsum);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(ds + j, _mm256_mul_ps(_mm256_loadu_ps(pr + j), _mm256_sub_ps(_mm256_loadu_ps(ds + j), vd)));
  for (; j < n; ++j) ds[j] = pr[j] * (ds[j] - dsum);
}

// out[r] = sum over c < n of a[r][c] b[r][c] for r < nr, each sum one fused multiply-add per term
// in order from zero (as gemm_block sums each element). Eight rows' sums side by side, so that the
// chains of dependent FMAs overlap (one row's chain alone waits on each FMA's latency: 4% of the
// gpt's attention layer in `perf`, AMD Zen 3); a short group repeats its last row.
__attribute__((target("avx2,fma"))) void dots_in_order(const float* a, int64_t lda, const float* b, int64_t ldb,
                                                       int64_t nr, int64_t n, float* out) {
  constexpr int64_t G = 8;
  for (int64_t r0 = 0; r0 < nr; r0 += G) {
    const float* ar[G];
    const float* br[G];
    for (int64_t r = 0; r < G; ++r) {
      const int64_t row = std::min(r0 + r, nr - 1);
      ar[r] = a + row * lda, br[r] = b + row * ldb;
    }
    __m128 acc[G];
    for (auto& x : acc) x = _mm_setzero_ps();
    for (int64_t c = 0; c < n; ++c)
#pragma GCC unroll 8
      for (int64_t r = 0; r < G; ++r) acc[r] = _mm_fmadd_ss(_mm_load_ss(ar[r] + c), _mm_load_ss(br[r] + c), acc[r]);
    for (int64_t r = 0; r < std::min(G, nr - r0); ++r) out[r0 + r] = _mm_cvtss_f32(acc[r]);
  }
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
  constexpr int64_t R = kGemmRows;
  // Per thread: K^T [e8][tk8], V rows [tk8][ev8]; for a block of R query rows their q rows, scores
  // and output rows; 8 rows being packed, and the keep flags (as floats' room).
  const int64_t wmax = std::max(d.e8, d.ev8);
  const int64_t per_thread = d.e8 * d.tk8 + d.tk8 * d.ev8 + R * (d.e8 + d.tk8 + d.ev8) + 8 * wmax + d.tk8;
  const Tensor ws = workspace(omp_get_max_threads() * per_thread);

#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < d.bh * nqb; ++task) {
    float* base = static_cast<float*>(ws.data_ptr()) + omp_get_thread_num() * per_thread;
    float* kt = base;
    float* vrows = kt + d.e8 * d.tk8;
    float* qrows = vrows + d.tk8 * d.ev8;  // [R][e8]
    float* s = qrows + R * d.e8;           // [R][tk8]
    float* o = s + R * d.tk8;              // [R][ev8]
    float* row = o + R * d.ev8;
    auto* keep = reinterpret_cast<uint8_t*>(row + 8 * wmax);
    const int64_t bh = task / nqb, i0 = (task % nqb) * kRowsPerTask, nr = std::min(kRowsPerTask, d.tq - i0);
    // The keys the task's last row sees (all that any of its rows sees).
    const int64_t nk = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) + 1;
    pack(rk, bh, nk, d.e, d.e8, d.tk8, kt, row);
    const RowBlock vb = row_block(rv, bh, 0, nk, d.ev, d.ev8, vrows);
    for (int64_t b0 = i0; b0 < i0 + nr; b0 += R) {
      const int64_t br = std::min(R, i0 + nr - b0);
      // The keys the block's last row sees; a row's scores past its own last key weigh zero.
      const int64_t n_max = attention_last_key(p, b0 + br - 1, d.tq, d.tk) + 1;
      const RowBlock qb = row_block(rq, bh, b0, br, d.e, d.e8, qrows);
      matmul_rows(qb.p, qb.ld, br, d.e, kt, d.tk8, pad8(n_max), s, d.tk8);
      float l[R];
      for (int64_t r = 0; r < br; ++r) {
        const int64_t i = b0 + r, n = attention_last_key(p, i, d.tq, d.tk) + 1;
        float* sr = s + r * d.tk8;
        const RowSoftmax sm = softmax_row(sr, n, pad8(n), scale);
        std::fill(sr + n, sr + n_max, 0.f);
        l[r] = sm.l;
        lse[bh * d.tq + i] = sm.m + std::log(sm.l);
        if (p.dropout > 0.0) {
          keep_flags(p, bh, i, n, d.tq, d.tk, keep);
          for (int64_t j = 0; j < n; ++j)
            if (!keep[j]) sr[j] = 0.f;
        }
      }
      matmul_rows(s, d.tk8, br, n_max, vb.p, vb.ld, d.ev8, o, d.ev8);
      for (int64_t r = 0; r < br; ++r) store_row(o + r * d.ev8, d.ev, keep_scale / l[r], row, ro, bh, b0 + r);
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
  // for a block of R query rows their q, dO, O, dQ, P and dP (dS) rows; 8 rows being packed, the
  // keep flags.
  const int64_t per_thread =
      3 * d.e8 * d.tk8 + 2 * d.ev8 * d.tk8 + R * (2 * d.e8 + 2 * d.ev8 + 2 * d.tk8) + 8 * wmax + d.tk8;
  const Tensor ws = workspace(omp_get_max_threads() * per_thread);

#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < d.bh; ++bh) {
    float* kt = static_cast<float*>(ws.data_ptr()) + omp_get_thread_num() * per_thread;
    float* krows = kt + d.e8 * d.tk8;
    float* vt = krows + d.tk8 * d.e8;
    float* dk = vt + d.ev8 * d.tk8;
    float* dv = dk + d.tk8 * d.e8;
    float* qrows = dv + d.tk8 * d.ev8;   // [R][e8]
    float* dorows = qrows + R * d.e8;    // [R][ev8]
    float* dqrows = dorows + R * d.ev8;  // [R][e8]
    float* pr = dqrows + R * d.e8;       // [R][tk8]
    float* ds = pr + R * d.tk8;          // [R][tk8]
    float* orows = ds + R * d.tk8;       // [R][ev8]
    float* row = orows + R * d.ev8;
    auto* keep = reinterpret_cast<uint8_t*>(row + 8 * wmax);
    const RowBlock kb = row_block(rk, bh, 0, d.tk, d.e, d.e8, krows);  // K's rows, widened once
    pack(kb, d.tk, d.e, d.e8, d.tk8, kt);
    pack(rv, bh, d.tk, d.ev, d.ev8, d.tk8, vt, row);
    std::fill(dk, dk + d.tk8 * d.e8, 0.f);
    std::fill(dv, dv + d.tk8 * d.ev8, 0.f);
    for (int64_t i0 = 0; i0 < d.tq; i0 += R) {
      const int64_t nr = std::min(R, d.tq - i0);
      const int64_t n_max = attention_last_key(p, i0 + nr - 1, d.tq, d.tk) + 1;  // keys any row of the block sees
      const RowBlock qb = row_block(rq, bh, i0, nr, d.e, d.e8, qrows);
      const RowBlock dob = row_block(rgo, bh, i0, nr, d.ev, d.ev8, dorows);
      // D = dO . O from the stored (rounded) output, as FlashAttention-2, summed as the dP product
      // sums dP = dO V^T (one fused multiply-add per term, in order from zero): where O is V_j (a
      // single key), dP - D, and with it dS, is exactly zero.
      const RowBlock ob = row_block(ro, bh, i0, nr, d.ev, d.ev8, orows);
      float dsum[R];
      dots_in_order(dob.p, dob.ld, ob.p, ob.ld, nr, d.ev, dsum);
      matmul_rows(qb.p, qb.ld, nr, d.e, kt, d.tk8, pad8(n_max), pr, d.tk8);
      matmul_rows(dob.p, dob.ld, nr, d.ev, vt, d.tk8, pad8(n_max), ds, d.tk8);
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t i = i0 + r, n = attention_last_key(p, i, d.tq, d.tk) + 1;
        float *prow = pr + r * d.tk8, *dsrow = ds + r * d.tk8;
        exp_shifted(prow, n, pad8(n), scale, lse[bh * d.tq + i]);
        // dS = P (dP' - D) with dP' dP's dropped and rescaled values; P becomes P' (dV's weights).
        // Without dropout both are the values themselves (keep_scale is 1). Keys past the row's
        // last (up to the block's) weigh zero in the products below.
        if (p.dropout > 0.0) {
          keep_flags(p, bh, i, n, d.tq, d.tk, keep);
          for (int64_t j = 0; j < n; ++j) {
            dsrow[j] = prow[j] * ((keep[j] ? dsrow[j] * keep_scale : 0.f) - dsum[r]);
            prow[j] = keep[j] ? prow[j] * keep_scale : 0.f;
          }
        } else {
          ds_row(prow, dsrow, n, dsum[r]);
        }
        std::fill(prow + n, prow + n_max, 0.f);
        std::fill(dsrow + n, dsrow + n_max, 0.f);
      }
      matmul_rows(ds, d.tk8, nr, n_max, kb.p, kb.ld, d.e8, dqrows, d.e8);
      for (int64_t r = 0; r < nr; ++r) store_row(dqrows + r * d.e8, d.e, scale, row, rdq, bh, i0 + r);
      // dV_j += sum over the block's rows of P'_ij dO_i, dK_j += dS_ij q_i (scaled on store), in
      // row order.
      add_outer(pr, d.tk8, dob.p, dob.ld, nr, n_max, d.ev8, dv);
      add_outer(ds, d.tk8, qb.p, qb.ld, nr, n_max, d.e8, dk);
    }
    for (int64_t j = 0; j < d.tk; ++j) {
      store_row(dk + j * d.e8, d.e, scale, row, rdk, bh, j);
      store_row(dv + j * d.ev8, d.ev, 1.f, row, rdv, bh, j);
    }
  }
}

}  // namespace mixprec::kernels::cpu::attn
