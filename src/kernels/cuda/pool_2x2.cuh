// Max pooling's 2x2 window of stride 2 tiling the planes exactly (the models' pool): per output,
// one division for its place and a 2-element load from each of its two input rows, in place of
// pool.cu's generic window (three divisions, a loop over the taps with bounds checks, four 2-byte
// loads). On 2026-12-04 the wide cnn's pools ran about 4x off the H200's bandwidth (0.84 ms of a
// 4.8 ms amp step; docs/gpu.md). The per-output functions are the kernels' bodies; pool.cu
// launches them, and tests/emulated/ runs them on the CPU against the reference kernels.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/pool.h"

namespace mixprec::kernels::cuda::pool2x2 {

// Whether the 2x2 kernels take this geometry: stride 2, no padding or dilation, h = 2 oh and
// w = 2 ow (no rows or columns past the last window), and every pointer aligned for a 2-element
// access. The planes then stack: plane p's output row oy reads input rows 2 (p oh + oy) and the
// one after, so an output's place is its row r = i / ow across all planes and its column.
inline bool tiles_exactly(const PoolGeometry& g) { return g.is_2x2_stride2() && g.h == 2 * g.oh && g.w == 2 * g.ow; }
inline bool takes(const PoolGeometry& g, size_t elem, const void* a, const void* b) {
  const auto aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % (2 * elem) == 0; };
  return tiles_exactly(g) && aligned(a) && aligned(b);
}

// The window of output i (its row r and column ox: one division), taps in row-major order.
template <class T, class I>
struct Window {
  T v[4];
  I top;  // the offset of tap 0 in x (and in grad_x)
};
template <class I>
__device__ __forceinline__ I top_of(I i, I ow) {
  const I r = i / ow, ox = i - r * ow;
  return 4 * r * ow + 2 * ox;  // input row 2r of width 2 ow, column 2 ox
}
template <class T, class I>
__device__ __forceinline__ Window<T, I> load(const T* x, I i, I ow) {
  Window<T, I> win;
  win.top = top_of<I>(i, ow);
  const Vec<T, 2> a = *reinterpret_cast<const Vec<T, 2>*>(x + win.top);
  const Vec<T, 2> b = *reinterpret_cast<const Vec<T, 2>*>(x + win.top + 2 * ow);
  win.v[0] = a.v[0], win.v[1] = a.v[1], win.v[2] = b.v[0], win.v[3] = b.v[1];
  return win;
}

// The winning tap, by pool.cu's window_winner rule (PyTorch's scan): a NaN propagates and the last
// NaN wins; ties keep the first tap.
template <class T, class I>
__device__ __forceinline__ int winner(const Window<T, I>& win) {
  acc_t<T> best = to_acc(win.v[0]);
  int k = 0;
  for (int t = 1; t < 4; ++t) {
    const acc_t<T> a = to_acc(win.v[t]);
    if (a > best || a != a) best = a, k = t;
  }
  return k;
}

// Output i: the window's max, and its tap into arg.
template <class T, class Arg, class I>
__device__ __forceinline__ void forward_at(const T* x, I ow, I i, T* y, Arg* arg) {
  const Window<T, I> win = load<T, I>(x, i, ow);
  const int k = winner(win);
  y[i] = win.v[k];
  arg[i] = Arg(k);
}

// Output i's gradient g into its window of grad_x at tap k, zeros at the other three.
template <class T, class I>
__device__ __forceinline__ void scatter_at(I top, I ow, int k, T g, T* gx) {
  const T zero{};
  Vec<T, 2> a, b;
  a.v[0] = k == 0 ? g : zero, a.v[1] = k == 1 ? g : zero;
  b.v[0] = k == 2 ? g : zero, b.v[1] = k == 3 ? g : zero;
  *reinterpret_cast<Vec<T, 2>*>(gx + top) = a;
  *reinterpret_cast<Vec<T, 2>*>(gx + top + 2 * ow) = b;
}

// The backward of output i from the forward's argmax...
template <class T, class Arg, class I>
__device__ __forceinline__ void backward_at(const T* gy, const Arg* arg, I ow, I i, T* gx) {
  scatter_at<T, I>(top_of<I>(i, ow), ow, int(arg[i]), gy[i], gx);
}
// ...or from the pool's input, its winner found again by the forward's rule (the same bits).
template <class T, class I>
__device__ __forceinline__ void backward_from_input_at(const T* gy, const T* x, I ow, I i, T* gx) {
  const Window<T, I> win = load<T, I>(x, i, ow);
  scatter_at<T, I>(win.top, ow, winner(win), gy[i], gx);
}

}  // namespace mixprec::kernels::cuda::pool2x2
