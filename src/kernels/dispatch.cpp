// Kernel dispatch: the fast CPU path where it supports the case, the reference otherwise.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/kernels.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels {
namespace {
Backend initial_backend() {
  const char* env = std::getenv("MIXPREC_KERNELS");
  return env && std::string(env) == "ref" ? Backend::ref : Backend::cpu;
}
Backend g_backend = initial_backend();
bool fast() { return g_backend == Backend::cpu; }
}  // namespace

Backend backend() { return g_backend; }
void set_backend(Backend b) { g_backend = b; }

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  if (fast() && cpu::copy(src, dst)) return;
  ref::copy(src, dst);
}

void fill(Tensor& dst, double value) {
  // One converted element, replicated: the dtype rounding is the scalar conversion's.
  alignas(8) unsigned char one[8];
  convert(&value, DType::f64, one, dst.dtype(), 1);
  const size_t es = dtype_size(dst.dtype());
  if (dst.is_contiguous()) {
    char* p = static_cast<char*>(dst.data_ptr());
    const int64_t n = dst.numel();
    bool zero = true;
    for (size_t i = 0; i < es; ++i) zero = zero && one[i] == 0;
    if (zero) {
      std::memset(p, 0, size_t(n) * es);
      return;
    }
    for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * int64_t(es), one, es);
    return;
  }
  char* base = static_cast<char*>(dst.storage()->data());
  for_each_offset(dst.shape(), dst.strides(), dst.offset(),
                  [&](int64_t, int64_t off) { std::memcpy(base + off * int64_t(es), one, es); });
}

Tensor cast(const Tensor& src, DType dtype) {
  Tensor dst = Tensor::empty(src.shape(), dtype);
  copy(src, dst);
  return dst;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }

void add_inplace(Tensor& acc, const Tensor& g) {
  MIXPREC_ASSERT(acc.shape() == g.shape() && acc.is_contiguous(), "add_inplace ", shape_str(acc.shape()), " += ",
                 shape_str(g.shape()));
  Tensor gg = g.dtype() == acc.dtype() ? g : cast(g, acc.dtype());
  if (fast() && cpu::binary(BinaryOp::add, acc, gg, acc)) return;
  Tensor s = ref::binary(BinaryOp::add, acc, gg);
  std::memcpy(acc.data_ptr(), s.data_ptr(), s.nbytes());
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  MIXPREC_ASSERT(a.dtype() == b.dtype(), "binary op on ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  if (fast()) {
    Tensor dst = Tensor::empty(broadcast_shapes(a.shape(), b.shape(), "binary op"), a.dtype());
    if (cpu::binary(op, a, b, dst)) return dst;
  }
  return ref::binary(op, a, b);
}

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  if (fast() && x.is_contiguous()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::unary(op, x, p, dst)) return dst;
  }
  return ref::unary(op, x, p);
}

Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p) {
  if (fast() && grad.is_contiguous() && x.is_contiguous()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::unary_grad(op, grad, x, p, dst)) return dst;
  }
  return ref::unary_grad(op, grad, x, p);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  if (fast()) {
    Shape out_shape;
    for (int64_t d = 0; d < x.dim(); ++d) {
      const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!reduced) out_shape.push_back(x.size(d));
      else if (keepdim) out_shape.push_back(1);
    }
    Tensor dst = Tensor::empty(out_shape, out_dtype);
    if (cpu::sum(x, dims, keepdim, dst)) return dst;
  }
  return ref::sum(x, dims, keepdim, out_dtype);
}

Tensor softmax_lastdim(const Tensor& x, bool log) {
  if (fast()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::softmax_lastdim(x, log, dst)) return dst;
  }
  return ref::softmax_lastdim(x, log);
}

Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log) {
  if (fast()) {
    Tensor dst = Tensor::empty(y.shape(), y.dtype());
    if (cpu::softmax_lastdim_backward(y, grad_y, log, dst)) return dst;
  }
  return ref::softmax_lastdim_backward(y, grad_y, log);
}

void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  if (fast() && cpu::matmul(a, b, dst, o)) return;
  ref::matmul(a, b, dst, o);
}

bool all_finite(const Tensor& x) {
  if (!is_floating(x.dtype())) return true;
  Tensor xc = contig(x);
  return dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = xc.data<T>();
    bool ok = true;
    const int64_t n = xc.numel();
#pragma omp parallel for reduction(&& : ok) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(double(load(p + i)));
    return ok;
  });
}

void check_finite_or_throw(const Tensor& x, std::string_view op, bool backward) {
  if (all_finite(x)) return;
  throw Error(detail::concat("anomaly: ", op, backward ? " backward" : "", " produced NaN or inf (output ",
                             shape_str(x.shape()), " ", dtype_name(x.dtype()), ")"));
}

}  // namespace mixprec::kernels
