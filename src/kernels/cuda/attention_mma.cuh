// The tensor-core attention kernels of bf16 and f16 (launched by attention_mma.cu), in the
// FlashAttention-2 manner with the scores in registers: a block of 64 rows (4 warps of 16) against
// tiles of 64 rows of the other side staged in shared memory; every product an mma.sync.m16n8k16
// (mma_sync.cuh) with f32 accumulation. A warp's 16 x 64 scores stay in its accumulator fragments:
// the scale, the causal mask and the online softmax run on them (a row's four lanes combine with two
// shuffles), and the probabilities, rounded to the input's type as the CPU's fused kernel rounds
// them, become the next product's A fragments without leaving the registers (an accumulator's
// layout of two 16 x 8 tiles is the A layout of one 16 x 16). Only the output and the log-sum-exp
// are kept. The backward recomputes the scores twice, once in the dQ kernel (a block per 64
// queries, over the keys) and once in the dK/dV kernel (a block per 64 keys, over the queries,
// with the scores transposed: keys as rows), where FlashAttention-2 adds dQ with atomics: two
// passes, no atomics, so a result does not depend on the order blocks run in (CUDA graph replays
// stay bit-identical to eager steps).
//
// These replace attention_wmma.cuh's kernels (WMMA 16x16x16 fragments, whose accumulators can only
// be read through shared memory: every score tile went out to shared memory and back, 31.9 TFLOP/s
// forward and 21.9 backward on GPT-2's attention on an H200, 2026-12-04); MIXPREC_CUDA_ATTENTION=
// wmma runs those instead (attention_mma.cu) until these have been measured against them on a GPU.
// Compiled for head dims E = Ev of 16, 32, 64 only, without dropout; everything else stays on
// attention.cu's kernels. mma.sync with bf16 needs sm_80: where the build has no such code for the
// device, mma_forward and mma_backward return false.
//
// A header so that tests/emulated/ can run them on the CPU (one thread per CUDA thread, a mock of
// mma.sync): what the emulation shows is the fragments' layout, the tiling, indexing, masking and
// online softmax, not the hardware. Device code: included by attention_mma.cu and the emulation only.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/mma_sync.cuh"

