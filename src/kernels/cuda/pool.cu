// GPU 2-d pooling (pool.h) over contiguous NCHW planes: max with argmax, average and adaptive
// average, forward and backward. One thread per output (forward) or per input element (backward:
// a gather over the windows that hold it, so no atomics and the same bits on every run), except
// max pooling's backward over windows that tile the input: a scatter from each output, which
// writes every input element once, and there from the input itself where the pool follows a ReLU.
// Max pooling's index arithmetic is int32 where the tensors allow it; f32 accumulation (f64 for
// f64). The window rules are pool_window.h's: avg_window and for_each_tap themselves (host and
// device); the max scan's comparison restated once (window_winner), as window_max is host-only
// (std::isnan, std::numeric_limits).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pool_2x2.cuh"
#include "kernels/cuda/pool_2x2_nhwc.cuh"
#include "kernels/pool.h"
#include "kernels/pool_window.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The geometry in index type I: int32 where every index of the call fits (a 64-bit division is
// several times the cost of a 32-bit one, and the index arithmetic is most of these kernels).
// PoolGeometry's field names, so pool_window.h's for_each_tap walks it too.
template <class I>
struct Geo {
  I h, w, oh, ow, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  explicit Geo(const PoolGeometry& g)
      : h(I(g.h)),
        w(I(g.w)),
        oh(I(g.oh)),
        ow(I(g.ow)),
        kh(I(g.kh)),
        kw(I(g.kw)),
        stride_h(I(g.stride_h)),
        stride_w(I(g.stride_w)),
        pad_h(I(g.pad_h)),
        pad_w(I(g.pad_w)),
        dil_h(I(g.dil_h)),
        dil_w(I(g.dil_w)) {}
};

// The winner of output (oy, ox)'s window in `plane`, as window_max scans it (a NaN propagates,
// the last NaN wins; ties keep the first tap): its tap ky * kw + kx, and its value in best_t; tap
// -1 for a window wholly in the padding. Both the forward and the backward from the input scan
// with this one function, so they find the same winners.
template <class T, class I>
__device__ __forceinline__ I window_winner(const T* plane, const Geo<I>& g, I oy, I ox, T& best_t) {
  using A = acc_t<T>;
  A best = A(0);
  best_t = T{};
  I best_k = -1;
  for_each_tap(g, oy, ox, [&](I ky, I kx, I iy, I ix) {
    const T vt = plane[iy * g.w + ix];
    const A v = to_acc(vt);
    if (best_k < 0 || v > best || v != v) {
      best = v;
      best_t = vt;
      best_k = ky * g.kw + kx;
    }
  });
  return best_k;
}

// Output (p, oy, ox) of each plane p: the window's max and its tap.
template <class T, class Arg, class I>
__global__ void max_forward_kernel(const T* x, Geo<I> g, I total, T* y, Arg* arg) {
  for (I i = I(global_thread()); i < total; i += I(grid_threads())) {
    const I ox = i % g.ow, oy = i / g.ow % g.oh, p = i / (g.ow * g.oh);
    T best_t;
    const I best_k = window_winner(x + p * g.h * g.w, g, oy, ox, best_t);
    // A window wholly in the padding (PyTorch forbids the geometry) keeps -inf, as window_max.
    y[i] = best_k < 0 ? from_acc<T>(-INFINITY) : best_t;
    arg[i] = Arg(best_k < 0 ? 0 : best_k);
  }
}

// Input element (p, iy, ix): the sum of the outputs whose argmax is it. The outputs whose window
// may hold it: oy from (iy + pad - (kh-1)*dil) / stride up to (iy + pad) / stride, the same in x;
// each checked for the tap that lands on the element.
template <class T, class Arg, class I>
__global__ void max_backward_kernel(const T* gy, const Arg* arg, Geo<I> g, I total, T* gx) {
  using A = acc_t<T>;
  for (I i = I(global_thread()); i < total; i += I(grid_threads())) {
    const I ix = i % g.w, iy = i / g.w % g.h, p = i / (g.w * g.h);
    const I out_base = p * g.oh * g.ow;
    A s = 0;
    for (I ky = 0; ky < g.kh; ++ky) {
      const I ty = iy + g.pad_h - ky * g.dil_h;  // oy * stride_h
      if (ty < 0) break;                         // larger ky only lowers ty
      const I oy = ty / g.stride_h;
      if (oy * g.stride_h != ty || oy >= g.oh) continue;
      for (I kx = 0; kx < g.kw; ++kx) {
        const I tx = ix + g.pad_w - kx * g.dil_w;
        if (tx < 0) break;
        const I ox = tx / g.stride_w;
        if (ox * g.stride_w != tx || ox >= g.ow) continue;
        const I o = out_base + oy * g.ow + ox;
        if (I(arg[o]) == ky * g.kw + kx) s += to_acc(gy[o]);
      }
    }
    gx[i] = from_acc<T>(s);
  }
}

