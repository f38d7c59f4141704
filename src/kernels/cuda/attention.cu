// CUDA kernels of the attention family (attention.h), flash-style and deliberately simple: one
// thread per query row (forward, dQ) or key row (dK, dV), tiles of the other side staged in shared
// memory, an online softmax, only the output and the log-sum-exp kept; the math of the CPU
// reference (kernels/ref/attention.cpp) in f32 (f64 for f64), loads of any strides, the same
// Philox dropout words (attention_keeps). Head dims up to kMaxDim.
//
// A thread's rows live in registers only when their length is known at compile time (an array
// indexed by a run-time bound is placed in local memory, which the 2026-11-27 H100 profile showed
// as attention's backward at 256 GFLOP/s, 65% of the char GPT's step): the kernels are compiled
// for the common head dims E = Ev of 16, 32 (the char model) and 64 (GPT-2), fully unrolled, and
// once for any other (E = 0: run-time dims, arrays of kMaxDim); dispatch_dim picks.
//
// bf16 and f16 at those head dims without dropout (the training case) take the tensor-core
// kernels of attention_mma.cu instead, where the build has code for the device (sm_80 or later);
// these kernels serve f32, f64, dropout and every other head dim.
#include <cmath>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace mixprec::kernels::cuda {
namespace {

using attn::min64;
using attn::Sizes;
using attn::View;
using attn::view_of;

constexpr int kRows = 64;     // threads per block: rows of the side a thread owns
constexpr int kTile = 32;     // rows of the other side per shared-memory tile
constexpr int kMaxDim = 256;  // head dim limit of the per-thread arrays

// A row's length: the compile-time E, else the run-time one.
template <int E>
__device__ __forceinline__ int dim_of(int64_t runtime) {
  return E != 0 ? E : int(runtime);
}
// Arrays for a row: E elements, or kMaxDim for the run-time dims.
template <int E>
constexpr int kArray = E != 0 ? E : kMaxDim;

template <class A>
__device__ A drop_factor(const AttentionParams& p, int64_t bh, int64_t i, int64_t j, const Sizes& z) {
  if (p.dropout == 0.0) return A(1);
  return attention_keeps(p, bh, i, j, z.tq, z.tk) ? A(1.0 / (1.0 - p.dropout)) : A(0);
}

// The last key any query row of this thread block sees (the kernels with a thread per query
// row): the key tiles past it are never staged.
__device__ __forceinline__ int64_t block_last_key(const AttentionParams& p, const Sizes& z) {
  return attention_last_key(p, min64(z.tq - 1, int64_t(blockIdx.x) * kRows + kRows - 1), z.tq, z.tk);
}

// Rows [t0, t0 + n) of x (width w) into shared memory.
template <class T, class A = acc_t<T>>
__device__ void stage(const View<T>& x, int64_t bh, int64_t t0, int64_t n, int64_t w, A* dst) {
  for (int64_t idx = threadIdx.x; idx < n * w; idx += blockDim.x) dst[idx] = x.at(bh, t0 + idx / w, idx % w);
}

template <class T, int E>
__global__ void __launch_bounds__(kRows)
    forward_kernel(View<T> q, View<T> k, View<T> v, T* out, acc_t<T>* lse, Sizes z, AttentionParams p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int ne = dim_of<E>(z.e), nv = dim_of<E>(z.ev);
  A* ks = reinterpret_cast<A*>(smem);
  A* vs = ks + kTile * ne;
  const int64_t bh = blockIdx.y, i = int64_t(blockIdx.x) * kRows + threadIdx.x;
  const bool active = i < z.tq;
  A qr[kArray<E>], o[kArray<E>];
#pragma unroll
  for (int e = 0; e < ne; ++e) qr[e] = active ? q.at(bh, i, e) : A(0);
#pragma unroll
  for (int e = 0; e < nv; ++e) o[e] = 0;
  A m = -INFINITY, l = 0;
  const int64_t last = active ? attention_last_key(p, i, z.tq, z.tk) : -1;
  const int64_t block_last = block_last_key(p, z);
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    const int64_t nk = min64(kTile, z.tk - j0);
    __syncthreads();
    stage(k, bh, j0, nk, ne, ks);
    stage(v, bh, j0, nk, nv, vs);
    __syncthreads();
    if (j0 > last) continue;
    const int n = int(min64(nk, last - j0 + 1));
    A s[kTile];  // a fixed trip count below: s stays in registers
    A mt = m;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      if (jj < n) {
        A dot = 0;
#pragma unroll
        for (int e = 0; e < ne; ++e) dot += qr[e] * ks[jj * ne + e];
        s[jj] = dot * A(p.scale);
        mt = s[jj] > mt ? s[jj] : mt;
      }
    }
    const A alpha = exp(m - mt);
    l *= alpha;
#pragma unroll
    for (int e = 0; e < nv; ++e) o[e] *= alpha;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      if (jj < n) {
        const A pj = exp(s[jj] - mt);
        l += pj;
        const A pd = pj * drop_factor<A>(p, bh, i, j0 + jj, z);
#pragma unroll
        for (int e = 0; e < nv; ++e) o[e] += pd * vs[jj * nv + e];
      }
    }
    m = mt;
  }
  if (!active) return;
  lse[bh * z.tq + i] = m + log(l);
