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

// conv2d_forward (with its fused ReLU or not) and max_pool2d_forward over its output (`pool`: y's [n, oc, oh, ow] as
// its input) in one call: the pool's dst and argmax, bit for bit those of the two calls. On the CPU
// the pool reads the convolution's output where oneDNN's primitive wrote it (blocked or NHWC), so
// the full-size output is never reordered into NCHW nor read back from there
// (cpu::conv2d_forward_max_pool); elsewhere (a GPU, channels-last, the reference, a first layer
// written by mixprec's kernel, a layout the pool does not read) the two kernels run one after the
// other.
MaxPoolResult conv2d_max_pool2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        const ConvGeometry& g, const PoolGeometry& pool, bool relu = false);
// The gradients of conv2d_max_pool2d_forward's inputs from its output's gradient and the pool's
// u8 argmax (or that argmax packed by pack_argmax_2bit, where argmax_2bit): max_pool2d_backward then
// conv2d_backward, bit for bit; with relu_y (the forward's output where it had a ReLU), the ReLU's
// backward first, its mask relu_y > 0 (activation_grad). On the CPU, grad_y is routed by the argmax
// (and masked) where the convolution's backward reads it (cpu::conv2d_backward_max_unpool: a first
// layer's planes, or the primitives' layout), the packed taps read as they are, and grad_y is never
// written whole in NCHW; elsewhere the kernels run one after the other (the argmax unpacked first),
// the argmax and relu_y (taken by value: pass the caller's last handles) released before the
// convolution's.
ConvGrads conv2d_max_pool2d_backward(const Tensor& grad, Tensor argmax, bool argmax_2bit, const PoolGeometry& pool,
                                     Tensor relu_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                                     bool need_x, bool need_weight, bool need_bias, DType bias_dtype,
                                     DType weight_dtype);
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
                             bool relu, const PoolGeometry& pool, MaxPoolResult& out);
// The gradients of a convolution whose output a max pool read, from the pool's gradient and u8
// argmax, the bits of max_pool2d_backward then conv2d_backward, without grad_y written whole in
// NCHW: a first layer's weight (and bias) gradient by mixprec's small-K kernel, which routes each
// image's planes of grad_y as it reads them; or, where every primitive that reads grad_y takes it
// in backward-data's layout (backward-data, then backward-weights split over the batch reading its
// slices, or one primitive in that layout), grad_y routed straight into it (max_unpool_to_layout)
// instead of written in NCHW and reordered. Fills the defined members of `out` (allocated by the
// caller), or returns false with nothing run. argmax (u8 taps, or packed two bits a tap where
// argmax_2bit) and relu_y: as conv2d_max_pool2d_backward's.
bool conv2d_backward_max_unpool(const Tensor& grad_pooled, const Tensor& argmax, bool argmax_2bit,
                                const PoolGeometry& pool, const Tensor& relu_y, const Tensor& x, const Tensor& weight,
                                const ConvGeometry& g, ConvGrads& out);
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
