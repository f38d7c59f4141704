// GPU batch and layer normalisation (norm.h), with the reference's semantics: two-pass statistics
// (the mean, then squared deviations), f32 accumulation (f64 for f64) with per-thread partial sums
// combined in f64 in a fixed order (deterministic, as the CPU combines plane sums in f64);
// weight/bias widened to the statistics dtype first. One block per channel (batch norm) or per
// row (layer norm) for the reductions; element-wise passes grid-stride, 16-byte loads where the
// planes allow. Layer norm over rows that fit a warp's registers runs layer_norm_warp.cuh's
// kernels instead (f32 sums combined in a fixed order there too).
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm_warp.cuh"
#include "kernels/norm.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

constexpr int kReduceThreads = 512;

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }
// A per-channel (or per-column) parameter in the statistics dtype, contiguous; undefined stays so.
Tensor param(const Tensor& t, DType st) {
  if (!t.defined()) return t;
  return t.dtype() == st ? kernels::contig(t) : kernels::cast(t, st);
}
template <class A>
const A* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
}

// x as [outer, channels, inner]: element (o, c, i) at (o * channels + c) * inner + i.
struct Nci {
  int64_t outer, channels, inner;
};

// ---------------------------------------------------------------------------------- batch norm

// Block c: mean and biased variance of channel c, two passes.
template <class T>
__global__ void bn_stats_kernel(const T* x, Nci d, acc_t<T>* mean, acc_t<T>* var) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x, count = d.outer * d.inner;
  A s = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
    s += to_acc(x[(j / d.inner * d.channels + c) * d.inner + j % d.inner]);
  const A mu = A(block_reduce<double>(double(s), SumOp{}, 0.0, scratch) / double(count));
  A ss = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const A e = to_acc(x[(j / d.inner * d.channels + c) * d.inner + j % d.inner]) - mu;
    ss += e * e;
  }
  const double v = block_reduce<double>(double(ss), SumOp{}, 0.0, scratch) / double(count);
  if (threadIdx.x == 0) mean[c] = mu, var[c] = A(v);
}

// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c], kVec elements of one channel per step
// (kVec divides inner).
template <class T, int kVec>
__global__ void bn_forward_kernel(const T* x, Nci d, const acc_t<T>* mean, const acc_t<T>* invstd,
                                  const acc_t<T>* weight, const acc_t<T>* bias, T* y) {
  using A = acc_t<T>;
  using V = Vec<T, kVec>;
  const int64_t nv = d.outer * d.channels * d.inner / kVec;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) {
    const int64_t c = i * kVec / d.inner % d.channels;
    const A m = mean[c], is = invstd[c], w = weight ? weight[c] : A(1), b = bias ? bias[c] : A(0);
    const V in = reinterpret_cast<const V*>(x)[i];
    V out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = from_acc<T>((to_acc(in.v[k]) - m) * is * w + b);
    reinterpret_cast<V*>(y)[i] = out;
  }
}

// Block c: sum(dy) and sum(dy * xhat) over channel c.
template <class T>
__global__ void bn_backward_sums_kernel(const T* gy, const T* x, Nci d, const acc_t<T>* mean, const acc_t<T>* invstd,
                                        acc_t<T>* sum_dy, acc_t<T>* sum_dy_xhat) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x, count = d.outer * d.inner;
  const A m = mean[c], is = invstd[c];
  A s = 0, sx = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t at = (j / d.inner * d.channels + c) * d.inner + j % d.inner;
    const A g = to_acc(gy[at]);
    s += g;
    sx += g * (to_acc(x[at]) - m) * is;
  }
  const double total = block_reduce<double>(double(s), SumOp{}, 0.0, scratch);
  const double total_x = block_reduce<double>(double(sx), SumOp{}, 0.0, scratch);
  if (threadIdx.x == 0) sum_dy[c] = A(total), sum_dy_xhat[c] = A(total_x);
}

