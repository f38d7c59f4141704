// Kernels of the pool family (ops/pool.cpp): max (with argmax), average and adaptive average 2-d
// pooling over NCHW planes, forward and backward. Reference: ref/pool.cpp; fast: cpu/pool.cpp;
// window rules shared by both: pool_window.h; GPU: cuda/pool.cu; dispatch: pool.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

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
  // Whether max pooling may keep it in two bits an output (pack_argmax_2bit).
  bool argmax_fits_two_bits() const { return kh * kw <= 4; }
  // The cnns' pool: 2x2 windows of stride 2, no padding or dilation (the fast kernels' own case).
  bool is_2x2_stride2() const {
    return !adaptive && kh == 2 && kw == 2 && stride_h == 2 && stride_w == 2 && pad_h == 0 && pad_w == 0 &&
           dil_h == 1 && dil_w == 1;
  }
};
struct MaxPoolResult {
  Tensor dst, argmax;  // [n, c, oh, ow]
};
// Max pooling keeps a channels-last layout (kernels/shape.h): a channels-last x gives a
// channels-last dst and argmax, a channels-last argmax (or x, from the input) a channels-last
// grad_x (grad_y read in that layout); the GPU runs its NHWC kernels where they take the case, and
// elsewhere the NCHW kernels run on contiguous copies, the results copied back to channels-last.
MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g);  // -> [n,c,h,w]
// The same gradient from the pool's input x instead of a stored argmax: each window's winner is
// found again by the forward's scan (window_max: first of equal maxima, last NaN), so the result
// is the argmax form's bit for bit. For an input that is kept for another backward anyway.
Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g);

// Max pooling's argmax kept in two bits an output where the window has at most 4 taps (the CNNs'
// 2x2 pool): the taps of a contiguous u8 argmax, all < 4, with output i in bits 2*(i%4) of byte
// i/4 of a flat u8 tensor of ceil(numel/4) bytes (the last byte's unused bits zero), and back.
// The reference refuses a tap of 4 or more; the fast kernels keep each tap's low two bits.
Tensor pack_argmax_2bit(const Tensor& argmax);
Tensor unpack_argmax_2bit(const Tensor& packed, const Shape& shape);  // -> u8 of `shape`

namespace ref {
MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g);
Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g);
Tensor pack_argmax_2bit(const Tensor& argmax);
Tensor unpack_argmax_2bit(const Tensor& packed, const Shape& shape);
}  // namespace ref

namespace cpu {
bool max_pool2d_forward(const Tensor& x, const PoolGeometry& g, MaxPoolResult& out);
bool max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x);
bool max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g, Tensor& grad_x);
bool avg_pool2d_forward(const Tensor& x, const PoolGeometry& g, Tensor& dst);
bool avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g, Tensor& grad_x);
bool pack_argmax_2bit(const Tensor& argmax, Tensor& packed);
bool unpack_argmax_2bit(const Tensor& packed, Tensor& argmax);
// A max pool's argmax as a kernel that routes its gradient reads it: one byte a tap (a u8 argmax),
// or two bits a tap, four a byte (pack_argmax_2bit's layout, two_bit). taps(): taps begin .. begin
// + n as bytes, in place where they are bytes, else unpacked into buf (n bytes) and buf returned.
struct ArgmaxTaps {
  const uint8_t* data = nullptr;
  bool two_bit = false;
  const uint8_t* taps(int64_t begin, int64_t n, uint8_t* buf) const;
};
// One f32 plane [g.h][g.w], its rows row_stride (>= g.w) floats apart, max-pooled into out
// [g.oh][g.ow] and its u8 argmax (g.argmax_dtype() u8): max_pool2d_forward's kernel for a plane,
// for a caller that holds the plane in cache (a first layer's forward pooling its output planes as
// it computes them).
void max_pool_plane_f32(const float* src, int64_t row_stride, const PoolGeometry& g, float* out, uint8_t* argmax);
// One plane's max_pool2d_backward: gy [g.oh][g.ow] of dtype t (f32, bf16 or f16) routed by its u8
// argmax into gx [g.h][g.w] (t), the bits max_pool2d_backward gives that plane. With relu_y (the
// pooled plane after a ReLU, t), gy first passes the ReLU's backward: each value kept where relu_y
// is > 0, +0 elsewhere (activation_grad's bits). scratch: 2 g.oh g.ow + g.h g.w floats. For a caller
// that consumes the plane at once (a first layer's weight gradient, a layout's channels).
void max_unpool_plane(const void* gy, const uint8_t* argmax, const PoolGeometry& g, DType t, void* gx, float* scratch,
                      const void* relu_y = nullptr);
}  // namespace cpu

namespace cuda {
// src/kernels/cuda/pool.cu: the same contracts as the dispatch functions above.
MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g);
Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g);
Tensor pack_argmax_2bit(const Tensor& argmax);
Tensor unpack_argmax_2bit(const Tensor& packed, const Shape& shape);
// Max pooling over channels-last tensors (NHWC-dense, kernels/shape.h), results channels-last:
// the 2x2 windows that tile exactly (pool_2x2_nhwc.cuh); false, nothing run, for any other case.
bool max_pool2d_forward_nhwc(const Tensor& x, const PoolGeometry& g, MaxPoolResult& out);
bool max_pool2d_backward_nhwc(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g, Tensor& grad_x);
bool max_pool2d_backward_from_input_nhwc(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g, Tensor& grad_x);
}  // namespace cuda

}  // namespace mixprec::kernels
