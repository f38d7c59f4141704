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

// ---- matmul: dst[m,n] = relu?(op(a) @ op(b) (+ bias[n])); op = transpose when the flag says so.
// a, b are 2-d (any strides), dst contiguous [m, n] of dst_dtype; or all three 3-d with one
// batch size, a product per batch (op transposes the last two dims). accumulate: dst += result.
struct MatmulOpts {
  bool trans_a = false, trans_b = false;
  const Tensor* bias = nullptr;
  bool relu = false;  // applied after the bias, before the accumulation; NaN stays NaN
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

// ---- convolution, pooling, normalisation (NCHW activations; src/kernels/{ref,cpu}/{conv,pool,norm}.cpp) ----
namespace mixprec::kernels {

// One 2-d convolution: x [n, c, h, w] * weight [oc, c/groups, kh, kw] -> dst [n, oc, oh, ow].
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t oc = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {oc, c / groups, kh, kw}; }
  Shape y_shape() const { return {n, oc, oh, ow}; }
};
// x, weight contiguous and of one dtype; bias [oc] (undefined: none) of that dtype or f32.
// dst = relu?(conv(x, weight) + bias), in x's dtype; products accumulate in f32 (f64 for f64).
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu);
// The gradients asked for: x [n,c,h,w] in grad_y's dtype, weight in weight_dtype (grad_y's, or
// f32 from bf16), bias [oc] in bias_dtype.
// `weight` is the tensor the forward used (its storage and version key the reordered-weight cache).
struct ConvGrads {
  Tensor x, weight, bias;
};
ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype);

// One 2-d pooling over the planes of x [n, c, h, w]. Max windows start at oy*stride - pad and step by
// dilation (padding never wins); avg windows follow PyTorch's divisor rule; adaptive windows cover
// [floor(oy*h/oh), ceil((oy+1)*h/oh)).
struct PoolGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool count_include_pad = true;
  bool adaptive = false;
  // argmax holds the window position ky*kw + kx: u8 when the window has at most 256 elements, else i64.
  DType argmax_dtype() const { return kh * kw <= 256 ? DType::u8 : DType::i64; }
};
struct MaxPoolResult {
  Tensor dst, argmax;  // [n, c, oh, ow]
};
MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g);  // -> [n,c,h,w]
Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g);

// Normalisation of x viewed as [outer, channels, inner] (batch norm: [N, C, H*W], statistics per
// channel over outer and inner) or [rows, cols] (layer norm: statistics per row). Statistics are
// f32 (f64 for f64 x); weight/bias (undefined: none) may be x's dtype or the statistics dtype.
struct NormGrads {
  Tensor x, weight, bias;
};
// Per-channel mean and biased variance (two passes: the mean first, then squared deviations).
void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c], in x's dtype.
Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias);
// training: mean/invstd are the batch's, so grad_x includes their dependence on x.
NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias);
// x [rows, cols]: mean/rstd [rows] (outputs), y in x's dtype.
Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias);

// The backward of a fused ReLU in place: grad = y > 0 ? grad : 0 (grad contiguous; y same shape).
void relu_mask_inplace(Tensor& grad, const Tensor& y);

// Dropout's mask (src/kernels/ref/random.cpp): 0 or 1/(1-p) in dtype; element i is dropped when
// word i of one use of gen, as a 24-bit uniform in [0, 1), is below p. One kernel for both
// backends: it is counter-based and parallel already.
Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen);

namespace ref {
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu);
ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype);
MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g);
Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g);
void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias);
NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias);
Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias);
}  // namespace ref

// Fast paths (oneDNN convolution; OpenMP loops over planes/channels/rows with f32 compute for
// pooling and norms); each returns false when it does not support the case.
namespace cpu {
bool conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                    Tensor& dst);
// Fills the defined members of `out` (allocated by the caller).
bool conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g, ConvGrads& out);
bool max_pool2d_forward(const Tensor& x, const PoolGeometry& g, MaxPoolResult& out);
bool max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x);
bool avg_pool2d_forward(const Tensor& x, const PoolGeometry& g, Tensor& dst);
bool avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g, Tensor& grad_x);
bool batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
bool batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias, Tensor& dst);
bool batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                         const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias,
                         NormGrads& out);
bool layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                        Tensor& rstd, Tensor& dst);
bool layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, bool need_x, bool need_weight, bool need_bias, NormGrads& out);
bool relu_mask_inplace(Tensor& grad, const Tensor& y);
// dst = y > 0 ? grad : 0 (the relu op's backward; y its input or output).
bool relu_mask(const Tensor& grad, const Tensor& y, Tensor& dst);
// dst = relu(x): x > 0 or NaN keeps x, else +0.
bool relu_forward(const Tensor& x, Tensor& dst);
}  // namespace cpu

}  // namespace mixprec::kernels
