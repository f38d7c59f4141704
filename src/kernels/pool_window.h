// Window rules shared by the reference and fast pooling kernels and the reference convolution:
// the taps of a sliding window, the max of a window (PyTorch's scan), the average-pooling window.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/host_device.h"
#include "kernels/conv.h"
#include "kernels/pool.h"

namespace mixprec::kernels {

// Calls f(ky, kx, iy, ix) for every tap of output (oy, ox)'s window that lands inside the input
// (taps on the padding are skipped), in row-major tap order. Geometry: PoolGeometry or
// ConvGeometry (the same field names; int64_t indices), or the CUDA pool kernels' Geo (int32 where
// the call allows): the index type is the geometry's.
template <class Geometry, class F>
MIXPREC_HOST_DEVICE inline void for_each_tap(const Geometry& g, decltype(g.h) oy, decltype(g.h) ox, F&& f) {
  using I = decltype(g.h);
  for (I ky = 0; ky < g.kh; ++ky) {
    const I iy = oy * g.stride_h - g.pad_h + ky * g.dil_h;
    if (iy < 0 || iy >= g.h) continue;
    for (I kx = 0; kx < g.kw; ++kx) {
      const I ix = ox * g.stride_w - g.pad_w + kx * g.dil_w;
      if (ix < 0 || ix >= g.w) continue;
      f(ky, kx, iy, ix);
    }
  }
}

// The max of output (oy, ox)'s window over one [h, w] plane and its tap (ky * kw + kx), as
// PyTorch's scan: a NaN propagates (the last NaN of the window wins), ties keep the first.
template <class T>
inline std::pair<T, int64_t> window_max(const T* plane, const PoolGeometry& g, int64_t oy, int64_t ox) {
  T best = -std::numeric_limits<T>::infinity();
  int64_t best_k = -1;
  for_each_tap(g, oy, ox, [&](int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
    const T v = plane[iy * g.w + ix];
    if (best_k < 0 || v > best || std::isnan(v)) {
      best = v;
      best_k = ky * g.kw + kx;
    }
  });
  return {best, best_k};
}

// Input rows [y0, y1) and columns [x0, x1) of output (oy, ox), and what their sum is divided by.
struct AvgWindow {
  int64_t y0, y1, x0, x1, divisor;
};

// Host and device (the CUDA pooling kernels use it too): plain comparisons, no std::min/max.
MIXPREC_HOST_DEVICE inline AvgWindow avg_window(const PoolGeometry& g, int64_t oy, int64_t ox) {
  AvgWindow win{};
  if (g.adaptive) {
    // floor(i*h/oh) .. ceil((i+1)*h/oh)
    win.y0 = oy * g.h / g.oh;
    win.y1 = ((oy + 1) * g.h + g.oh - 1) / g.oh;
    win.x0 = ox * g.w / g.ow;
    win.x1 = ((ox + 1) * g.w + g.ow - 1) / g.ow;
    win.divisor = (win.y1 - win.y0) * (win.x1 - win.x0);
    return win;
  }
  // The window may hang over the padding (counted when count_include_pad) and, in ceil mode, past
  // it (never counted): PyTorch clips the end to h + pad before taking the size.
  const int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
  const int64_t y1 = y0 + g.kh < g.h + g.pad_h ? y0 + g.kh : g.h + g.pad_h;
  const int64_t x1 = x0 + g.kw < g.w + g.pad_w ? x0 + g.kw : g.w + g.pad_w;
  const int64_t padded = (y1 - y0) * (x1 - x0);
  win.y0 = y0 > 0 ? y0 : 0;
  win.x0 = x0 > 0 ? x0 : 0;
  win.y1 = y1 < g.h ? y1 : g.h;
  win.x1 = x1 < g.w ? x1 : g.w;
  win.divisor = g.count_include_pad ? padded : (win.y1 - win.y0) * (win.x1 - win.x0);
  return win;
}

// One [h, w] plane of each pooling pass, in T arithmetic (double in the reference, float in the
// fast kernels). The backward passes accumulate into gx, which the caller zeroes.
template <class T, class Arg>
inline void max_plane_forward(const T* src, const PoolGeometry& g, T* out, Arg* arg) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const auto [best, best_k] = window_max(src, g, oy, ox);
      out[oy * g.ow + ox] = best;
      arg[oy * g.ow + ox] = Arg(best_k);
    }
}

template <class T>
inline void avg_plane_forward(const T* src, const PoolGeometry& g, T* out) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const AvgWindow win = avg_window(g, oy, ox);
      T s = 0;
      for (int64_t iy = win.y0; iy < win.y1; ++iy)
        for (int64_t ix = win.x0; ix < win.x1; ++ix) s += src[iy * g.w + ix];
      out[oy * g.ow + ox] = s / T(win.divisor);
    }
}

template <class T>
inline void avg_plane_backward(const T* gy, const PoolGeometry& g, T* gx) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const AvgWindow win = avg_window(g, oy, ox);
      const T share = gy[oy * g.ow + ox] / T(win.divisor);
      for (int64_t iy = win.y0; iy < win.y1; ++iy)
        for (int64_t ix = win.x0; ix < win.x1; ++ix) gx[iy * g.w + ix] += share;
    }
}

// arg holds each output's window tap (ky * kw + kx), as window_max gives it.
template <class T, class Arg>
inline void max_plane_backward(const T* gy, const Arg* arg, const PoolGeometry& g, T* gx) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const int64_t k = int64_t(arg[oy * g.ow + ox]), ky = k / g.kw, kx = k % g.kw;
      gx[(oy * g.stride_h - g.pad_h + ky * g.dil_h) * g.w + ox * g.stride_w - g.pad_w + kx * g.dil_w] +=
          gy[oy * g.ow + ox];
    }
}

}  // namespace mixprec::kernels
