// The differentiable ops (declared with their autocast class in src/ops/ops.def).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::ops {

// ---- matmul family (autocast: lower) ----
Tensor matmul(const Tensor& a, const Tensor& b);  // [m,k]@[k,n], or [b,m,k]@[b,k,n]; [.., k] @ [k, n] flattens leading dims
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());  // x[.., in] @ weight[out,in]^T + bias[out]

// ---- element-wise binary with broadcasting (autocast: promote) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// ---- unary ----
Tensor neg(const Tensor& x);
Tensor affine(const Tensor& x, double scale, double shift = 0.0);  // x*scale + shift, input dtype
Tensor exp(const Tensor& x);   // fp32 class
Tensor log(const Tensor& x);   // fp32 class
Tensor pow(const Tensor& x, double exponent);  // fp32 class
Tensor sqrt(const Tensor& x);  // fp32 class

// ---- activations (autocast: keep) ----
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approx = false);  // exact erf form by default, as PyTorch
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// ---- reductions (autocast: fp32; accumulate in f32, f64 for f64) ----
Tensor sum(const Tensor& x);                                    // all elements -> scalar
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);

// ---- softmax family (autocast: fp32), over dim ----
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// ---- losses (autocast: fp32), mean reduction ----
enum class Reduction { mean, sum, none };
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction r = Reduction::mean);  // [N,C], i64 [N]
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction r = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r = Reduction::mean);

// ---- shape and dtype (autocast: keep) ----
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);
Tensor contiguous(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);  // gradient is cast back to x's dtype

}  // namespace mixprec::ops