// Where the winner of output o's window is, for the tiled backward: the forward's argmax...
template <class Arg, class I>
struct TapFromArgmax {
  const Arg* arg;
  __device__ I operator()(I o, I /*p*/, I /*oy*/, I /*ox*/) const { return I(arg[o]); }
};
// ...or found again in the pool's input x by the forward's own scan (max pooling after a ReLU,
// whose output is kept anyway): one pass over x instead of the forward kernel's transient argmax
// and a second launch, which took 0.75 ms of the wide cnn's 5.5 ms amp step on the H100
// (2026-11-27), against about 0.13 ms for the bytes.
template <class T, class I>
struct TapFromInput {
  const T* x;
  Geo<I> g;
  __device__ I operator()(I /*o*/, I p, I oy, I ox) const {
    T best_t;
    const I found = window_winner(x + p * g.h * g.w, g, oy, ox, best_t);
    return found < 0 ? 0 : found;  // as the forward's argmax (no padding here: never)
  }
};

// Windows that tile the input without overlap (stride = window, no padding, no dilation: the
// models' 2x2 pool): one thread per output writes its whole window, the gradient at the winning
// tap (tap_of) and zeros elsewhere, with two divisions per output instead of a gather's per input.
// Rows and columns past the last window (h or w not a multiple of the stride) are zeroed apart.
template <class T, class I, class TapOf>
__global__ void max_backward_tiled_kernel(const T* gy, TapOf tap_of, Geo<I> g, I total, T* gx) {
  for (I o = I(global_thread()); o < total; o += I(grid_threads())) {
    const I ox = o % g.ow, oy = o / g.ow % g.oh, p = o / (g.ow * g.oh);
    const I tap = tap_of(o, p, oy, ox);
    const T v = gy[o];
    T* window = gx + p * g.h * g.w + (oy * g.kh) * g.w + ox * g.kw;
    for (I ky = 0; ky < g.kh; ++ky)
      for (I kx = 0; kx < g.kw; ++kx) window[ky * g.w + kx] = ky * g.kw + kx == tap ? v : T{};
  }
}

// The 2x2 windows of stride 2 that tile exactly (pool_2x2.cuh): one thread per output.
template <class T, class Arg, class I>
__global__ void max2x2_forward_kernel(const T* x, I ow, I total, T* y, Arg* arg) {
  for (I i = I(global_thread()); i < total; i += I(grid_threads())) pool2x2::forward_at(x, ow, i, y, arg);
}
template <class T, class Arg, class I>
__global__ void max2x2_backward_kernel(const T* gy, const Arg* arg, I ow, I total, T* gx) {
  for (I i = I(global_thread()); i < total; i += I(grid_threads())) pool2x2::backward_at(gy, arg, ow, i, gx);
}
template <class T, class I>
__global__ void max2x2_backward_from_input_kernel(const T* gy, const T* x, I ow, I total, T* gx) {
  for (I i = I(global_thread()); i < total; i += I(grid_threads())) pool2x2::backward_from_input_at(gy, x, ow, i, gx);
}

