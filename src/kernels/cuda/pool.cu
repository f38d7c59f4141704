// GPU 2-d pooling (pool.h) over contiguous NCHW planes: max with argmax, average and adaptive
// average, forward and backward. One thread per output (forward) or per input element (backward:
// a gather over the windows that hold it, so no atomics and the same bits on every run); f32
// accumulation (f64 for f64). The window rules are pool_window.h's: avg_window itself (host and
// device); the max scan restated inline, as window_max takes a host lambda.
#include "kernels/cuda/common.cuh"
#include "kernels/pool.h"
#include "kernels/pool_window.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Output (p, oy, ox) of each plane p: the window's max as window_max scans it (a NaN propagates,
// the last NaN wins; ties keep the first tap) and its tap ky * kw + kx.
template <class T, class Arg>
__global__ void max_forward_kernel(const T* x, PoolGeometry g, int64_t total, T* y, Arg* arg) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t ox = i % g.ow, oy = i / g.ow % g.oh, p = i / (g.ow * g.oh);
    const T* plane = x + p * g.h * g.w;
    A best = A(0);
    T best_t = T{};
    int64_t best_k = -1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dil_h;
      if (iy < 0 || iy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = ox * g.stride_w - g.pad_w + kx * g.dil_w;
        if (ix < 0 || ix >= g.w) continue;
        const T vt = plane[iy * g.w + ix];
        const A v = to_acc(vt);
        if (best_k < 0 || v > best || v != v) {
          best = v;
          best_t = vt;
          best_k = ky * g.kw + kx;
        }
      }
    }
    // A window wholly in the padding (PyTorch forbids the geometry) keeps -inf, as window_max.
    y[i] = best_k < 0 ? from_acc<T>(-INFINITY) : best_t;
    arg[i] = Arg(best_k < 0 ? 0 : best_k);
  }
}

// Input element (p, iy, ix): the sum of the outputs whose argmax is it.
template <class T, class Arg>
__global__ void max_backward_kernel(const T* gy, const Arg* arg, PoolGeometry g, int64_t total, T* gx) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t ix = i % g.w, iy = i / g.w % g.h, p = i / (g.w * g.h);
    const int64_t out_base = p * g.oh * g.ow;
    A s = 0;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t ty = iy + g.pad_h - ky * g.dil_h;  // oy * stride_h
      if (ty < 0 || ty % g.stride_h != 0 || ty / g.stride_h >= g.oh) continue;
      const int64_t oy = ty / g.stride_h;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t tx = ix + g.pad_w - kx * g.dil_w;
        if (tx < 0 || tx % g.stride_w != 0 || tx / g.stride_w >= g.ow) continue;
        const int64_t o = out_base + oy * g.ow + tx / g.stride_w;
        if (int64_t(arg[o]) == ky * g.kw + kx) s += to_acc(gy[o]);
      }
    }
    gx[i] = from_acc<T>(s);
  }
}

template <class T>
__global__ void avg_forward_kernel(const T* x, PoolGeometry g, int64_t total, T* y) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t ox = i % g.ow, oy = i / g.ow % g.oh, p = i / (g.ow * g.oh);
    const T* plane = x + p * g.h * g.w;
    const AvgWindow win = avg_window(g, oy, ox);
    A s = 0;
    for (int64_t iy = win.y0; iy < win.y1; ++iy)
      for (int64_t ix = win.x0; ix < win.x1; ++ix) s += to_acc(plane[iy * g.w + ix]);
    y[i] = from_acc<T>(s / A(win.divisor));
  }
}

// Input element (p, iy, ix): the shares of every output window that covers it. The outputs to
// visit: a range around iy / stride (any window covering iy starts within kh rows before it; an
// adaptive window within ceil(h / oh) + 1 outputs), each checked against its own window.
template <class T>
__global__ void avg_backward_kernel(const T* gy, PoolGeometry g, int64_t total, int64_t span_y, int64_t span_x, T* gx) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t ix = i % g.w, iy = i / g.w % g.h, p = i / (g.w * g.h);
    const T* plane = gy + p * g.oh * g.ow;
    int64_t oy0, oy1, ox0, ox1;
    if (g.adaptive) {
      oy0 = max64(iy * g.oh / g.h - span_y, 0), oy1 = min64(iy * g.oh / g.h + span_y + 1, g.oh);
      ox0 = max64(ix * g.ow / g.w - span_x, 0), ox1 = min64(ix * g.ow / g.w + span_x + 1, g.ow);
    } else {
      oy0 = max64((iy + g.pad_h - g.kh + g.stride_h) / g.stride_h, 0),
      oy1 = min64((iy + g.pad_h) / g.stride_h + 1, g.oh);
      ox0 = max64((ix + g.pad_w - g.kw + g.stride_w) / g.stride_w, 0),
      ox1 = min64((ix + g.pad_w) / g.stride_w + 1, g.ow);
    }
    A s = 0;
    for (int64_t oy = oy0; oy < oy1; ++oy)
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const AvgWindow win = avg_window(g, oy, ox);
        if (iy >= win.y0 && iy < win.y1 && ix >= win.x0 && ix < win.x1)
          s += to_acc(plane[oy * g.ow + ox]) / A(win.divisor);
      }
    gx[i] = from_acc<T>(s);
  }
}

