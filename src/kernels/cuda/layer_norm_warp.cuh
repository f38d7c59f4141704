// Layer norm over rows of at most 2048 columns forward and 1024 backward (every width our
// transformers train at, GPT-2 124M's 768 among them) with one warp a row and the row in
// registers: one read of x for the forward (the block kernels of norm.cu read it three times), one
// read of x and grad_y for the whole backward (they read both twice, once for grad_x and once more
// for the weight and bias gradients), and the row's sums meet in warp shuffles, not in shared
// memory and two block barriers. On 2026-12-04 GPT-2's 25 layer norms took 1.33 ms forward and
// 2.82 ms backward of its step on an H200, about 1 TB/s. norm.cu launches these for f32, bf16 and
// f16 rows where they fit and keeps its block kernels for f64 and wider rows (and for every row
// with MIXPREC_CUDA_LAYER_NORM=block, the GPU runs' A/B until these have been measured);
// tests/emulated/ runs them on the CPU against the reference kernels.
//
// The formulas are the block kernels' (norm.cu): statistics in two passes (the mean, then squared
// deviations around it), each lane's f32 partial sums over its columns combined across the warp by
// a shuffle tree in f32 (the block kernels combine theirs in f64); y = (x - mean) rstd w + b;
// grad_x = rstd (dy w - mean(dy w) - x̂ mean(dy w x̂)); the weight and bias gradients summed in f32
// by each lane over its block's rows, the block's warps added in warp order, and the blocks'
// partials added in f64 in block order by norm.cu's pass 2: the same bits on every run.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mixprec::kernels::cuda::ln_warp {

constexpr int kWarps = 4;  // rows in flight per block
constexpr int kThreads = kWarps * 32;
// The widest rows: the forward holds a row (64 values a lane at 2048), the backward two rows'
// worth and the weight and its two gradients' sums, 5 values a column (at 64 a lane, 255
// registers and spills on sm_90; 223 registers at 32).
constexpr int kMaxColsForward = 2048;
constexpr int kMaxColsBackward = 1024;

// Columns per lane for a row of `cols`: 4, 8, 16, 32 or 64, at most max_cols / 32; 0 where the
// warp kernels do not apply.
inline int per_lane(int64_t cols, int max_cols) {
  for (int k = 4; k <= max_cols / 32; k *= 2)
    if (cols <= 32 * k) return cols > 0 ? k : 0;
  return 0;
}

// f(integral_constant<kPerLane>) with per_lane(cols, kMaxCols) where that is not 0; false, nothing
// called, where it is (the kernels are instantiated for at most kMaxCols / 32 a lane).
template <int kMaxCols, class F>
bool with_per_lane(int64_t cols, F&& f) {
  const int k = per_lane(cols, kMaxCols);
  const auto at = [&](auto lane_count) {
    constexpr int kPerLane = decltype(lane_count)::value;
    if constexpr (32 * kPerLane <= kMaxCols) {
      if (k == kPerLane) return f(lane_count), true;
    }
    return false;
  };
  return at(std::integral_constant<int, 4>{}) || at(std::integral_constant<int, 8>{}) ||
         at(std::integral_constant<int, 16>{}) || at(std::integral_constant<int, 32>{}) ||
         at(std::integral_constant<int, 64>{});
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Rows r = blockIdx.x kWarps + warp: mean, rstd, y in Y (x's T, or a 16-bit Y over f32 x: the f32
// value rounded once, what a pre-norm's Linear reads under autocast), and x̂ in U where xhat is not
// null. Lane l holds columns l, l + 32, ... (each warp load 32 adjacent elements). Every lane
// reaches every shuffle, rows past the last included (their results are not written).
template <class T, class Y, class U, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* x, int64_t rows, int cols, double eps, const float* weight, const float* bias, Y* y,
                   float* mean, float* rstd, U* xhat) {
  const int lane = int(threadIdx.x % 32);
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const bool live = r < rows;
  const T* row = x + (live ? r : 0) * cols;
  float v[kPerLane];
  float s = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + 32 * k;
    v[k] = live && j < cols ? to_acc(row[j]) : 0.0f;
    s += v[k];
  }
  const float mu = float(double(warp_sum(s)) / double(cols));
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
    if (lane + 32 * k < cols) {
      const float e = v[k] - mu;
      ss += e * e;
    }
  const float inv = float(1.0 / sqrt(double(warp_sum(ss)) / double(cols) + eps));
  if (!live) return;
  Y* out = y + r * cols;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + 32 * k;
    if (j >= cols) break;
    const float xh = (v[k] - mu) * inv;
    out[j] = from_acc<Y>(xh * (weight ? weight[j] : 1.0f) + (bias ? bias[j] : 0.0f));
    if (xhat) xhat[r * cols + j] = from_acc<U>(xh);
  }
  if (lane == 0) mean[r] = mu, rstd[r] = inv;
}