#pragma unroll
  for (int e = 0; e < nv; ++e) out[(bh * z.tq + i) * nv + e] = from_acc<T>(o[e] / l);
}

// dQ, one thread per query row: D = dO . O, then over the keys dS = P (dP - D), dq += dS k.
template <class T, int E>
__global__ void __launch_bounds__(kRows)
    backward_dq_kernel(View<T> q, View<T> k, View<T> v, View<T> o, View<T> go, const acc_t<T>* lse, acc_t<T>* dsum,
                       T* dq, Sizes z, AttentionParams p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int ne = dim_of<E>(z.e), nv = dim_of<E>(z.ev);
  A* ks = reinterpret_cast<A*>(smem);
  A* vs = ks + kTile * ne;
  const int64_t bh = blockIdx.y, i = int64_t(blockIdx.x) * kRows + threadIdx.x;
  const bool active = i < z.tq;
  A qr[kArray<E>], gr[kArray<E>], acc[kArray<E>];
  A d = 0;
#pragma unroll
  for (int e = 0; e < ne; ++e) {
    qr[e] = active ? q.at(bh, i, e) : A(0);
    acc[e] = 0;
  }
#pragma unroll
  for (int e = 0; e < nv; ++e) {
    gr[e] = active ? go.at(bh, i, e) : A(0);
    d += active ? gr[e] * o.at(bh, i, e) : A(0);
  }
  if (active) dsum[bh * z.tq + i] = d;
  const A row_lse = active ? lse[bh * z.tq + i] : A(0);
  const int64_t last = active ? attention_last_key(p, i, z.tq, z.tk) : -1;
  const int64_t block_last = block_last_key(p, z);
  for (int64_t j0 = 0; j0 <= block_last; j0 += kTile) {
    const int64_t nk = min64(kTile, z.tk - j0);
    __syncthreads();
    stage(k, bh, j0, nk, ne, ks);
    stage(v, bh, j0, nk, nv, vs);
    __syncthreads();
    for (int64_t jj = 0; jj < nk && j0 + jj <= last; ++jj) {
      A dot = 0, dp = 0;
#pragma unroll
      for (int e = 0; e < ne; ++e) dot += qr[e] * ks[jj * ne + e];
#pragma unroll
      for (int e = 0; e < nv; ++e) dp += gr[e] * vs[jj * nv + e];
      const A pj = exp(dot * A(p.scale) - row_lse);
      const A ds = pj * (dp * drop_factor<A>(p, bh, i, j0 + jj, z) - d);
#pragma unroll
      for (int e = 0; e < ne; ++e) acc[e] += ds * ks[jj * ne + e];
    }
  }
  if (!active) return;
#pragma unroll
  for (int e = 0; e < ne; ++e) dq[(bh * z.tq + i) * ne + e] = from_acc<T>(acc[e] * A(p.scale));
}

