// Dispatch of the norm family (norm.h): the GPU's kernels for CUDA tensors; on the CPU the fast kernel
// where it supports the case, else the reference.
#include "kernels/norm.h"

namespace mixprec::kernels {

void batch_norm_stats(const Tensor& x, int64_t channels, Tensor& mean, Tensor& var) {
  const DeviceScope on({&x, &mean, &var});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::batch_norm_stats(x, channels, mean, var);
#endif
  if (use_fast() && cpu::batch_norm_stats(x, channels, mean, var)) return;
  note_reference();
  ref::batch_norm_stats(x, channels, mean, var);
}

Tensor batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias) {
  const DeviceScope on({&x, &mean, &invstd, &weight, &bias});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::batch_norm_forward(x, mean, invstd, weight, bias);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(x.shape(), x.dtype());
    if (cpu::batch_norm_forward(x, mean, invstd, weight, bias, dst)) return dst;
  }
  note_reference();
  return ref::batch_norm_forward(x, mean, invstd, weight, bias);
}

NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                              const Tensor& weight, bool training, bool need_x, bool need_weight, bool need_bias) {
  const DeviceScope on({&grad_y, &x, &mean, &invstd, &weight});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda())
    return cuda::batch_norm_backward(grad_y, x, mean, invstd, weight, training, need_x, need_weight, need_bias);
#endif
  NormGrads out;
  if (use_fast() &&
      cpu::batch_norm_backward(grad_y, x, mean, invstd, weight, training, need_x, need_weight, need_bias, out))
    return out;
  note_reference();
  return ref::batch_norm_backward(grad_y, x, mean, invstd, weight, training, need_x, need_weight, need_bias);
}

Tensor layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& mean,
                          Tensor& rstd, const Tensor& xhat, std::optional<DType> y_dtype) {
  const DeviceScope on({&x, &weight, &bias, &mean, &rstd, &xhat});
  const DType yt = y_dtype.value_or(x.dtype());
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::layer_norm_forward(x, weight, bias, eps, mean, rstd, xhat, yt);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(x.shape(), yt);
    if (cpu::layer_norm_forward(x, weight, bias, eps, mean, rstd, xhat, dst)) return dst;
  }
  note_reference();
  return ref::layer_norm_forward(x, weight, bias, eps, mean, rstd, xhat, yt);
}

NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool need_x, bool need_weight, bool need_bias,
                              std::optional<DType> grad_x_dtype) {
  const DeviceScope on({&grad_y, &x, &mean, &rstd, &weight});
  const DType gxt = grad_x_dtype.value_or(grad_y.dtype());
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::layer_norm_backward(grad_y, x, mean, rstd, weight, need_x, need_weight, need_bias, gxt);
#endif
  NormGrads out;
  if (use_fast() && cpu::layer_norm_backward(grad_y, x, mean, rstd, weight, need_x, need_weight, need_bias, gxt, out))
    return out;
  note_reference();
  return ref::layer_norm_backward(grad_y, x, mean, rstd, weight, need_x, need_weight, need_bias, gxt);
}

// Per-channel O(C) work: the reference only on the CPU.
Tensor batch_norm_invstd(const Tensor& var, double eps, DType dtype) {
  const DeviceScope on(var);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::batch_norm_invstd(var, eps, dtype);
#endif
  return ref::batch_norm_invstd(var, eps, dtype);
}
Tensor batch_norm_running(const Tensor& running, const Tensor& batch, double factor, double momentum) {
  const DeviceScope on({&running, &batch});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::batch_norm_running(running, batch, factor, momentum);
#endif
  return ref::batch_norm_running(running, batch, factor, momentum);
}

}  // namespace mixprec::kernels