// grad_x; training: the batch statistics' dependence on x removes the mean of dy and its part
// along xhat.
template <class T, int kVec>
__global__ void bn_backward_x_kernel(const T* gy, const T* x, Nci d, const acc_t<T>* mean, const acc_t<T>* invstd,
                                     const acc_t<T>* weight, const acc_t<T>* sum_dy, const acc_t<T>* sum_dy_xhat,
                                     bool training, T* gx) {
  using A = acc_t<T>;
  using V = Vec<T, kVec>;
  const A count = A(d.outer * d.inner);
  const int64_t nv = d.outer * d.channels * d.inner / kVec;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) {
    const int64_t c = i * kVec / d.inner % d.channels;
    const A m = mean[c], is = invstd[c], w = weight ? weight[c] : A(1);
    const A mean_dy = sum_dy[c] / count, mean_dy_xhat = sum_dy_xhat[c] / count;
    const V g = reinterpret_cast<const V*>(gy)[i], xv = reinterpret_cast<const V*>(x)[i];
    V out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const A dy = to_acc(g.v[k]), xhat = (to_acc(xv.v[k]) - m) * is;
      out.v[k] = from_acc<T>(training ? w * is * (dy - mean_dy - xhat * mean_dy_xhat) : w * is * dy);
    }
    reinterpret_cast<V*>(gx)[i] = out;
  }
}

// The vector width for planes of `inner` elements: 16 bytes where inner and every pointer allow.
template <class T>
int vec_width(int64_t inner, std::initializer_list<const void*> ptrs) {
  constexpr int v = kVec16<T>;
  if (inner % v != 0) return 1;
  for (const void* p : ptrs)
    if (!aligned_to(p, 16)) return 1;
  return v;
}

// ---------------------------------------------------------------------------------- layer norm

// Block r: mean and rstd of row r, then y (and x̂ in U where xhat is not null).
template <class T, class U>
__global__ void ln_forward_kernel(const T* x, int64_t cols, double eps, const acc_t<T>* weight, const acc_t<T>* bias,
                                  T* y, acc_t<T>* mean, acc_t<T>* rstd, U* xhat) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  const T* row = x + int64_t(blockIdx.x) * cols;
  A s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += to_acc(row[j]);
  const A mu = A(block_reduce<double>(double(s), SumOp{}, 0.0, scratch) / double(cols));
  A ss = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A e = to_acc(row[j]) - mu;
    ss += e * e;
  }
  const A inv = A(1.0 / sqrt(block_reduce<double>(double(ss), SumOp{}, 0.0, scratch) / double(cols) + eps));
  T* out = y + int64_t(blockIdx.x) * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    out[j] = from_acc<T>((to_acc(row[j]) - mu) * inv * (weight ? weight[j] : A(1)) + (bias ? bias[j] : A(0)));
  if (xhat)
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      xhat[int64_t(blockIdx.x) * cols + j] = from_acc<U>((to_acc(row[j]) - mu) * inv);
  if (threadIdx.x == 0) mean[blockIdx.x] = mu, rstd[blockIdx.x] = inv;
}

// Block r: grad_x of row r.
template <class T>
__global__ void ln_backward_x_kernel(const T* gy, const T* x, int64_t cols, const acc_t<T>* mean, const acc_t<T>* rstd,
                                     const acc_t<T>* weight, T* gx) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  const T *grow = gy + r * cols, *xrow = x + r * cols;
  // Without a mean, x is x̂ already: mean 0 and scale 1 for it, rstd only in grad_x.
  const A m = mean ? mean[r] : A(0), rs = rstd[r], xs = mean ? rs : A(1);
  A s = 0, sx = 0;  // of g = dy * w over the row
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A g = to_acc(grow[j]) * (weight ? weight[j] : A(1));
    s += g;
    sx += g * (to_acc(xrow[j]) - m) * xs;
  }
  const A mean_g = A(block_reduce<double>(double(s), SumOp{}, 0.0, scratch) / double(cols));
  const A mean_g_xhat = A(block_reduce<double>(double(sx), SumOp{}, 0.0, scratch) / double(cols));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A xhat = (to_acc(xrow[j]) - m) * xs;
    gx[r * cols + j] = from_acc<T>(rs * (to_acc(grow[j]) * (weight ? weight[j] : A(1)) - mean_g - xhat * mean_g_xhat));
  }
}