// dK and dV, one thread per key row: over the queries that see it, dv += P f dO, dk += dS q.
template <class T, int E>
__global__ void __launch_bounds__(kRows)
    backward_dkv_kernel(View<T> q, View<T> k, View<T> v, View<T> go, const acc_t<T>* lse, const acc_t<T>* dsum, T* dk,
                        T* dv, Sizes z, AttentionParams p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int ne = dim_of<E>(z.e), nv = dim_of<E>(z.ev);
  A* qs = reinterpret_cast<A*>(smem);
  A* gs = qs + kTile * ne;
  A* ls = gs + kTile * nv;
  A* ds_ = ls + kTile;
  const int64_t bh = blockIdx.y, j = int64_t(blockIdx.x) * kRows + threadIdx.x;
  const bool active = j < z.tk;
  A kr[kArray<E>], vr[kArray<E>], gk[kArray<E>], gv[kArray<E>];
#pragma unroll
  for (int e = 0; e < ne; ++e) {
    kr[e] = active ? k.at(bh, j, e) : A(0);
    gk[e] = 0;
  }
#pragma unroll
  for (int e = 0; e < nv; ++e) {
    vr[e] = active ? v.at(bh, j, e) : A(0);
    gv[e] = 0;
  }
  // Causal: query i sees key j from i = j - (Tk - Tq, when Tk > Tq) on, so the block's first
  // key is unseen by every query before that: their tiles are not staged.
  const int64_t first_key = int64_t(blockIdx.x) * kRows;
  const int64_t first_query = p.causal ? first_key - (z.tk > z.tq ? z.tk - z.tq : 0) : 0;
  for (int64_t i0 = first_query > 0 ? first_query : 0; i0 < z.tq; i0 += kTile) {
    const int64_t nq = min64(kTile, z.tq - i0);
    __syncthreads();
    stage(q, bh, i0, nq, ne, qs);
    stage(go, bh, i0, nq, nv, gs);
    for (int64_t idx = threadIdx.x; idx < nq; idx += blockDim.x) {
      ls[idx] = lse[bh * z.tq + i0 + idx];
      ds_[idx] = dsum[bh * z.tq + i0 + idx];
    }
    __syncthreads();
    if (!active) continue;
    for (int64_t ii = 0; ii < nq; ++ii) {
      const int64_t i = i0 + ii;
      if (attention_last_key(p, i, z.tq, z.tk) < j) continue;
      A dot = 0, dp = 0;
#pragma unroll
      for (int e = 0; e < ne; ++e) dot += qs[ii * ne + e] * kr[e];
#pragma unroll
      for (int e = 0; e < nv; ++e) dp += gs[ii * nv + e] * vr[e];
      const A pj = exp(dot * A(p.scale) - ls[ii]), f = drop_factor<A>(p, bh, i, j, z);
#pragma unroll
      for (int e = 0; e < nv; ++e) gv[e] += pj * f * gs[ii * nv + e];
      const A ds = pj * (dp * f - ds_[ii]);
#pragma unroll
      for (int e = 0; e < ne; ++e) gk[e] += ds * qs[ii * ne + e];
    }
  }
  if (!active) return;
#pragma unroll
  for (int e = 0; e < ne; ++e) dk[(bh * z.tk + j) * ne + e] = from_acc<T>(gk[e] * A(p.scale));
#pragma unroll
  for (int e = 0; e < nv; ++e) dv[(bh * z.tk + j) * nv + e] = from_acc<T>(gv[e]);
}

// f(std::integral_constant<int, E>{}) with z's head dim where it has its own kernels (E = Ev of
// 16, 32 or 64), else E = 0. f64 (the tests' truth, never a training's) always takes E = 0: its
// rows of 32 and 64 would not fit in registers either.
template <class T, class F>
void dispatch_dim(const Sizes& z, F&& f) {
  if constexpr (!std::is_same_v<T, double>) {
    if (z.e == z.ev && z.e == 16) return f(std::integral_constant<int, 16>{});
    if (z.e == z.ev && z.e == 32) return f(std::integral_constant<int, 32>{});
    if (z.e == z.ev && z.e == 64) return f(std::integral_constant<int, 64>{});
  }
  f(std::integral_constant<int, 0>{});
}