// Block b takes rows [b rows_per_block, (b + 1) rows_per_block), its warps rows b rows_per_block + w,
// + kWarps, ...: grad_x of each (where gx is not null) and, where part_w or part_b is not null, the
// block's sums of dy x̂ and dy per column into row b of part_w and part_b ([gridDim.x][cols], f32).
// With `mean` null, x is x̂ itself (layer_norm_forward's xhat) and rstd only scales grad_x. gy in G,
// x in X, grad_x in D: one dtype, or under autocast a 16-bit x̂ with a 16-bit or f32 gy and an f32
// grad_x (every operand widened exactly on load; the arithmetic is f32 either way).
template <class G, class X, class D, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const G* gy, const X* x, int64_t rows, int cols, int64_t rows_per_block, const float* mean,
                    const float* rstd, const float* weight, D* gx, float* part_w, float* part_b) {
  // static: one array a block on a GPU as without it, and one for all threads under tests/emulated/'s
  // shim (where __shared__ is nothing).
  static __shared__ float red_w[kWarps][32], red_b[kWarps][32];
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  float w[kPerLane], dw[kPerLane], db[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + 32 * k;
    w[k] = weight && j < cols ? weight[j] : 1.0f;
    dw[k] = db[k] = 0.0f;
  }
  // Every warp runs the same number of rows (the block's loop bound), rows past `last` as zeros.
  for (int64_t r0 = first; r0 < last; r0 += kWarps) {
    const int64_t r = r0 + warp;
    const bool live = r < last;
    const float m = live && mean ? mean[r] : 0.0f, rs = live ? rstd[r] : 0.0f, xs = mean ? rs : 1.0f;
    float g[kPerLane], xh[kPerLane];
    float s = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      const bool in = live && j < cols;
      g[k] = in ? to_acc(gy[r * cols + j]) : 0.0f;
      xh[k] = in ? (to_acc(x[r * cols + j]) - m) * xs : 0.0f;
      const float gw = g[k] * w[k];
      s += gw;
      sx += gw * xh[k];
      dw[k] += g[k] * xh[k];
      db[k] += g[k];
    }
    const float mean_g = float(double(warp_sum(s)) / double(cols));
    const float mean_gx = float(double(warp_sum(sx)) / double(cols));
    if (!gx || !live) continue;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + 32 * k;
      if (j >= cols) break;
      gx[r * cols + j] = from_acc<D>(rs * (g[k] * w[k] - mean_g - xh[k] * mean_gx));
    }
  }
  if (!part_w && !part_b) return;
  // The warps' sums, added in warp order, 32 columns at a time.
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    red_w[warp][lane] = dw[k];
    red_b[warp][lane] = db[k];
    __syncthreads();
    const int j = lane + 32 * k;
    if (warp == 0 && j < cols) {
      float tw = red_w[0][lane], tb = red_b[0][lane];
      for (int v = 1; v < kWarps; ++v) tw += red_w[v][lane], tb += red_b[v][lane];
      if (part_w) part_w[int64_t(blockIdx.x) * cols + j] = tw;
      if (part_b) part_b[int64_t(blockIdx.x) * cols + j] = tb;
    }
    __syncthreads();
  }
}

}  // namespace mixprec::kernels::cuda::ln_warp