// grad_weight[j] = sum_r dy * x̂ and grad_bias[j] = sum_r dy, in two passes with no atomics (the
// same bits on every run). Pass 1: block (column tile, chunk) sums kLnChunk rows of kLnCols
// columns, kLnRowThreads threads down each column (a warp reads 32 neighbouring columns of a row),
// their f32 sums combined in f64 in thread order into one partial per column and chunk. Pass 2:
// thread j adds column j's partials in chunk order. The single pass it replaces, one thread per
// column walking every row, took 0.3 ms per layer norm of the char GPT's step on an H100 (2.7 of
// its 8.9 ms in amp-bf16): 128 threads for the whole GPU.
constexpr int kLnCols = 32, kLnRowThreads = 8, kLnChunk = 64;
constexpr int64_t kMaxGridY = 65535;

template <class T>
__global__ void ln_backward_params_partial_kernel(const T* gy, const T* x, int64_t rows, int64_t cols,
                                                  const acc_t<T>* mean, const acc_t<T>* rstd, double* part_w,
                                                  double* part_b) {
  using A = acc_t<T>;
  __shared__ double sw[kLnRowThreads][kLnCols], sb[kLnRowThreads][kLnCols];
  const int64_t j = int64_t(blockIdx.x) * kLnCols + threadIdx.x;
  const int64_t chunks = (rows + kLnChunk - 1) / kLnChunk;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t end = min(rows, (c + 1) * kLnChunk);
    A w = 0, b = 0;
    if (j < cols)
      for (int64_t r = c * kLnChunk + threadIdx.y; r < end; r += kLnRowThreads) {
        const A dy = to_acc(gy[r * cols + j]), xv = to_acc(x[r * cols + j]);
        w += dy * (mean ? (xv - mean[r]) * rstd[r] : xv);
        b += dy;
      }
    __syncthreads();  // the previous chunk's sums have been read
    sw[threadIdx.y][threadIdx.x] = double(w);
    sb[threadIdx.y][threadIdx.x] = double(b);
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
      double tw = 0, tb = 0;
      for (int k = 0; k < kLnRowThreads; ++k) tw += sw[k][threadIdx.x], tb += sb[k][threadIdx.x];
      part_w[c * cols + j] = tw;
      part_b[c * cols + j] = tb;
    }
  }
}

template <class A, class P>
__global__ void ln_backward_params_sum_kernel(const P* part_w, const P* part_b, int64_t chunks, int64_t cols, A* gw,
                                              A* gb) {
  for (int64_t j = global_thread(); j < cols; j += grid_threads()) {
    double w = 0, b = 0;
    for (int64_t c = 0; c < chunks; ++c) w += double(part_w[c * cols + j]), b += double(part_b[c * cols + j]);
    if (gw) gw[j] = A(w);
    if (gb) gb[j] = A(b);
  }
}

// --------------------------------------------------------------------------- per-channel O(C)

__global__ void invstd_kernel(const double* var, int64_t n, double eps, double* dst) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = 1.0 / sqrt(var[i] + eps);
}
__global__ void running_kernel(const double* running, const double* batch, int64_t n, double factor, double momentum,
                               double* dst) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dst[i] = (1 - momentum) * running[i] + momentum * (batch[i] * factor);
}

}  // namespace