namespace mixprec::kernels::cuda::attn::mma {

constexpr int kRows = 64;  // rows a block owns (queries, or keys for dK/dV), 16 per warp
constexpr int kTile = 64;  // rows of the other side per shared-memory tile
constexpr int kWarps = kRows / 16;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A 16-bit [row][E] tile's leading dim: rows 8 elements (16 bytes, 4 banks) apart, so the eight
// rows g = 0..7 a fragment load touches fall in different banks.
template <int E>
constexpr int kLd = E + 8;

// Dynamic shared memory: forward q, k and v tiles; backward four tiles (the block's own two, the
// staged other side's two) and, for the dK/dV kernel, two f32 rows of kTile (the queries' lse and D).
template <int E>
struct Shared {
  static constexpr size_t kTileBytes = size_t(kRows) * kLd<E> * 2;
  static constexpr size_t kForward = 3 * kTileBytes;
  static constexpr size_t kBackward = 4 * kTileBytes + 2 * kTile * sizeof(float);
  static_assert(kRows == kTile && kTileBytes % 16 == 0);
};

template <class T>
__device__ __forceinline__ T zero() {
  return from_acc<T>(0.0f);
}

// Rows [t0, t0 + n) of x into a [kTile][E] tile (leading dim kLd<E>), zero rows past n: a padded
// key's scores are masked, and its zero V row adds nothing. The rows' base is formed once per tile:
// View::raw divided by the head count in 64 bits for every element (the 18 kernels' PTX held 414
// such divisions, unrolled into the tile loops; now 72, one per staged tile). Rows whose elements
// are contiguous and 16-byte aligned (the GPT's q, k and v: head slices of the packed qkv, and
// every contiguous [B, H, T, E]) move 8 elements per load; other views element by element.
template <class T, int E>
__device__ void stage(const View<T>& x, int64_t bh, int64_t t0, int64_t n, T* dst) {
  constexpr int ld = kLd<E>;
  const T* base = x.row(bh, t0);
  static_assert(sizeof(T) == 2 && E % 8 == 0 && ld % 8 == 0);
  if (x.se == 1 && x.st % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0) {
    using Bits = Vec<uint32_t, 4>;  // 16 bytes: 8 elements, copied as they are
    constexpr int kChunks = E / 8;
    for (int idx = threadIdx.x; idx < kTile * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      Bits v{};  // +0 in bf16 and f16
      if (r < n) v = *reinterpret_cast<const Bits*>(base + r * x.st + c);
      *reinterpret_cast<Bits*>(dst + r * ld + c) = v;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * E; idx += kThreads) {
    const int r = idx / E, c = idx % E;
    dst[r * ld + c] = r < n ? base[r * x.st + c * x.se] : zero<T>();
  }
}

// ----------------------------------------------------------------------------- fragments

struct FragA {
  uint32_t x[4];
};
struct FragB {
  uint32_t x[2];
};
struct FragC {
  float x[4];  // x[2r + c]: row g + 8r, column 2t + c
};

// A lane's place in its warp's fragments: row group g (0..7), column pair t (0..3).
struct Lane {
  int g, t;
  __device__ Lane() : g(int(threadIdx.x % 32) / 4), t(int(threadIdx.x % 4)) {}
};

template <class T>
__device__ __forceinline__ const uint16_t* bits_of(const T* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

// The fragments come from shared memory by ldmatrix.x4 (mma_sync.cuh), one instruction for four
// 8 x 8 matrices: lane i names row i % 8 of matrix m = i / 8. Each function says which matrix m is.

// A = tile[r0 .. r0 + 16)[k0 .. k0 + 16) of a [row][ld] tile: m = 0..3 are a[0..3], rows r0 + 8 (m % 2),
// columns k0 + 8 (m / 2).
__device__ __forceinline__ FragA load_a(const uint16_t* tile, int ld, int r0, int k0) {
  const int i = int(threadIdx.x % 32), m = i / 8;
  FragA a;
  ldmatrix_x4<false>(a.x, tile + (r0 + (m % 2) * 8 + i % 8) * ld + k0 + (m / 2) * 8);
  return a;
}
// Two B fragments, b[0] and b[1] for B's columns n0 .. n0 + 8 and n0 + 8 .. n0 + 16 and its rows
// k0 .. k0 + 16. kTrans false: the tile holds B's columns as its rows, B[k][n] = tile[n][k] (X Y^T,
// the tile Y); kTrans true: the tile holds B itself, B[k][n] = tile[k][n] (P Y), transposed as it
// loads. Matrix m covers B's rows k0 + 8 (m % 2) and columns n0 + 8 (m / 2).
template <bool kTrans>
__device__ __forceinline__ void load_b(FragB (&b)[2], const uint16_t* tile, int ld, int n0, int k0) {
  const int i = int(threadIdx.x % 32), m = i / 8;
  const int n = n0 + (m / 2) * 8, k = k0 + (m % 2) * 8;
  uint32_t r[4];
  ldmatrix_x4<kTrans>(r, kTrans ? tile + (k + i % 8) * ld + n : tile + (n + i % 8) * ld + k);
  b[0] = FragB{{r[0], r[1]}};
  b[1] = FragB{{r[2], r[3]}};
}

template <class T>
__device__ __forceinline__ void mma(FragC& d, const FragA& a, const FragB& b) {
  mma_m16n8k16<T>(d.x, a.x, b.x);
}

// acc[n] += A (a warp's 16 rows, K wide, as K / 16 fragments) times B (K x N, from `tile` as
// load_b<kTrans> reads it), n over N's 8-column blocks.
template <class T, int N, int K, bool kTrans>
__device__ __forceinline__ void product(FragC (&acc)[N / 8], const FragA (&a)[K / 16], const uint16_t* tile, int ld) {
#pragma unroll
  for (int n = 0; n < N / 8; n += 2)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      FragB b[2];
      load_b<kTrans>(b, tile, ld, n * 8, kk * 16);
      mma<T>(acc[n], a[kk], b[0]);
      mma<T>(acc[n + 1], a[kk], b[1]);
    }
}

// acc[n] = A (a warp's 16 rows, E wide) times the [kTile][E] tile's rows transposed: a warp's
// 16 x kTile scores, n over kTile's 8-column blocks.
template <class T, int E>
__device__ __forceinline__ void scores(FragC (&acc)[kTile / 8], const FragA (&a)[E / 16], const uint16_t* tile) {
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n) acc[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  product<T, kTile, E, false>(acc, a, tile, kLd<E>);
}

// acc[n] += P (16 x kTile, as kTile / 16 fragments) times the [kTile][E] tile, n over E's 8-column
// blocks.
template <class T, int E>
__device__ __forceinline__ void accumulate(FragC (&acc)[E / 8], const FragA (&p)[kTile / 16], const uint16_t* tile) {
  product<T, E, kTile, true>(acc, p, tile, kLd<E>);
}

// A warp's 16 rows of a [row][kLd<E>] tile as A fragments.
template <int E>
__device__ __forceinline__ void load_rows(FragA (&a)[E / 16], const uint16_t* tile, int r0) {
#pragma unroll
  for (int kk = 0; kk < E / 16; ++kk) a[kk] = load_a(tile, kLd<E>, r0, kk * 16);
}

// The 16 x kTile values f(n, idx) (element idx of score fragment n), rounded to T, as the A
// fragments of the next product: fragments 2kk and 2kk + 1 (columns 16kk .. 16kk + 16) make A
// fragment kk.
template <class T, class F>
__device__ __forceinline__ void to_a(FragA (&a)[kTile / 16], F&& f) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = 2 * kk + h;
      a[kk].x[2 * h] = round_pair<T>(f(n, 0), f(n, 1));
      a[kk].x[2 * h + 1] = round_pair<T>(f(n, 2), f(n, 3));
    }
}