template <class F>
void dispatch_arg(DType t, F&& f) {
  if (t == DType::u8)
    f(uint8_t{});
  else
    f(int64_t{});
}

}  // namespace

MaxPoolResult max_pool2d_forward(const Tensor& x_in, const PoolGeometry& g) {
  const Tensor x = kernels::contig(x_in);
  const Launch on(x);
  MaxPoolResult r;
  r.dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  r.argmax = Tensor::empty({g.n, g.c, g.oh, g.ow}, g.argmax_dtype(), x.device());
  const int64_t total = r.dst.numel();
  if (total == 0) return r;
  dispatch_floating(x.dtype(), [&](auto t) {
    using T = decltype(t);
    dispatch_arg(r.argmax.dtype(), [&](auto a) {
      using Arg = decltype(a);
      max_forward_kernel<T, Arg><<<blocks_for(total), kThreads, 0, on.stream()>>>(
          static_cast<const T*>(x.data_ptr()), g, total, static_cast<T*>(r.dst.data_ptr()),
          static_cast<Arg*>(r.argmax.data_ptr()));
    });
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return r;
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax_in, const PoolGeometry& g) {
  const Tensor gy = kernels::contig(grad_y), argmax = kernels::contig(argmax_in);
  const Launch on(gy);
  Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, gy.dtype(), gy.device());
  const int64_t total = gx.numel();
  if (total == 0) return gx;
  dispatch_floating(gy.dtype(), [&](auto t) {
    using T = decltype(t);
    dispatch_arg(argmax.dtype(), [&](auto a) {
      using Arg = decltype(a);
      max_backward_kernel<T, Arg><<<blocks_for(total), kThreads, 0, on.stream()>>>(
          static_cast<const T*>(gy.data_ptr()), static_cast<const Arg*>(argmax.data_ptr()), g, total,
          static_cast<T*>(gx.data_ptr()));
    });
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return gx;
}

Tensor avg_pool2d_forward(const Tensor& x_in, const PoolGeometry& g) {
  const Tensor x = kernels::contig(x_in);
  const Launch on(x);
  Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  const int64_t total = y.numel();
  if (total == 0) return y;
  dispatch_floating(x.dtype(), [&](auto t) {
    using T = decltype(t);
    avg_forward_kernel<T><<<blocks_for(total), kThreads, 0, on.stream()>>>(static_cast<const T*>(x.data_ptr()), g,
                                                                           total, static_cast<T*>(y.data_ptr()));
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g) {
  const Tensor gy = kernels::contig(grad_y);
  const Launch on(gy);
  Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, gy.dtype(), gy.device());
  const int64_t total = gx.numel();
  if (total == 0) return gx;
  // Adaptive: every output window holding iy lies within ceil(h / oh) + ceil(oh / h) + 1 outputs
  // of iy * oh / h (a superset: each candidate is checked against its own window).
  const auto span = [](int64_t in, int64_t out) {
    return out > 0 && in > 0 ? (in + out - 1) / out + (out + in - 1) / in + 1 : 0;
  };
  const int64_t span_y = g.adaptive ? span(g.h, g.oh) : 0, span_x = g.adaptive ? span(g.w, g.ow) : 0;
  dispatch_floating(gy.dtype(), [&](auto t) {
    using T = decltype(t);
    avg_backward_kernel<T><<<blocks_for(total), kThreads, 0, on.stream()>>>(
        static_cast<const T*>(gy.data_ptr()), g, total, span_y, span_x, static_cast<T*>(gx.data_ptr()));
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return gx;
}

}  // namespace mixprec::kernels::cuda