Sizes sizes_of(const Tensor& q, const Tensor& v) {
  const Sizes z{q.size(0) * q.size(1), q.size(2), v.size(2), q.size(3), v.size(3)};
  MIXPREC_CHECK(z.e <= kMaxDim && z.ev <= kMaxDim, "scaled_dot_product_attention: head dims up to ", kMaxDim,
                " on a GPU, got ", z.e, " and ", z.ev);
  MIXPREC_CHECK(z.bh <= 65535, "scaled_dot_product_attention: at most 65535 batch x heads on a GPU, got ", z.bh);
  return z;
}
DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const Sizes z = sizes_of(q, v);
  AttentionForward f{Tensor::empty({q.size(0), q.size(1), z.tq, z.ev}, q.dtype()),
                     Tensor::empty({q.size(0), q.size(1), z.tq}, acc_dtype(q.dtype())), Tensor()};
  if (f.out.numel() == 0) return f;
  const Launch on(q);
  if (p.dropout > 0.0) mixprec::cuda::detail::refuse_in_capture(on.stream(), "attention dropout");
  if (attn::mma_forward(q, k, v, p, z, f)) return f;
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    dispatch_dim<T>(z, [&](auto dim) {
      constexpr int E = decltype(dim)::value;
      const dim3 grid(unsigned((z.tq + kRows - 1) / kRows), unsigned(z.bh));
      const size_t shared = sizeof(A) * size_t(kTile * (z.e + z.ev));
      allow_shared(forward_kernel<T, E>, shared);
      forward_kernel<T, E><<<grid, kRows, shared, on.stream()>>>(view_of<T>(q), view_of<T>(k), view_of<T>(v),
                                                                 static_cast<T*>(f.out.data_ptr()),
                                                                 static_cast<A*>(f.lse.data_ptr()), z, p);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
  return f;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p) {
  const Sizes z = sizes_of(q, v);
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype()), Tensor::empty(k.shape(), k.dtype()),
                   Tensor::empty(v.shape(), v.dtype())};
  if (q.numel() == 0) {
    g.dk.zero_();
    g.dv.zero_();
    return g;
  }
  if (attn::mma_backward(q, k, v, fwd, grad_out, p, z, g)) return g;
  const Tensor dsum = Tensor::empty({z.bh * z.tq}, fwd.lse.dtype());
  const Launch on(q);
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A* lse = static_cast<const A*>(fwd.lse.data_ptr());
    A* ds = static_cast<A*>(dsum.data_ptr());
    dispatch_dim<T>(z, [&](auto dim) {
      constexpr int E = decltype(dim)::value;
      const size_t shared_q = sizeof(A) * size_t(kTile * (z.e + z.ev));
      allow_shared(backward_dq_kernel<T, E>, shared_q);
      backward_dq_kernel<T, E>
          <<<dim3(unsigned((z.tq + kRows - 1) / kRows), unsigned(z.bh)), kRows, shared_q, on.stream()>>>(
              view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(fwd.out), view_of<T>(grad_out), lse, ds,
              static_cast<T*>(g.dq.data_ptr()), z, p);
      MIXPREC_CUDA_CHECK_LAUNCH();
      const size_t shared_k = sizeof(A) * size_t(kTile * (z.e + z.ev + 2));
      allow_shared(backward_dkv_kernel<T, E>, shared_k);
      backward_dkv_kernel<T, E>
          <<<dim3(unsigned((z.tk + kRows - 1) / kRows), unsigned(z.bh)), kRows, shared_k, on.stream()>>>(
              view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(grad_out), lse, ds,
              static_cast<T*>(g.dk.data_ptr()), static_cast<T*>(g.dv.data_ptr()), z, p);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
  return g;
}

}  // namespace mixprec::kernels::cuda
