// Reference softmax and log_softmax over the last dimension, forward and backward, accumulated
// in f32 (f64 for f64 inputs).
#include <algorithm>
#include <cmath>

#include "kernels/ref/access.h"
#include "kernels/softmax.h"

namespace mixprec::kernels::ref {

Tensor softmax_lastdim(const Tensor& x, bool log) {
  Tensor xc = contig(x);
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  Tensor dst = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* src = xc.data<T>();
    T* out = dst.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* s = src + r * cols;
      A mx = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, A(load(s + c)));
      A total = 0;
      for (int64_t c = 0; c < cols; ++c) total += std::exp(A(load(s + c)) - mx);
      const A lse = mx + std::log(total);
      for (int64_t c = 0; c < cols; ++c) {
        const A v = A(load(s + c)) - lse;
        store(out + r * cols + c, log ? v : std::exp(v));
      }
    }
  });
  return dst;
}

Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log) {
  Tensor yc = contig(y), gc = contig(grad_y);
  const int64_t cols = y.dim() ? y.size(-1) : 1, rows = cols ? y.numel() / cols : 0;
  Tensor dst = Tensor::empty(y.shape(), y.dtype());
  dispatch_floating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* py = yc.data<T>();
    const T* pg = gc.data<T>();
    T* out = dst.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * cols;
      A dot = 0;
      // log_softmax: dx = g - softmax * sum(g);  softmax: dx = y * (g - sum(g*y))
      for (int64_t c = 0; c < cols; ++c) dot += log ? A(load(pg + o + c)) : A(load(pg + o + c)) * A(load(py + o + c));
      for (int64_t c = 0; c < cols; ++c) {
        const A yv = load(py + o + c), gv = load(pg + o + c);
        store(out + o + c, log ? gv - std::exp(yv) * dot : yv * (gv - dot));
      }
    }
  });
  return dst;
}

}  // namespace mixprec::kernels::ref