// The four lanes of a row (lanes 4g .. 4g + 3) combined.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Writes a warp's 16 x E accumulators times `scale` as rows r0 + g and r0 + g + 8 of dst (row r at
// dst + r * E), the rows below `rows` only.
template <class T, int E>
__device__ __forceinline__ void write_rows(const FragC (&acc)[E / 8], T* dst, int64_t r0, int64_t rows, float scale,
                                           const Lane& l) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = r0 + l.g + 8 * r;
    if (row >= rows) continue;
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + row * E + 2 * l.t);
#pragma unroll
    for (int n = 0; n < E / 8; ++n) out[n * 4] = round_pair<T>(acc[n].x[2 * r] * scale, acc[n].x[2 * r + 1] * scale);
  }
}

// ----------------------------------------------------------------------------- kernels

// One block per 64 queries of one (batch, head): out and lse. Scores in the base-2 domain (times
// scale * log2 e), so each exponential is one exp2f.
template <class T, int E>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(View<T> q, View<T> k, View<T> v, T* out, float* lse, Sizes z, AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int ld = kLd<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * ld;
  T* vs = ks + kTile * ld;
  const Lane ln;
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows, row0 = i0 + warp * 16 + ln.g;
  // The keys rows row0 and row0 + 8 see (rows past Tq included: their results are not written).
  const int64_t last[2] = {attention_last_key(p, row0, z.tq, z.tk), attention_last_key(p, row0 + 8, z.tq, z.tk)};
  const int64_t block_last = attention_last_key(p, min64(z.tq - 1, i0 + kRows - 1), z.tq, z.tk);
  const float scale2 = float(p.scale) * kLog2e;
  stage<T, E>(q, bh, i0, min64(kRows, z.tq - i0), qs);
  __syncthreads();
  FragA qa[E / 16];
  load_rows<E>(qa, bits_of(qs), warp * 16);
  FragC o[E / 8];
#pragma unroll
  for (int n = 0; n < E / 8; ++n) o[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns' share
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    __syncthreads();  // the last tile's reads done
    stage<T, E>(k, bh, j0, min64(kTile, z.tk - j0), ks);
    stage<T, E>(v, bh, j0, min64(kTile, z.tk - j0), vs);
    __syncthreads();
    FragC s[kTile / 8];
    scores<T, E>(s, qa, bits_of(ks));
    // Online softmax: every row sees key 0, so m is finite from the first tile on.
    float mt[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int idx = 0; idx < 4; ++idx) {
        const int r = idx / 2;
        const int64_t key = j0 + n * 8 + 2 * ln.t + idx % 2;
        const float x = key <= last[r] ? s[n].x[idx] * scale2 : -INFINITY;
        s[n].x[idx] = x;
        mt[r] = fmaxf(mt[r], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mt[r] = quad_max(mt[r]);
      alpha[r] = exp2f(m[r] - mt[r]);  // m = -inf on the first tile: 0
      m[r] = mt[r];
      l[r] *= alpha[r];
    }
    FragA pa[kTile / 16];
    to_a<T>(pa, [&](int n, int idx) {
      const float e = exp2f(s[n].x[idx] - mt[idx / 2]);
      l[idx / 2] += e;
      return e;
    });
#pragma unroll
    for (int n = 0; n < E / 8; ++n)
#pragma unroll
      for (int idx = 0; idx < 4; ++idx) o[n].x[idx] *= alpha[idx / 2];
    accumulate<T, E>(o, pa, bits_of(vs));
  }
  const float total[2] = {quad_sum(l[0]), quad_sum(l[1])};
  T* dst = out + bh * z.tq * E;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + 8 * r;
    if (i >= z.tq) continue;
    uint32_t* row = reinterpret_cast<uint32_t*>(dst + i * E + 2 * ln.t);
    const float inv = 1.0f / total[r];
#pragma unroll
    for (int n = 0; n < E / 8; ++n) row[n * 4] = round_pair<T>(o[n].x[2 * r] * inv, o[n].x[2 * r + 1] * inv);
    if (ln.t == 0) lse[bh * z.tq + i] = (m[r] + log2f(total[r])) * kLn2;
  }
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
  constexpr int ld = kLd<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* gs = qs + kRows * ld;
  T* ks = gs + kRows * ld;
  T* vs = ks + kTile * ld;
  const Lane ln;
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows, row0 = i0 + warp * 16 + ln.g;
  const int64_t last[2] = {attention_last_key(p, row0, z.tq, z.tk), attention_last_key(p, row0 + 8, z.tq, z.tk)};
  const int64_t block_last = attention_last_key(p, min64(z.tq - 1, i0 + kRows - 1), z.tq, z.tk);
  const float scale2 = float(p.scale) * kLog2e;
  stage<T, E>(q, bh, i0, min64(kRows, z.tq - i0), qs);
  stage<T, E>(go, bh, i0, min64(kRows, z.tq - i0), gs);
  // D of rows row0 and row0 + 8: each of a row's four lanes sums a quarter of its columns.
  float d[2], lse2[2];
  bool active[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + 8 * r;
    active[r] = i < z.tq;
    float part = 0.0f;
    if (active[r]) {
      const T *gr = go.row(bh, i), *orow = o.row(bh, i);
      for (int c = ln.t * (E / 4); c < (ln.t + 1) * (E / 4); ++c)
        part += to_acc(gr[c * go.se]) * to_acc(orow[c * o.se]);
    }
    d[r] = quad_sum(part);
    if (active[r] && ln.t == 0) dsum[bh * z.tq + i] = d[r];
    lse2[r] = active[r] ? lse[bh * z.tq + i] * kLog2e : 0.0f;
  }
  __syncthreads();
  FragA qa[E / 16], ga[E / 16];
  load_rows<E>(qa, bits_of(qs), warp * 16);
  load_rows<E>(ga, bits_of(gs), warp * 16);
  FragC acc[E / 8];
#pragma unroll
  for (int n = 0; n < E / 8; ++n) acc[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    __syncthreads();
    stage<T, E>(k, bh, j0, min64(kTile, z.tk - j0), ks);
    stage<T, E>(v, bh, j0, min64(kTile, z.tk - j0), vs);
    __syncthreads();
    FragC s[kTile / 8], dp[kTile / 8];
    scores<T, E>(s, qa, bits_of(ks));
    scores<T, E>(dp, ga, bits_of(vs));
    FragA dsa[kTile / 16];
    to_a<T>(dsa, [&](int n, int idx) {
      const int r = idx / 2;
      const int64_t key = j0 + n * 8 + 2 * ln.t + idx % 2;
      const float pj = active[r] && key <= last[r] ? exp2f(s[n].x[idx] * scale2 - lse2[r]) : 0.0f;
      return pj * (dp[n].x[idx] - d[r]);
    });
    accumulate<T, E>(acc, dsa, bits_of(ks));
  }
  write_rows<T, E>(acc, dq + bh * z.tq * E, i0 + warp * 16, z.tq, float(p.scale), ln);
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
  constexpr int ld = kLd<E>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kRows * ld;
  T* qs = vs + kRows * ld;
  T* gs = qs + kTile * ld;
  float* lse_s = reinterpret_cast<float*>(gs + kTile * ld);  // the tile's queries' lse times log2 e
  float* d_s = lse_s + kTile;
  const Lane ln;
  const int warp = int(threadIdx.x / 32);
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kRows, key0 = j0 + warp * 16 + ln.g;
  const int64_t key[2] = {key0, key0 + 8};
  const float scale2 = float(p.scale) * kLog2e;
  stage<T, E>(k, bh, j0, min64(kRows, z.tk - j0), ks);
  stage<T, E>(v, bh, j0, min64(kRows, z.tk - j0), vs);
  __syncthreads();
  FragA ka[E / 16], va[E / 16];
  load_rows<E>(ka, bits_of(ks), warp * 16);
  load_rows<E>(va, bits_of(vs), warp * 16);
  FragC gk[E / 8], gv[E / 8];
#pragma unroll
  for (int n = 0; n < E / 8; ++n) gk[n] = gv[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  // Causal: query i sees key j from i = j - (Tk - Tq, when Tk > Tq) on; the queries before the
  // block's first key's first are unseen by all its keys.
  const int64_t first_query = p.causal ? j0 - (z.tk > z.tq ? z.tk - z.tq : 0) : 0;
  for (int64_t i0 = first_query > 0 ? first_query : 0; i0 < z.tq; i0 += kTile) {
    const int64_t nq = min64(kTile, z.tq - i0);
    __syncthreads();
    stage<T, E>(q, bh, i0, nq, qs);
    stage<T, E>(go, bh, i0, nq, gs);
    for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
      lse_s[idx] = idx < nq ? lse[bh * z.tq + i0 + idx] * kLog2e : 0.0f;
      d_s[idx] = idx < nq ? dsum[bh * z.tq + i0 + idx] : 0.0f;
    }
    __syncthreads();
    FragC st[kTile / 8], dpt[kTile / 8];
    scores<T, E>(st, ka, bits_of(qs));
    scores<T, E>(dpt, va, bits_of(gs));
    // P^T in place of the scores, keys as rows: element (key[r], query i0 + column); then dS^T.
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int idx = 0; idx < 4; ++idx) {
        const int col = n * 8 + 2 * ln.t + idx % 2;
        const int64_t i = i0 + col, j = key[idx / 2];
        const bool seen = i < z.tq && j < z.tk && attention_last_key(p, i, z.tq, z.tk) >= j;
        st[n].x[idx] = seen ? exp2f(st[n].x[idx] * scale2 - lse_s[col]) : 0.0f;
      }
    FragA pa[kTile / 16], dsa[kTile / 16];
    to_a<T>(pa, [&](int n, int idx) { return st[n].x[idx]; });
    to_a<T>(dsa, [&](int n, int idx) { return st[n].x[idx] * (dpt[n].x[idx] - d_s[n * 8 + 2 * ln.t + idx % 2]); });
    accumulate<T, E>(gv, pa, bits_of(gs));
    accumulate<T, E>(gk, dsa, bits_of(qs));
  }
  write_rows<T, E>(gk, dk + bh * z.tk * E, j0 + warp * 16, z.tk, float(p.scale), ln);
  write_rows<T, E>(gv, dv + bh * z.tk * E, j0 + warp * 16, z.tk, 1.0f, ln);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace mixprec::kernels::cuda::attn::mma
