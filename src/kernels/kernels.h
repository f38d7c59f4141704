// The kernel interface: one function per primitive computation, dispatching to the fast CPU
// path (src/kernels/cpu) where it supports the case, else to the reference (src/kernels/ref).
// Kernels do not record autograd; ops (src/ops) do.
#pragma once
#include <string_view>

#include "mixprec/tensor.h"

namespace mixprec::kernels {

enum class Backend { cpu, ref };
Backend backend();
void set_backend(Backend b);  // tests force ref to compare; MIXPREC_KERNELS=ref at start-up too

enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { neg, affine, exp, log, pow, sqrt, relu, gelu, gelu_tanh };
// Backward of a unary op: dst = grad * f'(x)  (relu uses x or y>0, the same set).
enum class UnaryGradOp { relu, gelu, gelu_tanh, exp, log, pow, sqrt };

struct UnaryParams {
  double a = 1.0;  // affine scale / pow exponent
  double b = 0.0;  // affine shift
};

// ---- memory ----
// A contiguous version of t without recording autograd (kernels never record).
inline Tensor contig(const Tensor& t) { return t.is_contiguous() ? t.detach() : t.clone(); }
void copy(const Tensor& src, Tensor& dst);   // any strides, any dtypes, same shape
void fill(Tensor& dst, double value);
Tensor cast(const Tensor& src, DType dtype);  // new contiguous tensor

// ---- element-wise (float dtypes; inputs share a dtype; compute in f32, f64 for f64) ----
Tensor add(const Tensor& a, const Tensor& b);  // same shape
void add_inplace(Tensor& acc, const Tensor& g);  // acc += g, same shape, acc contiguous
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // broadcasting
Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p = {});
// grad * f'(x); `x` is the forward input (for relu either input or output works)
Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p = {});

// ---- reductions: sum over `dims` (sorted, unique), result in out_dtype, accumulated in f32/f64 ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype);

// ---- softmax over the last dimension of a contiguous [rows, cols] view ----
Tensor softmax_lastdim(const Tensor& x, bool log);
// grad wrt input given y = (log)softmax(x) and its grad
Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log);

// ---- matmul: dst[m,n] = op(a) @ op(b) (+ bias[n]); op = transpose when the flag says so.
// a, b are 2-d (any strides), dst contiguous [m, n] of dst_dtype. accumulate: dst += result.
struct MatmulOpts {
  bool trans_a = false, trans_b = false;
  const Tensor* bias = nullptr;
  bool accumulate = false;
};
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o = {});

// ---- checks ----
bool all_finite(const Tensor& x);
// Anomaly mode: throws mixprec::Error naming the op if x has NaN/inf.
void check_finite_or_throw(const Tensor& x, std::string_view op, bool backward = false);

// The reference implementations, always available (the test oracle).
namespace ref {
void copy(const Tensor& src, Tensor& dst);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p);
Tensor unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype);
Tensor softmax_lastdim(const Tensor& x, bool log);
Tensor softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log);
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace ref

// The fast CPU implementations; each returns false when it does not support the case.
namespace cpu {
bool copy(const Tensor& src, Tensor& dst);
bool binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& dst);
bool unary(UnaryOp op, const Tensor& x, UnaryParams p, Tensor& dst);
bool unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p, Tensor& dst);
bool sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, Tensor& dst);
bool softmax_lastdim(const Tensor& x, bool log, Tensor& dst);
bool softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log, Tensor& dst);
bool matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);
}  // namespace cpu

// Shape of broadcasting a with b (numpy rules); throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

}  // namespace mixprec::kernels
