// Reference reductions, softmax and matmul, accumulating in f32 (f64 for f64 inputs).
#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  Shape kept = x.shape();  // shape with reduced dims set to 1
  for (int64_t d : dims) kept[size_t(d)] = 1;
  Tensor acc = Tensor::zeros(kept, DType::f64);
  double* pa = acc.data<double>();
  const Shape acc_strides = [&] {
    Shape st = contiguous_strides(kept);
    for (int64_t d : dims) st[size_t(d)] = 0;
    return st;
  }();
  std::vector<int64_t> acc_off(size_t(x.numel()));
  for_each_offset(x.shape(), acc_strides, 0, [&](int64_t i, int64_t off) { acc_off[size_t(i)] = off; });
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.storage()->data());
    for_each_offset(x.shape(), x.strides(), x.offset(),
                    [&](int64_t i, int64_t off) { pa[acc_off[size_t(i)]] += double(load(px + off)); });
  });
  Shape out_shape;
  for (size_t d = 0; d < kept.size(); ++d)
    if (keepdim || std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) out_shape.push_back(kept[d]);
  Tensor dst = Tensor::empty(out_shape, out_dtype);
  convert(pa, DType::f64, dst.data_ptr(), out_dtype, size_t(acc.numel()));
  return dst;
}

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

// dst[m,n] = op(a)[m,k] @ op(b)[k,n], or one such product per batch for [batch, ., .] operands:
// inputs rounded to their dtype already; accumulate in f64 so the reference is the exact
// product of the stored values.
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const bool batched = a.dim() == 3;
  MIXPREC_ASSERT(a.dim() == b.dim() && a.dim() == dst.dim() && (a.dim() == 2 || batched), "matmul ranks");
  const int64_t batch = batched ? a.size(0) : 1, r0 = batched ? 1 : 0;  // r0: first matrix dim
  MIXPREC_ASSERT(!batched || (b.size(0) == batch && dst.size(0) == batch), "matmul batch");
  const int64_t m = o.trans_a ? a.size(r0 + 1) : a.size(r0), k = o.trans_a ? a.size(r0) : a.size(r0 + 1);
  const int64_t n = o.trans_b ? b.size(r0) : b.size(r0 + 1);
  MIXPREC_ASSERT((o.trans_b ? b.size(r0 + 1) : b.size(r0)) == k, "matmul inner dims");
  MIXPREC_ASSERT(dst.size(r0) == m && dst.size(r0 + 1) == n && dst.is_contiguous(), "matmul dst");
  const std::vector<double> va = a.to_vector_f64(), vb = b.to_vector_f64();
  std::vector<double> bias;
  if (o.bias) bias = o.bias->to_vector_f64();
  std::vector<double> prev;
  if (o.accumulate) prev = dst.to_vector_f64();
  std::vector<double> out(size_t(batch * m * n));
  const int64_t a_cols = a.size(r0 + 1), b_cols = b.size(r0 + 1);
  const int64_t a_mat = a.size(r0) * a_cols, b_mat = b.size(r0) * b_cols;
  for (int64_t q = 0; q < batch; ++q)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double* pa = va.data() + q * a_mat;
        const double* pb = vb.data() + q * b_mat;
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = o.trans_a ? pa[p * a_cols + i] : pa[i * a_cols + p];
          const double bv = o.trans_b ? pb[j * b_cols + p] : pb[p * b_cols + j];
          s += av * bv;
        }
        if (o.bias) s += bias[size_t(j)];
        if (o.relu && s < 0) s = 0;  // NaN stays NaN
        const size_t at = size_t((q * m + i) * n + j);
        if (o.accumulate) s += prev[at];
        out[at] = s;
      }
  convert(out.data(), DType::f64, dst.data_ptr(), dst.dtype(), out.size());
}

}  // namespace mixprec::kernels::ref