// The same windows over channels-last bytes (pool_2x2_nhwc.cuh): one thread per V channels of an output pixel.
template <class T, class Arg, int V, class I>
__global__ void max2x2_nhwc_forward_kernel(const T* x, I c, I ow, I vectors, T* y, Arg* arg) {
  for (I j = I(global_thread()); j < vectors; j += I(grid_threads()))
    pool2x2_nhwc::forward_at<T, Arg, V, I>(x, c, ow, j, y, arg);
}
template <class T, class Arg, int V, class I>
__global__ void max2x2_nhwc_backward_kernel(const T* gy, const Arg* arg, I c, I ow, I vectors, T* gx) {
  for (I j = I(global_thread()); j < vectors; j += I(grid_threads()))
    pool2x2_nhwc::backward_at<T, Arg, V, I>(gy, arg, c, ow, j, gx);
}
template <class T, int V, class I>
__global__ void max2x2_nhwc_backward_from_input_kernel(const T* gy, const T* x, I c, I ow, I vectors, T* gx) {
  for (I j = I(global_thread()); j < vectors; j += I(grid_threads()))
    pool2x2_nhwc::backward_from_input_at<T, V, I>(gy, x, c, ow, j, gx);
}
// f with std::integral_constant<int, v> for v in {1, 2, 4, 8}.
template <class F>
void dispatch_lanes(int v, F&& f) {
  switch (v) {
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 1>{});
  }
}

bool tiles(const PoolGeometry& g) {
  return !g.adaptive && g.stride_h == g.kh && g.stride_w == g.kw && g.pad_h == 0 && g.pad_w == 0 && g.dil_h == 1 &&
         g.dil_w == 1 && g.oh * g.kh <= g.h && g.ow * g.kw <= g.w;
}

// The tiled backward into gx ([n, c, h, w], gx_bytes): the uncovered rows and columns zeroed, then
// every window written.
template <class T, class I, class TapOf>
void launch_tiled(const T* gy, TapOf tap_of, const PoolGeometry& g, T* gx, size_t gx_bytes, cudaStream_t stream) {
  if (g.oh * g.kh != g.h || g.ow * g.kw != g.w) MIXPREC_CUDA_CHECK(cudaMemsetAsync(gx, 0, gx_bytes, stream));
  const int64_t outputs = g.n * g.c * g.oh * g.ow;
  if (outputs > 0)
    max_backward_tiled_kernel<T, I>
        <<<blocks_for(outputs), kThreads, 0, stream>>>(gy, tap_of, Geo<I>(g), I(outputs), gx);
}

// Calls f(int32_t{}) where every index of the call fits in int32 with room to spare (the
// grid-stride step adds up to the element count once more), else f(int64_t{}).
template <class F>
void dispatch_index(const PoolGeometry& g, F&& f) {
  const int64_t most = std::max(g.n * g.c * g.h * g.w, g.n * g.c * g.oh * g.ow);
  const int64_t reach = (g.kh * g.dil_h + g.pad_h + g.h) * (g.kw * g.dil_w + g.pad_w + g.w);
  if (most < (int64_t(1) << 30) && reach < (int64_t(1) << 30))
    f(int32_t{});
  else
    f(int64_t{});
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

// Max pooling's argmax in two bits an output (pool.h): one thread per packed byte, each gathering
// its four taps (no two threads write one byte), and one per tap back.
__global__ void pack_2bit_kernel(const uint8_t* taps, int64_t n, uint8_t* packed) {
  const int64_t bytes = (n + 3) / 4;
  for (int64_t b = global_thread(); b < bytes; b += grid_threads()) {
    unsigned v = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * b + k < n) v |= (taps[4 * b + k] & 3u) << (2 * k);
    packed[b] = uint8_t(v);
  }
}

