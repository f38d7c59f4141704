// The WMMA attention kernels of bf16 and f16 that attention_mma.cuh's replace: 16x16x16 WMMA
// fragments, whose accumulators are opaque, so every warp's scores went out to shared memory for
// the softmax and its probabilities came back from there as the next product's operands (GPT-2's
// attention on an H200, 2026-12-04: 31.9 TFLOP/s forward, 21.9 backward). Kept, run with
// MIXPREC_CUDA_ATTENTION=wmma (attention_mma.cu), until the new kernels have been measured against
// them on a GPU; then removed. The same blocks, tiles, staging (attention_mma.cuh's stage) and two
// backward passes as those.
//
// A header so that tests/emulated/ can run them on the CPU under a mock of WMMA. Device code:
// included by attention_mma.cu and the emulation only.
#pragma once
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"

namespace mixprec::kernels::cuda::attn::staged {

using mma::kRows;
using mma::kThreads;
using mma::kTile;
using mma::stage;

namespace wmma = nvcuda::wmma;

constexpr int kLdS = kTile + 4;  // f32 score rows (WMMA's f32 leading dims: multiples of 4)
constexpr int kLdP = kTile + 8;  // 16-bit probability rows (multiples of 8); the pads spread banks

// Shared-memory layout: 16-bit row tiles of width E, f32 score tiles, 16-bit probability tiles.
// Every region starts on a 32-byte boundary (WMMA's pointers: 256-bit aligned), as do fragment
// rows 16 apart (16 x ld x 2 bytes, ld a multiple of 8).
template <int E>
struct Layout {
  static constexpr int kLdH = mma::kLd<E>;  // a 16-bit [row][E] tile
  static constexpr int kLdO = E + 4;  // an f32 [row][E] tile
  static constexpr size_t kHalfTile = size_t(kRows) * kLdH * 2;
  static constexpr size_t kScores = size_t(kRows) * kLdS * 4;
  static constexpr size_t kProbs = size_t(kRows) * kLdP * 2;
  static constexpr size_t kOut = size_t(kRows) * kLdO * 4;
  // forward: q, k, v; s; p; o.  backward: BackwardShared's.
  static constexpr size_t kForward = 3 * kHalfTile + kScores + kProbs + kOut;
  static constexpr size_t kBackward = 4 * kHalfTile + 2 * kScores + 2 * kProbs + 2 * kTile * 4;
  static_assert(kHalfTile % 32 == 0 && kScores % 32 == 0 && kProbs % 32 == 0 && kOut % 32 == 0);
};

// The backward kernels' shared memory: four 16-bit row tiles (the block's own two, the staged
// other side's two), two f32 score tiles, two 16-bit probability tiles and two f32 rows of kTile
// (the dK/dV kernel's lse and D; the dQ kernel leaves them and the second probability tile unused).
template <class T, int E>
struct BackwardShared {
  T* own[2];
  T* other[2];
  float* scores[2];
  T* probs[2];
  float* rows[2];
  __device__ explicit BackwardShared(unsigned char* smem) {
    constexpr int ld = Layout<E>::kLdH;
    T* h = reinterpret_cast<T*>(smem);
    own[0] = h, own[1] = h + kRows * ld, other[0] = h + 2 * kRows * ld, other[1] = other[0] + kTile * ld;
    scores[0] = reinterpret_cast<float*>(other[1] + kTile * ld), scores[1] = scores[0] + kRows * kLdS;
    probs[0] = reinterpret_cast<T*>(scores[1] + kRows * kLdS), probs[1] = probs[0] + kRows * kLdP;
    rows[0] = reinterpret_cast<float*>(probs[1] + kRows * kLdP), rows[1] = rows[0] + kTile;
  }
};

template <class T, class Layout_>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, Layout_>;
template <class T, class Layout_>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, Layout_>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// acc += A (16 x 16K, row-major at a, leading dim lda) x B (16K x 16), B read at b with leading
// dim ldb either row-major or column-major (B^T row-major: the other tile's rows, for X Y^T).
template <class T, class BLayout, int K>
__device__ __forceinline__ void mma_rows(FragC& acc, const T* a, int lda, const T* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K; ++kk) {
    FragA<T, wmma::row_major> fa;
    FragB<T, BLayout> fb;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    if constexpr (std::is_same_v<BLayout, wmma::row_major>)
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb, ldb);
    else
      wmma::load_matrix_sync(fb, b + kk * 16, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// dst (16 x kTile f32, leading dim kLdS) = A (16 x E) x B^T, B a [kTile][E] tile: the scores of a
// warp's 16 rows against a tile.
template <class T, int E>
__device__ __forceinline__ void times_transposed(const T* a, const T* b, float* dst) {
  constexpr int ld = Layout<E>::kLdH;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    mma_rows<T, wmma::col_major, E / 16>(acc, a, ld, b + n * 16 * ld, ld);
    wmma::store_matrix_sync(dst + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += A (16 x kTile, 16-bit, leading dim kLdP) x B (a [kTile][E] tile), n over E's 16-column
// blocks.
template <class T, int E>
__device__ __forceinline__ void accumulate_times(FragC (&acc)[E / 16], const T* a, const T* b) {
  constexpr int ld = Layout<E>::kLdH;
#pragma unroll
  for (int n = 0; n < E / 16; ++n) mma_rows<T, wmma::row_major, kTile / 16>(acc[n], a, kLdP, b + n * 16, ld);
}

// Writes a warp's 16 x E accumulators as rows of dst (row r at dst + r * E, r < rows), times
// `scale`, through the f32 scratch `tmp` (16 rows, leading dim kLdS >= E).
template <class T, int E>
__device__ void write_rows(const FragC (&acc)[E / 16], float* tmp, T* dst, int64_t rows, float scale) {
#pragma unroll
  for (int n = 0; n < E / 16; ++n) wmma::store_matrix_sync(tmp + n * 16, acc[n], kLdS, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 16 * E; idx += 32) {
    const int r = idx / E, c = idx % E;
    if (r < rows) dst[int64_t(r) * E + c] = from_acc<T>(tmp[r * kLdS + c] * scale);
  }
}

// A lane's share of its warp's 16 rows in the element-wise passes: row lane / 2, the half of the
// tile's columns lane % 2 (the two lanes of a row combine with one shuffle).
struct RowHalf {
  int row;   // in the block, 0..kRows
  int half;  // 0 or 1
  __device__ RowHalf() : row(int(threadIdx.x / 32) * 16 + int(threadIdx.x % 32) / 2), half(int(threadIdx.x % 2)) {}
  __device__ int first_column() const { return half * (kTile / 2); }
};
__device__ __forceinline__ float pair_max(float x) { return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1)); }
__device__ __forceinline__ float pair_sum(float x) { return x + __shfl_xor_sync(0xffffffffu, x, 1); }

// One block per 64 queries of one (batch, head): out and lse.
template <class T, int E>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(View<T> q, View<T> k, View<T> v, T* out, float* lse, Sizes z, AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * L::kLdH;
  T* vs = ks + kTile * L::kLdH;
  float* s = reinterpret_cast<float*>(vs + kTile * L::kLdH);
  T* ps = reinterpret_cast<T*>(s + kRows * kLdS);
  float* os = reinterpret_cast<float*>(ps + kRows * kLdP);
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
  const RowHalf me;
  const int64_t i = i0 + me.row;
  const int64_t last = attention_last_key(p, i, z.tq, z.tk);
  const int64_t block_last = attention_last_key(p, min64(z.tq - 1, i0 + kRows - 1), z.tq, z.tk);
  const float scale = float(p.scale);
  stage<T, E>(q, bh, i0, min64(kRows, z.tq - i0), qs);
  for (int idx = threadIdx.x; idx < kRows * L::kLdO; idx += kThreads) os[idx] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  float* srow = s + me.row * kLdS + me.first_column();
  T* prow = ps + me.row * kLdP + me.first_column();
  float* orow = os + me.row * L::kLdO + me.half * (E / 2);
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    __syncthreads();  // the last tile's reads done
    stage<T, E>(k, bh, j0, min64(kTile, z.tk - j0), ks);
    stage<T, E>(v, bh, j0, min64(kTile, z.tk - j0), vs);
    __syncthreads();
    times_transposed<T, E>(qs + warp * 16 * L::kLdH, ks, s + warp * 16 * kLdS);
    __syncwarp();
    // Online softmax: every row sees key 0, so m is finite from the first tile on.
    const int64_t jb = j0 + me.first_column();
    float mt = m;
    for (int c = 0; c < kTile / 2; ++c) {
      const float x = jb + c <= last ? srow[c] * scale : -INFINITY;
      srow[c] = x;
      mt = fmaxf(mt, x);
    }
    mt = pair_max(mt);
    const float alpha = expf(m - mt);  // m = -inf on the first tile: 0
    float sum = 0.0f;
    for (int c = 0; c < kTile / 2; ++c) {
      const float pj = expf(srow[c] - mt);
      prow[c] = from_acc<T>(pj);
      sum += pj;
    }
    l = l * alpha + pair_sum(sum);
    m = mt;
    for (int c = 0; c < E / 2; ++c) orow[c] *= alpha;
    __syncwarp();
    FragC acc[E / 16];
#pragma unroll
    for (int n = 0; n < E / 16; ++n)
      wmma::load_matrix_sync(acc[n], os + warp * 16 * L::kLdO + n * 16, L::kLdO, wmma::mem_row_major);
    accumulate_times<T, E>(acc, ps + warp * 16 * kLdP, vs);
#pragma unroll
    for (int n = 0; n < E / 16; ++n)
      wmma::store_matrix_sync(os + warp * 16 * L::kLdO + n * 16, acc[n], L::kLdO, wmma::mem_row_major);
    __syncwarp();
  }
  if (i >= z.tq) return;
  T* dst = out + (bh * z.tq + i) * E + me.half * (E / 2);
  for (int c = 0; c < E / 2; ++c) dst[c] = from_acc<T>(orow[c] / l);
  if (me.half == 0) lse[bh * z.tq + i] = m + logf(l);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: attention_mma.cu's has_code() is false for such a build
#endif
}

// One block per 64 queries: D = dO . O (kept for the dK/dV kernel), then over the keys
// dS = P (dP - D), dQ += dS K; dQ scaled once at the end.
template <class T, int E>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(View<T> q, View<T> k, View<T> v, View<T> o, View<T> go, const float* lse, float* dsum, T* dq,
                       Sizes z, AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardShared<T, E> sh(smem);
  T *qs = sh.own[0], *gs = sh.own[1], *ks = sh.other[0], *vs = sh.other[1], *dss = sh.probs[0];
  float *s = sh.scores[0], *dp = sh.scores[1];
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
  const RowHalf me;
  const int64_t i = i0 + me.row;
  const bool active = i < z.tq;
  const int64_t last = attention_last_key(p, i, z.tq, z.tk);
  const int64_t block_last = attention_last_key(p, min64(z.tq - 1, i0 + kRows - 1), z.tq, z.tk);
  const float scale = float(p.scale);
  stage<T, E>(q, bh, i0, min64(kRows, z.tq - i0), qs);
  stage<T, E>(go, bh, i0, min64(kRows, z.tq - i0), gs);
  float d = 0.0f;
  if (active) {
    const T *gr = go.row(bh, i), *orow = o.row(bh, i);
    for (int c = me.half * (E / 2); c < (me.half + 1) * (E / 2); ++c)
      d += to_acc(gr[c * go.se]) * to_acc(orow[c * o.se]);
  }
  d = pair_sum(d);
  if (active && me.half == 0) dsum[bh * z.tq + i] = d;
  const float row_lse = active ? lse[bh * z.tq + i] : 0.0f;
  FragC acc[E / 16];
#pragma unroll
  for (int n = 0; n < E / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  const float* srow = s + me.row * kLdS + me.first_column();
  const float* dprow = dp + me.row * kLdS + me.first_column();
  T* dsrow = dss + me.row * kLdP + me.first_column();
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    __syncthreads();
    stage<T, E>(k, bh, j0, min64(kTile, z.tk - j0), ks);
    stage<T, E>(v, bh, j0, min64(kTile, z.tk - j0), vs);
    __syncthreads();
    times_transposed<T, E>(qs + warp * 16 * L::kLdH, ks, s + warp * 16 * kLdS);
    times_transposed<T, E>(gs + warp * 16 * L::kLdH, vs, dp + warp * 16 * kLdS);
    __syncwarp();
    const int64_t jb = j0 + me.first_column();
    for (int c = 0; c < kTile / 2; ++c) {
      const float pj = active && jb + c <= last ? expf(srow[c] * scale - row_lse) : 0.0f;
      dsrow[c] = from_acc<T>(pj * (dprow[c] - d));
    }
    __syncwarp();
    accumulate_times<T, E>(acc, dss + warp * 16 * kLdP, ks);
  }
  __syncwarp();
  write_rows<T, E>(acc, s + warp * 16 * kLdS, dq + (bh * z.tq + i0 + warp * 16) * E, z.tq - (i0 + warp * 16), scale);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// One block per 64 keys, over the queries that see them: dV += P^T dO, dK += dS^T Q (the scores
// transposed, keys as rows, so each warp's products stay in its own 16 rows); dK scaled at the end.
template <class T, int E>
__global__ void __launch_bounds__(kThreads)
    backward_dkv_kernel(View<T> q, View<T> k, View<T> v, View<T> go, const float* lse, const float* dsum, T* dk, T* dv,
                        Sizes z, AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardShared<T, E> sh(smem);
  T *ks = sh.own[0], *vs = sh.own[1], *qs = sh.other[0], *gs = sh.other[1], *pt = sh.probs[0], *dst = sh.probs[1];
  float *st = sh.scores[0], *dpt = sh.scores[1], *lse_s = sh.rows[0], *d_s = sh.rows[1];
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kRows;
  const RowHalf me;
  const int64_t j = j0 + me.row;
  const float scale = float(p.scale);
  stage<T, E>(k, bh, j0, min64(kRows, z.tk - j0), ks);
  stage<T, E>(v, bh, j0, min64(kRows, z.tk - j0), vs);
  FragC gk[E / 16], gv[E / 16];
#pragma unroll
  for (int n = 0; n < E / 16; ++n) {
    wmma::fill_fragment(gk[n], 0.0f);
    wmma::fill_fragment(gv[n], 0.0f);
  }
  const float* strow = st + me.row * kLdS + me.first_column();
  const float* dptrow = dpt + me.row * kLdS + me.first_column();
  T* ptrow = pt + me.row * kLdP + me.first_column();
  T* dstrow = dst + me.row * kLdP + me.first_column();
  // Causal: query i sees key j from i = j - (Tk - Tq, when Tk > Tq) on; the queries before the
  // block's first key's first are unseen by all its keys.
  const int64_t first_query = p.causal ? j0 - (z.tk > z.tq ? z.tk - z.tq : 0) : 0;
  for (int64_t i0 = first_query > 0 ? first_query : 0; i0 < z.tq; i0 += kTile) {
    const int64_t nq = min64(kTile, z.tq - i0);
    __syncthreads();
    stage<T, E>(q, bh, i0, nq, qs);
    stage<T, E>(go, bh, i0, nq, gs);
    for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
      lse_s[idx] = idx < nq ? lse[bh * z.tq + i0 + idx] : 0.0f;
      d_s[idx] = idx < nq ? dsum[bh * z.tq + i0 + idx] : 0.0f;
    }
    __syncthreads();
    times_transposed<T, E>(ks + warp * 16 * L::kLdH, qs, st + warp * 16 * kLdS);
    times_transposed<T, E>(vs + warp * 16 * L::kLdH, gs, dpt + warp * 16 * kLdS);
    __syncwarp();
    for (int c = 0; c < kTile / 2; ++c) {
      const int col = me.first_column() + c;
      const int64_t i = i0 + col;
      const bool seen = i < z.tq && j < z.tk && attention_last_key(p, i, z.tq, z.tk) >= j;
      const float pj = seen ? expf(strow[c] * scale - lse_s[col]) : 0.0f;
      ptrow[c] = from_acc<T>(pj);
      dstrow[c] = from_acc<T>(pj * (dptrow[c] - d_s[col]));
    }
    __syncwarp();
    accumulate_times<T, E>(gv, pt + warp * 16 * kLdP, gs);
    accumulate_times<T, E>(gk, dst + warp * 16 * kLdP, qs);
  }
  __syncwarp();
  const int64_t rows = z.tk - (j0 + warp * 16);
  write_rows<T, E>(gk, st + warp * 16 * kLdS, dk + (bh * z.tk + j0 + warp * 16) * E, rows, scale);
  __syncwarp();
  write_rows<T, E>(gv, dpt + warp * 16 * kLdS, dv + (bh * z.tk + j0 + warp * 16) * E, rows, 1.0f);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace mixprec::kernels::cuda::attn::staged
