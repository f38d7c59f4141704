// Dispatch of the conv family (conv.h): cuDNN for GPU tensors; on the CPU oneDNN where it supports the
// case, else the reference.
#include "kernels/conv.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kernels/activation.h"
#include "kernels/shape.h"

namespace mixprec::kernels {
namespace {
// One product of a convolution (forward, data gradient or weight gradient): 2 * N * OC * OH * OW
// multiply-adds of (C / groups) * KH * KW each.
double conv_flops(const ConvGeometry& g) {
  const int64_t taps = g.c / g.groups * g.kh * g.kw;  // exact: groups divides c
  return 2.0 * double(g.n * g.oc * g.oh * g.ow) * double(taps);
}

// The CPU's kernels, NCHW: oneDNN where it takes the case, else the reference.
Tensor cpu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu) {
  if (use_fast()) {
    Tensor dst = Tensor::empty(g.y_shape(), x.dtype());
    if (cpu::conv2d_forward(x, weight, bias, g, relu, dst)) return dst;
  }
  note_reference();
  return ref::conv2d_forward(x, weight, bias, g, relu);
}
ConvGrads cpu_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g, bool need_x,
                       bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype) {
  if (use_fast()) {
    ConvGrads out;
    if (need_x) out.x = Tensor::empty(g.x_shape(), grad_y.dtype());
    if (need_weight) out.weight = Tensor::empty(g.w_shape(), weight_dtype);
    if (need_bias) out.bias = Tensor::empty({g.oc}, bias_dtype);
    if (cpu::conv2d_backward(grad_y, x, weight, g, out)) return out;
  }
  note_reference();
  return ref::conv2d_backward(grad_y, x, weight, g, need_x, need_weight, need_bias, bias_dtype, weight_dtype);
}

std::atomic<bool>& pool_fused_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("MIXPREC_CONV_POOL");
    return env == nullptr || std::string_view(env) != "separate";
  }()};
  return on;
}

}  // namespace

void set_conv_pool_fused(bool on) { pool_fused_flag().store(on); }

MaxPoolResult conv2d_max_pool2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        const ConvGeometry& g, const PoolGeometry& pool, bool relu) {
  if (!x.device().is_cuda() && pool_fused_flag().load() && use_fast() && cpu::conv2d_forward_max_pool_applies(g)) {
    const DeviceScope on({&x, &weight, &bias});
    MaxPoolResult r;
    r.dst = Tensor::empty({pool.n, pool.c, pool.oh, pool.ow}, x.dtype());
    r.argmax = Tensor::empty({pool.n, pool.c, pool.oh, pool.ow}, DType::u8);
    if (cpu::conv2d_forward_max_pool(x, weight, bias, g, relu, pool, r)) {
      profile::detail::add_flops(conv_flops(g));
      return r;
    }
  }
  return max_pool2d_forward(conv2d_forward(x, weight, bias, g, relu), pool);
}

ConvGrads conv2d_max_pool2d_backward(const Tensor& grad, Tensor argmax, bool argmax_2bit, const PoolGeometry& pool,
                                     Tensor relu_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                                     bool need_x, bool need_weight, bool need_bias, DType bias_dtype,
                                     DType weight_dtype) {
  if (!grad.device().is_cuda() && pool_fused_flag().load() && use_fast()) {
    const DeviceScope on({&grad, &argmax, &relu_y, &x, &weight});
    ConvGrads out;
    if (need_x) out.x = Tensor::empty(g.x_shape(), grad.dtype());
    if (need_weight) out.weight = Tensor::empty(g.w_shape(), weight_dtype);
    if (need_bias) out.bias = Tensor::empty({g.oc}, bias_dtype);
    if (cpu::conv2d_backward_max_unpool(grad, argmax, argmax_2bit, pool, relu_y, x, weight, g, out)) {
      profile::detail::add_flops(conv_flops(g) * double(int(need_x) + int(need_weight)));
      return out;
    }
  }
  if (argmax_2bit) argmax = unpack_argmax_2bit(argmax, {pool.n, pool.c, pool.oh, pool.ow});
  const Tensor masked = relu_y.defined() ? activation_grad(Activation::relu, grad, relu_y) : grad;
  relu_y = Tensor();
  Tensor grad_y = max_pool2d_backward(masked, argmax, pool);
  argmax = Tensor();  // not held through the convolution's backward (where a step's peak may be)
  return conv2d_backward(grad_y, x, weight, g, need_x, need_weight, need_bias, bias_dtype, weight_dtype);
}

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu) {
  const DeviceScope on({&x, &weight, &bias});
  profile::detail::add_flops(conv_flops(g));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::conv2d_forward(x, weight, bias, g, relu);
#endif
  // Channels-last on the CPU: a contiguous copy in, the result back in NHWC (the layout is the
  // GPU's; the CPU keeps it for the next op, at the cost of the two copies).
  if (g.channels_last) return channels_last(cpu_forward(contig(x), weight, bias, g.in_nchw(), relu));
  return cpu_forward(x, weight, bias, g, relu);
}

ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype) {
  const DeviceScope on({&grad_y, &x, &weight});
  profile::detail::add_flops(conv_flops(g) * double(int(need_x) + int(need_weight)));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda())
    return cuda::conv2d_backward(grad_y, x, weight, g, need_x, need_weight, need_bias, bias_dtype, weight_dtype);
#endif
  if (!g.channels_last)
    return cpu_backward(grad_y, x, weight, g, need_x, need_weight, need_bias, bias_dtype, weight_dtype);
  ConvGrads r = cpu_backward(contig(grad_y), x.defined() ? contig(x) : x, weight, g.in_nchw(), need_x, need_weight,
                             need_bias, bias_dtype, weight_dtype);
  if (r.x.defined()) r.x = channels_last(r.x);
  return r;
}

}  // namespace mixprec::kernels
