// Kernels of the conv family (ops/conv.cpp): 2-d convolution over NCHW activations, forward and
// both backward passes. Reference: ref/conv.cpp; fast (oneDNN, primitive and reordered-weight
// caches): cpu/conv.cpp on cpu/conv_entries.{h,cpp}, with the shared oneDNN helpers in
// cpu/dnnl_common.{h,cpp}; GPU (cuDNN graph API): cuda/conv.cpp on cuda/conv_plans.{h,cpp}; dispatch: conv.cpp.
#pragma once
#include <optional>

#include "kernels/backend.h"
#include "kernels/pool.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// One 2-d convolution: x [n, c, h, w] * weight [oc, c/groups, kh, kw] -> dst [n, oc, oh, ow].
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t oc = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  // x, grad_y and the results y and grad_x NHWC-dense (kernels/shape.h: channels-last) instead of
  // contiguous; the weight and its gradient stay contiguous either way.
  bool channels_last = false;
  // The same convolution over contiguous NCHW tensors (where a channels-last one runs on copies).
  ConvGeometry in_nchw() const {
    ConvGeometry g = *this;
    g.channels_last = false;
    return g;
  }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {oc, c / groups, kh, kw}; }
  Shape y_shape() const { return {n, oc, oh, ow}; }
};
// x contiguous (NHWC-dense under g.channels_last), weight contiguous, of one dtype; bias [oc]
// (undefined: none) of that dtype or f32.
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

// conv2d_forward (no ReLU) and max_pool2d_forward over its output (`pool`: y's [n, oc, oh, ow] as
// its input) in one call: the pool's dst and argmax, bit for bit those of the two calls. On the CPU
// the pool reads the convolution's output where oneDNN's primitive wrote it (blocked or NHWC), so
// the full-size output is never reordered into NCHW nor read back from there
// (cpu::conv2d_forward_max_pool); elsewhere (a GPU, channels-last, the reference, a first layer
// written by mixprec's kernel, a layout the pool does not read) the two kernels run one after the
// other.
MaxPoolResult conv2d_max_pool2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        const ConvGeometry& g, const PoolGeometry& pool);
// The gradients of conv2d_max_pool2d_forward's inputs from its output's gradient and the pool's
// u8 argmax: max_pool2d_backward then conv2d_backward, bit for bit. On the CPU, where only the
// weight and bias gradients are asked for and mixprec's small-K kernel computes them (a first
// layer), grad_y is routed plane by plane as that kernel reads it, never written whole
// (cpu::conv2d_backward_max_unpool); elsewhere the two kernels run one after the other, the
// argmax (taken by value: pass the caller's last handle) released between them.
ConvGrads conv2d_max_pool2d_backward(const Tensor& grad, Tensor argmax, const PoolGeometry& pool, const Tensor& x,
                                     const Tensor& weight, const ConvGeometry& g, bool need_x, bool need_weight,
                                     bool need_bias, DType bias_dtype, DType weight_dtype);
// Whether the CPU pools in the primitive's layout (the default; MIXPREC_CONV_POOL=separate starts it
// off): with it off, conv2d_max_pool2d_forward is always the two calls (tests, A/B runs).
void set_conv_pool_fused(bool on);

namespace ref {
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu);
ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype);
}  // namespace ref

namespace cpu {
bool conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                    Tensor& dst);
// Whether conv2d_forward_max_pool may take the convolution (not channels-last); it may still decline
// at the primitive's layout. Then: dst and argmax of `out` (allocated by the caller, [n, oc, pool.oh,
// pool.ow], x's dtype and u8) filled, or false, nothing run.
bool conv2d_forward_max_pool_applies(const ConvGeometry& g);
bool conv2d_forward_max_pool(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g,
                             const PoolGeometry& pool, MaxPoolResult& out);
// The weight (and bias) gradient of a convolution whose output a max pool read, from the pool's
// gradient and u8 argmax: where conv2d_backward would run mixprec's small-K kernel for them (a
// first layer), that kernel routes each image's planes of grad_y as it reads them, so grad_y is
// never written whole; the bits of max_pool2d_backward then conv2d_backward. out: weight (and
// bias) allocated by the caller, x undefined.
bool conv2d_backward_max_unpool_applies(const ConvGeometry& g, const PoolGeometry& pool, DType t, DType x_t,
                                        DType weight_t, std::optional<DType> bias_t);
void conv2d_backward_max_unpool(const Tensor& grad_pooled, const Tensor& argmax, const PoolGeometry& pool,
                                const Tensor& x, const ConvGeometry& g, ConvGrads& out);
// Fills the defined members of `out` (allocated by the caller).
bool conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                     ConvGrads& out);
}  // namespace cpu

namespace cuda {
// cuDNN (src/kernels/cuda/conv.cpp): the same contracts as the dispatch functions above.
Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu);
ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype);
}  // namespace cuda

}  // namespace mixprec::kernels
