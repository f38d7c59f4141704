// Kernels of the norm family (ops/norm.cpp): batch and layer normalisation, forward and backward,
// the batch statistics, invstd and the running-statistics update. Reference: ref/norm.cpp; fast:
// cpu/norm.cpp; GPU: cuda/norm.cu; dispatch: norm.cpp.
#pragma once
#include <optional>

#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

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
// x [rows, cols]: mean/rstd [rows] (outputs), y in y_dtype (default: x's), rounded once from the
// computed value: with a 16-bit y_dtype over an f32 x, the bits of the f32 norm cast to it (what
// autocast's 16-bit matmul after a pre-norm reads: ops::layer_norm's out_dtype). With `xhat`
// defined (a contiguous [rows, cols] tensor the caller allocated, of any floating dtype) the kernel
// also writes the normalised input x̂ = (x - mean) * rstd into it, rounded once to its dtype: what
// autocast's layer norm saves for backward instead of its f32 input (ops/norm.cpp).
Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat = Tensor(), std::optional<DType> y_dtype = std::nullopt);
// With `mean` undefined, `x` holds x̂ itself (layer_norm_forward's `xhat`), and rstd only scales
// grad_x; grad_x is in grad_x_dtype (default: grad_y's), a 16-bit grad_y widened exactly on load.
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias,
                              std::optional<DType> grad_x_dtype = std::nullopt);

// invstd[c] = 1 / sqrt(var[c] + eps), computed in f64, stored in `dtype`.
Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype);
// The new running statistic (1 - momentum) * running + momentum * factor * batch, computed and
// returned in f64 (the caller copies it into the running tensor, which bumps its version).
Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum);

namespace ref {
void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias);
NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias);
Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat, std::optional<DType> y_dtype = std::nullopt);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias,
                              std::optional<DType> grad_x_dtype = std::nullopt);
Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype);
Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum);
}  // namespace ref

namespace cpu {
bool batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
bool batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias, Tensor& dst);
bool batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                         const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias,
                         NormGrads& out);
bool layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                        Tensor& rstd, const Tensor& xhat, Tensor& dst);
// dst: y, allocated by the caller in its dtype; out.x is made in grad_x_dtype.
bool layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, bool need_x, bool need_weight, bool need_bias, DType grad_x_dtype,
                         NormGrads& out);
}  // namespace cpu

namespace cuda {
// src/kernels/cuda/norm.cu: the same contracts as the dispatch functions above.
void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var);
Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias);
NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias);
Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat, DType y_dtype);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias, DType grad_x_dtype);
Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype);
Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum);
}  // namespace cuda

}  // namespace mixprec::kernels