__global__ void unpack_2bit_kernel(const uint8_t* packed, int64_t n, uint8_t* taps) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) taps[i] = uint8_t(packed[i / 4] >> (2 * (i % 4)) & 3);
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
      dispatch_index(g, [&](auto index) {
        using I = decltype(index);
        const auto* xp = static_cast<const T*>(x.data_ptr());
        auto* yp = static_cast<T*>(r.dst.data_ptr());
        auto* argp = static_cast<Arg*>(r.argmax.data_ptr());
        if (pool2x2::takes(g, sizeof(T), xp, xp))
          max2x2_forward_kernel<T, Arg, I>
              <<<blocks_for(total), kThreads, 0, on.stream()>>>(xp, I(g.ow), I(total), yp, argp);
        else
          max_forward_kernel<T, Arg, I>
              <<<blocks_for(total), kThreads, 0, on.stream()>>>(xp, Geo<I>(g), I(total), yp, argp);
      });
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
      dispatch_index(g, [&](auto index) {
        using I = decltype(index);
        const auto* gyp = static_cast<const T*>(gy.data_ptr());
        const auto* argp = static_cast<const Arg*>(argmax.data_ptr());
        auto* gxp = static_cast<T*>(gx.data_ptr());
        const int64_t outputs = gy.numel();
        if (pool2x2::takes(g, sizeof(T), gxp, gxp)) {
          max2x2_backward_kernel<T, Arg, I>
              <<<blocks_for(outputs), kThreads, 0, on.stream()>>>(gyp, argp, I(g.ow), I(outputs), gxp);
        } else if (tiles(g)) {
          launch_tiled<T, I>(gyp, TapFromArgmax<Arg, I>{argp}, g, gxp, gx.nbytes(), on.stream());
        } else {
          max_backward_kernel<T, Arg, I>
              <<<blocks_for(total), kThreads, 0, on.stream()>>>(gyp, argp, Geo<I>(g), I(total), gxp);
        }
      });
    });
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return gx;
}

Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x_in, const PoolGeometry& g) {
  const Tensor x = kernels::contig(x_in);
  // Windows that overlap or leave gaps, or a gradient of another dtype: the forward kernel's
  // argmax (one byte per output, freed on return) and the backward kernel, the same two kernels as
  // the argmax form, so the same result.
  if (!tiles(g) || grad_y.dtype() != x.dtype())
    return cuda::max_pool2d_backward(grad_y, cuda::max_pool2d_forward(x, g).argmax, g);
  const Tensor gy = kernels::contig(grad_y);
  const Launch on(gy);
  Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, gy.dtype(), gy.device());
  if (gx.numel() == 0) return gx;
  dispatch_floating(gy.dtype(), [&](auto t) {
    using T = decltype(t);
    dispatch_index(g, [&](auto index) {
      using I = decltype(index);
      const auto* gyp = static_cast<const T*>(gy.data_ptr());
      const auto* xp = static_cast<const T*>(x.data_ptr());
      auto* gxp = static_cast<T*>(gx.data_ptr());
      const int64_t outputs = gy.numel();
      if (pool2x2::takes(g, sizeof(T), gxp, xp))
        max2x2_backward_from_input_kernel<T, I>
            <<<blocks_for(outputs), kThreads, 0, on.stream()>>>(gyp, xp, I(g.ow), I(outputs), gxp);
      else
        launch_tiled<T, I>(gyp, TapFromInput<T, I>{xp, Geo<I>(g)}, g, gxp, gx.nbytes(), on.stream());
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

Tensor pack_argmax_2bit(const Tensor& argmax_in) {
  const Tensor argmax = kernels::contig(argmax_in);
  const Launch on(argmax);
  const int64_t n = argmax.numel();
  Tensor packed = Tensor::empty({(n + 3) / 4}, DType::u8, argmax.device());
  if (n == 0) return packed;
  pack_2bit_kernel<<<blocks_for(packed.numel()), kThreads, 0, on.stream()>>>(
      static_cast<const uint8_t*>(argmax.data_ptr()), n, static_cast<uint8_t*>(packed.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
  return packed;
}

Tensor unpack_argmax_2bit(const Tensor& packed_in, const Shape& shape) {
  const Tensor packed = kernels::contig(packed_in);
  const Launch on(packed);
  Tensor argmax = Tensor::empty(shape, DType::u8, packed.device());
  const int64_t n = argmax.numel();
  if (n == 0) return argmax;
  unpack_2bit_kernel<<<blocks_for(n), kThreads, 0, on.stream()>>>(static_cast<const uint8_t*>(packed.data_ptr()), n,
                                                                  static_cast<uint8_t*>(argmax.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
  return argmax;
}

namespace {
// Launches the NHWC 2x2 kernels over `outputs` pooled elements of dtype t: launch(T{}, lanes,
// index, vectors) with V channels a thread, the most pool2x2_nhwc::lanes allows for ptrs. The
// callers have checked pool2x2::tiles_exactly.
template <class F>
void launch_nhwc(DType t, const PoolGeometry& g, int64_t outputs, std::initializer_list<const void*> ptrs, F&& launch) {
  dispatch_floating(t, [&](auto tag) {
    using T = decltype(tag);
    const int v = pool2x2_nhwc::lanes<T>(g, ptrs);
    const int64_t vectors = outputs / v;
    if (vectors == 0) return;
    dispatch_lanes(v, [&](auto lanes) {
      constexpr int V = decltype(lanes)::value;
      if constexpr (V * sizeof(T) <= 16) dispatch_index(g, [&](auto index) { launch(tag, lanes, index, vectors); });
    });
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
}
}  // namespace

bool max_pool2d_forward_nhwc(const Tensor& x, const PoolGeometry& g, MaxPoolResult& r) {
  MIXPREC_ASSERT(kernels::nhwc_dense(x), "max_pool2d_forward_nhwc: input not channels-last");
  if (!pool2x2::tiles_exactly(g) || g.argmax_dtype() != DType::u8) return false;
  const Launch on(x);
  r.dst = kernels::empty_channels_last({g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  r.argmax = kernels::empty_channels_last({g.n, g.c, g.oh, g.ow}, DType::u8, x.device());
  launch_nhwc(
      x.dtype(), g, r.dst.numel(), {x.data_ptr(), r.dst.data_ptr()}, [&](auto t, auto lanes, auto index, int64_t n) {
        using T = decltype(t);
        using I = decltype(index);
        max2x2_nhwc_forward_kernel<T, uint8_t, decltype(lanes)::value, I><<<blocks_for(n), kThreads, 0, on.stream()>>>(
            static_cast<const T*>(x.data_ptr()), I(g.c), I(g.ow), I(n), static_cast<T*>(r.dst.data_ptr()),
            static_cast<uint8_t*>(r.argmax.data_ptr()));
      });
  return true;
}

bool max_pool2d_backward_nhwc(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x) {
  MIXPREC_ASSERT(kernels::nhwc_dense(grad_y) && kernels::nhwc_dense(argmax), "max_pool2d_backward_nhwc: layouts");
  if (!pool2x2::tiles_exactly(g) || argmax.dtype() != DType::u8) return false;
  const Launch on(grad_y);
  grad_x = kernels::empty_channels_last({g.n, g.c, g.h, g.w}, grad_y.dtype(), grad_y.device());
  launch_nhwc(grad_y.dtype(), g, grad_y.numel(), {grad_y.data_ptr(), grad_x.data_ptr()},
              [&](auto t, auto lanes, auto index, int64_t n) {
                using T = decltype(t);
                using I = decltype(index);
                max2x2_nhwc_backward_kernel<T, uint8_t, decltype(lanes)::value, I>
                    <<<blocks_for(n), kThreads, 0, on.stream()>>>(
                        static_cast<const T*>(grad_y.data_ptr()), static_cast<const uint8_t*>(argmax.data_ptr()),
                        I(g.c), I(g.ow), I(n), static_cast<T*>(grad_x.data_ptr()));
              });
  return true;
}

bool max_pool2d_backward_from_input_nhwc(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g, Tensor& grad_x) {
  MIXPREC_ASSERT(kernels::nhwc_dense(grad_y) && kernels::nhwc_dense(x), "max_pool2d_backward_from_input_nhwc");
  if (!pool2x2::tiles_exactly(g) || grad_y.dtype() != x.dtype()) return false;
  const Launch on(grad_y);
  grad_x = kernels::empty_channels_last({g.n, g.c, g.h, g.w}, grad_y.dtype(), grad_y.device());
  launch_nhwc(grad_y.dtype(), g, grad_y.numel(), {grad_y.data_ptr(), x.data_ptr(), grad_x.data_ptr()},
              [&](auto t, auto lanes, auto index, int64_t n) {
                using T = decltype(t);
                using I = decltype(index);
                max2x2_nhwc_backward_from_input_kernel<T, decltype(lanes)::value, I>
                    <<<blocks_for(n), kThreads, 0, on.stream()>>>(static_cast<const T*>(grad_y.data_ptr()),
                                                                  static_cast<const T*>(x.data_ptr()), I(g.c), I(g.ow),
                                                                  I(n), static_cast<T*>(grad_x.data_ptr()));
              });
  return true;
}

}  // namespace mixprec::kernels::cuda