void batch_norm_stats(const Tensor& x_in, int64_t channels, Tensor& mean, Tensor& var) {
  const Tensor x = kernels::contig(x_in);
  const Launch on(x);
  const Nci d{x.size(0), channels, x.numel() / (x.size(0) * channels)};
  const DType st = stats_dtype(x.dtype());
  mean = Tensor::empty({channels}, st, x.device());
  var = Tensor::empty({channels}, st, x.device());
  if (channels == 0) return;
  dispatch_floating(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    bn_stats_kernel<T><<<unsigned(channels), kReduceThreads, 0, on.stream()>>>(
        static_cast<const T*>(x.data_ptr()), d, static_cast<A*>(mean.data_ptr()), static_cast<A*>(var.data_ptr()));
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
}

Tensor batch_norm_forward(const Tensor& x_in, const Tensor& mean_in, const Tensor& invstd_in, const Tensor& weight_in,
                          const Tensor& bias_in) {
  const Tensor x = kernels::contig(x_in);
  const Launch on(x);
  const DType st = stats_dtype(x.dtype());
  const Tensor mean = param(mean_in, st), invstd = param(invstd_in, st), weight = param(weight_in, st),
               bias = param(bias_in, st);
  const int64_t channels = mean.numel();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return y;
  const Nci d{x.size(0), channels, x.numel() / (x.size(0) * channels)};
  dispatch_floating(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(y.data_ptr());
    const A *m = ptr_or_null<A>(mean), *is = ptr_or_null<A>(invstd), *w = ptr_or_null<A>(weight),
            *b = ptr_or_null<A>(bias);
    if (vec_width<T>(d.inner, {src, dst}) > 1) {
      constexpr int v = kVec16<T>;
      bn_forward_kernel<T, v><<<blocks_for(x.numel() / v), kThreads, 0, on.stream()>>>(src, d, m, is, w, b, dst);
    } else {
      bn_forward_kernel<T, 1><<<blocks_for(x.numel()), kThreads, 0, on.stream()>>>(src, d, m, is, w, b, dst);
    }
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return y;
}

NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x_in, const Tensor& mean_in, const Tensor& invstd_in,
                              const Tensor& weight_in, bool training, bool need_x, bool need_weight, bool need_bias) {
  // One element type for both: grad_y's and x's differ only outside autocast's rules; then both
  // go wide (exact) and grad_x is rounded to grad_y's dtype after.
  const DType t = grad_y.dtype() == x_in.dtype() ? x_in.dtype() : stats_dtype(x_in.dtype());
  const Tensor x = x_in.dtype() == t ? kernels::contig(x_in) : kernels::cast(x_in, t);
  const Tensor gy = grad_y.dtype() == t ? kernels::contig(grad_y) : kernels::cast(grad_y, t);
  const Launch on(x);
  const DType st = stats_dtype(t);
  const Tensor mean = param(mean_in, st), invstd = param(invstd_in, st), weight = param(weight_in, st);
  const int64_t channels = mean.numel();
  const Nci d{x.size(0), channels, x.numel() / (x.size(0) * channels)};
  Tensor sum_dy = Tensor::empty({channels}, st, x.device()), sum_dy_xhat = Tensor::empty({channels}, st, x.device());
  NormGrads out;
  Tensor gx = need_x ? Tensor::empty(x.shape(), t, x.device()) : Tensor();
  if (channels > 0)
    dispatch_floating(t, [&](auto tag) {
      using T = decltype(tag);
      using A = acc_t<T>;
      const T *g = static_cast<const T*>(gy.data_ptr()), *src = static_cast<const T*>(x.data_ptr());
      const A *m = ptr_or_null<A>(mean), *is = ptr_or_null<A>(invstd), *w = ptr_or_null<A>(weight);
      A *s = static_cast<A*>(sum_dy.data_ptr()), *sx = static_cast<A*>(sum_dy_xhat.data_ptr());
      bn_backward_sums_kernel<T><<<unsigned(channels), kReduceThreads, 0, on.stream()>>>(g, src, d, m, is, s, sx);
      MIXPREC_CUDA_CHECK_LAUNCH();
      if (!need_x || x.numel() == 0) return;
      T* dst = static_cast<T*>(gx.data_ptr());
      if (vec_width<T>(d.inner, {g, src, dst}) > 1) {
        constexpr int v = kVec16<T>;
        bn_backward_x_kernel<T, v>
            <<<blocks_for(x.numel() / v), kThreads, 0, on.stream()>>>(g, src, d, m, is, w, s, sx, training, dst);
      } else {
        bn_backward_x_kernel<T, 1>
            <<<blocks_for(x.numel()), kThreads, 0, on.stream()>>>(g, src, d, m, is, w, s, sx, training, dst);
      }
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  if (need_x) out.x = gx.dtype() == grad_y.dtype() ? gx : kernels::cast(gx, grad_y.dtype());
  if (need_weight) out.weight = sum_dy_xhat;
  if (need_bias) out.bias = sum_dy;
  return out;
}

namespace {

// MIXPREC_CUDA_LAYER_NORM=block keeps every layer norm on the block kernels (the GPU runs' A/B of
// the two, until the warp kernels have been measured), read once.
bool warp_rows_allowed() {
  static const bool on = [] {
    const char* v = std::getenv("MIXPREC_CUDA_LAYER_NORM");
    return v == nullptr || std::string_view(v) != "block";
  }();
  return on;
}

// f(integral_constant<kPerLane>) where layer_norm_warp.cuh's kernels take rows of `cols` (at most
// kMaxCols; f32, bf16 and f16 only: the callers' `if constexpr`) and are not switched off; false,
// nothing called, where not.
template <int kMaxCols, class F>
bool with_warp_rows(int64_t cols, F&& f) {
  return warp_rows_allowed() && ln_warp::with_per_lane<kMaxCols>(cols, f);
}

}  // namespace

Tensor layer_norm_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat, DType y_dtype) {
  const Tensor x = kernels::contig(x_in);
  const Launch on(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  const DType st = stats_dtype(x.dtype());
  const Tensor weight = param(weight_in, st), bias = param(bias_in, st);
  mean = Tensor::empty({rows}, st, x.device());
  rstd = Tensor::empty({rows}, st, x.device());
  Tensor y = Tensor::empty(x.shape(), y_dtype, x.device());
  if (rows == 0 || cols == 0) return y;
  MIXPREC_CHECK(!xhat.defined() || (xhat.is_contiguous() && xhat.numel() == x.numel()),
                "layer_norm_forward: xhat must be a contiguous tensor of the input's size");
  // The block kernels write y in x's dtype: a y of another dtype there is that y cast.
  Tensor y_as_x = y;
  dispatch_floating(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const T* src = static_cast<const T*>(x.data_ptr());
    const A *w = ptr_or_null<A>(weight), *b = ptr_or_null<A>(bias);
    A *m = static_cast<A*>(mean.data_ptr()), *rs = static_cast<A*>(rstd.data_ptr());
    // A warp a row where the row fits its registers (layer_norm_warp.cuh), y written in its dtype
    // (x's, or 16 bits over an f32 x), else a block a row.
    const auto run = [&](auto* xh) {
      using U = std::remove_pointer_t<decltype(xh)>;
      if constexpr (!std::is_same_v<T, double>) {
        const unsigned blocks = unsigned((rows + ln_warp::kWarps - 1) / ln_warp::kWarps);
        const auto warp = [&](auto* dst) {
          using Y = std::remove_pointer_t<decltype(dst)>;
          return with_warp_rows<ln_warp::kMaxColsForward>(cols, [&](auto per_lane) {
            ln_warp::forward_kernel<T, Y, U, decltype(per_lane)::value>
                <<<blocks, ln_warp::kThreads, 0, on.stream()>>>(src, rows, int(cols), eps, w, b, dst, m, rs, xh);
          });
        };
        if (y_dtype == x.dtype() && warp(static_cast<T*>(y.data_ptr()))) return;
        if constexpr (std::is_same_v<T, float>) {
          if (y_dtype == DType::bf16 && warp(static_cast<bf16*>(y.data_ptr()))) return;
          if (y_dtype == DType::f16 && warp(static_cast<f16*>(y.data_ptr()))) return;
        }
      }
      if (y_dtype != x.dtype()) y_as_x = Tensor::empty(x.shape(), x.dtype(), x.device());
      ln_forward_kernel<T, U><<<unsigned(rows), kThreads, 0, on.stream()>>>(
          src, cols, eps, w, b, static_cast<T*>(y_as_x.data_ptr()), m, rs, xh);
    };
    if (!xhat.defined()) {
      run(static_cast<T*>(nullptr));
      return;
    }
    dispatch_floating(xhat.dtype(), [&](auto u) {
      using U = decltype(u);
      run(static_cast<U*>(xhat.data_ptr()));
    });
  });
  MIXPREC_CUDA_CHECK_LAUNCH();
  return y_as_x.data_ptr() == y.data_ptr() ? y : kernels::cast(y_as_x, y_dtype);
}

namespace {

// f(G{}, X{}, D{}) for the (gy, x, grad_x) element types the warp backward reads and writes as they
// are: one of f32, bf16 and f16 for all three, or autocast's: a 16-bit x̂ with a gy of its dtype or
// f32 and an f32 grad_x. False, f not called, for any other combination.
template <class F>
bool with_backward_types(DType g, DType x, DType d, F&& f) {
  const auto call = [&](auto gt, auto xt, auto dt) {
    f(gt, xt, dt);
    return true;
  };
  if (g == x && x == d) {
    switch (x) {
      case DType::f32:
        return call(float{}, float{}, float{});
      case DType::bf16:
        return call(bf16{}, bf16{}, bf16{});
      case DType::f16:
        return call(f16{}, f16{}, f16{});
      default:
        return false;
    }
  }
  if (d != DType::f32 || (g != x && g != DType::f32)) return false;
  if (x == DType::bf16) return g == DType::f32 ? call(float{}, bf16{}, float{}) : call(bf16{}, bf16{}, float{});
  if (x == DType::f16) return g == DType::f32 ? call(float{}, f16{}, float{}) : call(f16{}, f16{}, float{});
  return false;
}

// The warp-a-row backward (layer_norm_warp.cuh) on gy and x as they are, grad_x in gx_dtype: grad_x
// and the parameters' partial sums in one pass over gy and x, about 4 blocks an SM each summing its
// rows' columns, then pass 2 adding the blocks' partials in block order. False, nothing launched,
// where the dtypes or the width are not the warp kernels' (or MIXPREC_CUDA_LAYER_NORM=block).
bool layer_norm_backward_warp(const Tensor& grad_y, const Tensor& x_in, const Tensor& mean_in, const Tensor& rstd_in,
                              const Tensor& weight_in, bool need_x, bool need_weight, bool need_bias, DType gx_dtype,
                              NormGrads& out) {
  const int64_t rows = x_in.size(0), cols = x_in.size(1);
  if (rows == 0 || cols == 0) return false;
  bool done = false;
  with_backward_types(grad_y.dtype(), x_in.dtype(), gx_dtype, [&](auto gt, auto xt, auto dt) {
    using G = decltype(gt);
    using X = decltype(xt);
    using D = decltype(dt);
    const Tensor gy = kernels::contig(grad_y), x = kernels::contig(x_in);
    const Launch on(x);
    const Tensor mean = param(mean_in, DType::f32), rstd = param(rstd_in, DType::f32),
                 weight = param(weight_in, DType::f32);
    const int64_t warp_rows = (rows + ln_warp::kWarps - 1) / ln_warp::kWarps;
    const int64_t target = std::clamp<int64_t>(4 * sm_count(), 1, warp_rows);
    const int64_t per_block = (warp_rows + target - 1) / target * ln_warp::kWarps;
    const int64_t blocks = (rows + per_block - 1) / per_block;
    const bool params = need_weight || need_bias;
    Tensor gx, part;
    float* pw = nullptr;  // the blocks' partial sums of dw and db: [2, blocks, cols]
    if (!with_warp_rows<ln_warp::kMaxColsBackward>(cols, [&](auto per_lane) {
          if (need_x) gx = Tensor::empty(x.shape(), gx_dtype, x.device());
          if (params) {
            part = Tensor::empty({2, blocks, cols}, DType::f32, x.device());
            pw = static_cast<float*>(part.data_ptr());
          }
          ln_warp::backward_kernel<G, X, D, decltype(per_lane)::value>
              <<<unsigned(blocks), ln_warp::kThreads, 0, on.stream()>>>(
                  static_cast<const G*>(gy.data_ptr()), static_cast<const X*>(x.data_ptr()), rows, int(cols),
                  per_block, ptr_or_null<float>(mean), ptr_or_null<float>(rstd), ptr_or_null<float>(weight),
                  need_x ? static_cast<D*>(gx.data_ptr()) : nullptr, pw, pw ? pw + blocks * cols : nullptr);
        }))
      return;
    MIXPREC_CUDA_CHECK_LAUNCH();
    if (need_weight) out.weight = Tensor::empty({cols}, DType::f32, x.device());
    if (need_bias) out.bias = Tensor::empty({cols}, DType::f32, x.device());
    if (params) {
      ln_backward_params_sum_kernel<float, float><<<blocks_for(cols), kThreads, 0, on.stream()>>>(
          pw, pw + blocks * cols, blocks, cols, need_weight ? static_cast<float*>(out.weight.data_ptr()) : nullptr,
          need_bias ? static_cast<float*>(out.bias.data_ptr()) : nullptr);
      MIXPREC_CUDA_CHECK_LAUNCH();
    }
    out.x = gx;
    done = true;
  });
  return done;
}

}  // namespace

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x_in, const Tensor& mean_in, const Tensor& rstd_in,
                              const Tensor& weight_in, bool need_x, bool need_weight, bool need_bias, DType gx_dtype) {
  NormGrads out;
  // The warp kernels on the operands as they are (autocast's 16-bit gy and x̂ into an f32 grad_x
  // among them); else gy first in grad_x's dtype (exact from 16 bits), all in one dtype t, and the
  // warp kernels again or the block kernels (f64, rows over 1024, MIXPREC_CUDA_LAYER_NORM=block).
  if (layer_norm_backward_warp(grad_y, x_in, mean_in, rstd_in, weight_in, need_x, need_weight, need_bias, gx_dtype,
                               out))
    return out;
  const Tensor gy_d = grad_y.dtype() == gx_dtype ? grad_y : kernels::cast(grad_y, gx_dtype);
  const DType t = gy_d.dtype() == x_in.dtype() ? x_in.dtype() : stats_dtype(x_in.dtype());
  const Tensor x = x_in.dtype() == t ? kernels::contig(x_in) : kernels::cast(x_in, t);
  const Tensor gy = gy_d.dtype() == t ? kernels::contig(gy_d) : kernels::cast(gy_d, t);
  if (layer_norm_backward_warp(gy, x, mean_in, rstd_in, weight_in, need_x, need_weight, need_bias, t, out)) {
    if (need_x && out.x.dtype() != gx_dtype) out.x = kernels::cast(out.x, gx_dtype);
    return out;
  }
  const Launch on(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  const DType st = stats_dtype(t);
  const Tensor mean = param(mean_in, st), rstd = param(rstd_in, st), weight = param(weight_in, st);
  Tensor gx = need_x ? Tensor::empty(x.shape(), t, x.device()) : Tensor();
  if (need_weight) out.weight = Tensor::empty({cols}, st, x.device());
  if (need_bias) out.bias = Tensor::empty({cols}, st, x.device());
  if (rows > 0 && cols > 0)
    dispatch_floating(t, [&](auto tag) {
      using T = decltype(tag);
      using A = acc_t<T>;
      const T *g = static_cast<const T*>(gy.data_ptr()), *src = static_cast<const T*>(x.data_ptr());
      const A *m = ptr_or_null<A>(mean), *rs = ptr_or_null<A>(rstd);
      if (need_x) {
        ln_backward_x_kernel<T><<<unsigned(rows), kThreads, 0, on.stream()>>>(
            g, src, cols, m, rs, ptr_or_null<A>(weight), static_cast<T*>(gx.data_ptr()));
        MIXPREC_CUDA_CHECK_LAUNCH();
      }
      if (need_weight || need_bias) {
        const int64_t chunks = (rows + kLnChunk - 1) / kLnChunk;
        const Tensor part = Tensor::empty({2, chunks, cols}, DType::f64, x.device());
        double* pw = static_cast<double*>(part.data_ptr());
        const dim3 grid(unsigned((cols + kLnCols - 1) / kLnCols), unsigned(std::min(chunks, kMaxGridY)));
        ln_backward_params_partial_kernel<T>
            <<<grid, dim3(kLnCols, kLnRowThreads), 0, on.stream()>>>(g, src, rows, cols, m, rs, pw, pw + chunks * cols);
        MIXPREC_CUDA_CHECK_LAUNCH();
        ln_backward_params_sum_kernel<A, double><<<blocks_for(cols), kThreads, 0, on.stream()>>>(
            pw, pw + chunks * cols, chunks, cols, need_weight ? static_cast<A*>(out.weight.data_ptr()) : nullptr,
            need_bias ? static_cast<A*>(out.bias.data_ptr()) : nullptr);
        MIXPREC_CUDA_CHECK_LAUNCH();
      }
    });
  else if (rows == 0) {  // empty sums
    if (need_weight) kernels::fill(out.weight, 0.0);
    if (need_bias) kernels::fill(out.bias, 0.0);
  }
  if (need_x) out.x = gx.dtype() == gx_dtype ? gx : kernels::cast(gx, gx_dtype);
  return out;
}

// f64 throughout, as the reference: the inputs widened first (exact), the result rounded once.
Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype) {
  const Tensor v = var.dtype() == DType::f64 ? kernels::contig(var) : kernels::cast(var, DType::f64);
  const Launch on(v);
  Tensor dst = Tensor::empty(v.shape(), DType::f64, v.device());
  if (v.numel() > 0) {
    invstd_kernel<<<blocks_for(v.numel()), kThreads, 0, on.stream()>>>(
        static_cast<const double*>(v.data_ptr()), v.numel(), eps, static_cast<double*>(dst.data_ptr()));
    MIXPREC_CUDA_CHECK_LAUNCH();
  }
  return dtype == DType::f64 ? dst : kernels::cast(dst, dtype);
}

Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum) {
  const Tensor r = running.dtype() == DType::f64 ? kernels::contig(running) : kernels::cast(running, DType::f64);
  const Tensor b = batch.dtype() == DType::f64 ? kernels::contig(batch) : kernels::cast(batch, DType::f64);
  const Launch on(r);
  Tensor dst = Tensor::empty(r.shape(), DType::f64, r.device());
  if (r.numel() > 0) {
    running_kernel<<<blocks_for(r.numel()), kThreads, 0, on.stream()>>>(
        static_cast<const double*>(r.data_ptr()), static_cast<const double*>(b.data_ptr()), r.numel(), factor, momentum,
        static_cast<double*>(dst.data_ptr()));
    MIXPREC_CUDA_CHECK_LAUNCH();
  }
  return dst;
}

}  // namespace mixprec::kernels::cuda
