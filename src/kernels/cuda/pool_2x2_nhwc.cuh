// Max pooling's 2x2 window of stride 2 over channels-last bytes (kernels/shape.h: an [N, C, H, W]
// tensor laid out [N, H, W, C]), the layout the cnns run in with --channels-last: a thread takes
// V adjacent channels of one output pixel, so a warp reads and writes whole lines along C, and
// the four taps of a window are four V-element loads (C apart, and a row of W C apart). The
// taps, the winner rule and the scatter are pool_2x2.cuh's, per channel, so each output's max,
// tap and gradient are the NCHW kernels' (and the reference's) bit for bit. The per-vector
// functions are the kernels' bodies; pool.cu launches them, and tests/emulated/ runs them on the
// CPU against the reference kernels.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/pool_2x2.cuh"

namespace mixprec::kernels::cuda::pool2x2_nhwc {

// The channels a thread takes: the most of 16 bytes' worth (8 for 16-bit types, 4 for f32, 2 for
// f64) that divides C and to which every T pointer is aligned, down to 1 (the argmax is read and
// written a byte at a time). 0: the geometry is not an exact 2x2 tiling (pool2x2::tiles_exactly),
// so the kernels do not take it.
template <class T>
inline int lanes(const PoolGeometry& g, std::initializer_list<const void*> ptrs) {
  if (!pool2x2::tiles_exactly(g)) return 0;
  for (int v = int(16 / sizeof(T)); v > 1; v /= 2) {
    bool ok = g.c % v == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % (size_t(v) * sizeof(T)) == 0;
    if (ok) return v;
  }
  return 1;
}

// Output vector j: V channels of one output pixel. Its place in x: the window's top-left tap.
template <class I>
struct Place {
  I out;  // the vector's first element in y, argmax and grad_y
  I top;  // its window's tap 0 in x and grad_x; tap 1 is C after, taps 2 and 3 a row (2 ow C) after those
};
template <int V, class I>
__device__ __forceinline__ Place<I> place_of(I j, I c, I ow) {
  const I cv = c / V;                                         // vectors a pixel
  const I r = j / cv, l = j - r * cv;                         // output pixel (over n, oy, ox) and vector in it
  const I q = r / ow, ox = r - q * ow;                        // output row across the batch (n oh + oy) and column
  return {r * c + l * V, (4 * q * ow + 2 * ox) * c + l * V};  // input row 2q of width 2 ow
}

template <class T, int V, class I>
__device__ __forceinline__ void load(const T* x, const Place<I>& p, I c, I ow, Vec<T, V> (&tap)[4]) {
  const I row = 2 * ow * c;
  tap[0] = *reinterpret_cast<const Vec<T, V>*>(x + p.top);
  tap[1] = *reinterpret_cast<const Vec<T, V>*>(x + p.top + c);
  tap[2] = *reinterpret_cast<const Vec<T, V>*>(x + p.top + row);
  tap[3] = *reinterpret_cast<const Vec<T, V>*>(x + p.top + row + c);
}
template <class T, int V, class I>
__device__ __forceinline__ int winner_of(const Vec<T, V> (&tap)[4], int lane) {
  pool2x2::Window<T, I> win;
  for (int t = 0; t < 4; ++t) win.v[t] = tap[t].v[lane];
  return pool2x2::winner(win);
}

// Vector j's max and tap.
template <class T, class Arg, int V, class I>
__device__ __forceinline__ void forward_at(const T* x, I c, I ow, I j, T* y, Arg* arg) {
  const Place<I> p = place_of<V, I>(j, c, ow);
  Vec<T, V> tap[4];
  load<T, V, I>(x, p, c, ow, tap);
  Vec<T, V> best;
  for (int l = 0; l < V; ++l) {
    const int k = winner_of<T, V, I>(tap, l);
    best.v[l] = tap[k].v[l];
    arg[p.out + l] = Arg(k);
  }
  *reinterpret_cast<Vec<T, V>*>(y + p.out) = best;
}

// Vector j's gradient into its four taps of grad_x, each lane's at its winning tap, zeros elsewhere.
template <class T, int V, class I>
__device__ __forceinline__ void scatter(const Place<I>& p, I c, I ow, const int (&k)[V], const Vec<T, V>& g, T* gx) {
  const I row = 2 * ow * c;
  const I at[4] = {p.top, p.top + c, p.top + row, p.top + row + c};
  for (int t = 0; t < 4; ++t) {
    Vec<T, V> out;
    for (int l = 0; l < V; ++l) out.v[l] = k[l] == t ? g.v[l] : T{};
    *reinterpret_cast<Vec<T, V>*>(gx + at[t]) = out;
  }
}

// The backward of vector j from the forward's argmax...
template <class T, class Arg, int V, class I>
__device__ __forceinline__ void backward_at(const T* gy, const Arg* arg, I c, I ow, I j, T* gx) {
  const Place<I> p = place_of<V, I>(j, c, ow);
  int k[V];
  for (int l = 0; l < V; ++l) k[l] = int(arg[p.out + l]);
  scatter<T, V, I>(p, c, ow, k, *reinterpret_cast<const Vec<T, V>*>(gy + p.out), gx);
}
// ...or from the pool's input, each lane's winner found again by the forward's rule (the same bits).
template <class T, int V, class I>
__device__ __forceinline__ void backward_from_input_at(const T* gy, const T* x, I c, I ow, I j, T* gx) {
  const Place<I> p = place_of<V, I>(j, c, ow);
  Vec<T, V> tap[4];
  load<T, V, I>(x, p, c, ow, tap);
  int k[V];
  for (int l = 0; l < V; ++l) k[l] = winner_of<T, V, I>(tap, l);
  scatter<T, V, I>(p, c, ow, k, *reinterpret_cast<const Vec<T, V>*>(gy + p.out), gx);
}

}  // namespace mixprec::kernels::cuda::pool2x2_nhwc
