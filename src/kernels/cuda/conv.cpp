// GPU 2-d convolution on cuDNN 9's graph (backend) API (conv.h): forward with the bias and ReLU
// fused into the graph where an engine takes it, backward-data, backward-filter; NCHW or
// channels-last (NHWC) tensors described to cuDNN by their strides. The graphs, plans and their
// timing: conv_plans.{h,cpp}. Why the graph API: docs/design.md (CUDA).
#include <string>
#include <vector>

#include "core/cuda/cuda_util.h"
#include "kernels/activation.h"
#include "kernels/binary.h"
#include "kernels/conv.h"
#include "kernels/cuda/conv_plans.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/shape.h"
#include "mixprec/deterministic.h"

namespace mixprec::kernels::cuda {
namespace {

using conv_plans::alignment;
using conv_plans::cudnn_type;
using conv_plans::GraphKey;
using conv_plans::Pass;
using conv_plans::plans_for;
using conv_plans::run_best;

// t contiguous, or NHWC-dense under channels-last (a copy only when it is not already).
Tensor in_layout(const Tensor& t, bool nhwc) { return nhwc ? kernels::channels_last(t) : kernels::contig(t); }
Tensor empty_in(const Shape& s, DType dtype, const Device& dev, bool nhwc) {
  return nhwc ? kernels::empty_channels_last(s, dtype, dev) : Tensor::empty(s, dtype, dev);
}

GraphKey key_of(const ConvGeometry& g, Pass pass, const Tensor& x, const Tensor& w, const Tensor& y) {
  GraphKey k{};
  k.device = x.device().index;
  k.pass = pass;
  k.n = g.n, k.c = g.c, k.h = g.h, k.w = g.w, k.oc = g.oc, k.kh = g.kh, k.kw = g.kw, k.oh = g.oh, k.ow = g.ow;
  k.sh = g.stride_h, k.sw = g.stride_w, k.ph = g.pad_h, k.pw = g.pad_w, k.dh = g.dil_h, k.dw = g.dil_w;
  k.groups = g.groups;
  k.x_type = int(cudnn_type(x.dtype()));
  k.w_type = int(cudnn_type(w.dtype()));
  k.y_type = int(cudnn_type(y.dtype()));
  k.bias_type = -1;
  k.tf32 = allow_tf32();
  k.nhwc = g.channels_last;
  k.deterministic = deterministic_algorithms();
  k.align_x = alignment(x.data_ptr());
  k.align_w = alignment(w.data_ptr());
  k.align_y = alignment(y.data_ptr());
  return k;
}

std::string describe(const ConvGeometry& g, const Tensor& x) {
  return mixprec::detail::concat(dtype_name(x.dtype()), " x ", shape_str(g.x_shape()), " * w ", shape_str(g.w_shape()),
                                 " stride ", g.stride_h, "x", g.stride_w, " pad ", g.pad_h, "x", g.pad_w, " dilation ",
                                 g.dil_h, "x", g.dil_w, " groups ", g.groups);
}

// One convolution pass (no bias, no ReLU) of x, w, y (the two inputs and the output of the pass);
// false when cuDNN has no engine for these dtypes.
bool run_pass(const ConvGeometry& g, Pass pass, const Tensor& x, const Tensor& w, const Tensor& y) {
  const auto c = plans_for(key_of(g, pass, x, w, y));
  if (c->plans.empty()) return false;
  run_best(*c, x.device().index, {x.data_ptr(), w.data_ptr(), y.data_ptr()});
  return true;
}
// Whether cuDNN has an engine for the pass over these tensors (building its plans if not yet built).
bool has_engine(const ConvGeometry& g, Pass pass, const Tensor& x, const Tensor& w, const Tensor& y) {
  return !plans_for(key_of(g, pass, x, w, y))->plans.empty();
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu) {
  const bool nhwc = g.channels_last;
  MIXPREC_ASSERT(
      (nhwc ? kernels::nhwc_dense(x) : x.is_contiguous()) && weight.is_contiguous() && x.dtype() == weight.dtype(),
      "conv2d_forward inputs");
  const mixprec::cuda::detail::DeviceGuard guard(x.device().index);
  const Device dev = x.device();
  Tensor y = empty_in(g.y_shape(), x.dtype(), dev, nhwc);
  if (y.numel() == 0) return y;
  const Tensor b = bias.defined() ? kernels::contig(bias) : Tensor();
  // Channels-last runs the weight as KRSC too (a copy a call: the weight is a small fraction of
  // the activations' bytes), so that every operand is in the tensor cores' layout.
  const Tensor w = nhwc ? kernels::channels_last(weight) : weight;
  // A channels-last convolution no engine runs (a dtype or shape cuDNN has NHWC kernels for
  // none of): the NCHW one on contiguous copies, the result laid out again.
  if (nhwc && !has_engine(g, Pass::forward, x, w, y))
    return kernels::channels_last(cuda::conv2d_forward(kernels::contig(x), weight, bias, g.in_nchw(), relu));
  // 1. Everything in one graph: the convolution's f32 result, + bias, ReLU, rounded once into y.
  if (b.defined() || relu) {
    GraphKey k = key_of(g, Pass::forward, x, w, y);
    k.relu = relu;
    if (b.defined()) k.bias_type = int(cudnn_type(b.dtype())), k.align_b = alignment(b.data_ptr());
    if (const auto c = plans_for(k); !c->plans.empty()) {
      std::vector<void*> ptrs{x.data_ptr(), w.data_ptr(), y.data_ptr()};
      if (b.defined()) ptrs.push_back(b.data_ptr());
      run_best(*c, dev.index, ptrs);
      return y;
    }
  } else if (run_pass(g, Pass::forward, x, w, y)) {
    return y;
  }
  // 2. No engine fuses it: the convolution into f32 (or y's dtype where cuDNN has no mixed
  // output), then the bias and ReLU by the element-wise kernels, in f32.
  Tensor acc = empty_in(g.y_shape(), x.dtype() == DType::f64 ? DType::f64 : DType::f32, dev, nhwc);
  if (!run_pass(g, Pass::forward, x, w, acc)) {
    MIXPREC_CHECK(run_pass(g, Pass::forward, x, w, y), "conv2d on ", dev.str(), ": cuDNN has no engine for ",
                  describe(g, x));
    if (!b.defined() && !relu) return y;
    acc = kernels::cast(y, acc.dtype());
  }
  if (b.defined()) acc = kernels::binary(BinaryOp::add, acc, kernels::cast(b, acc.dtype()).reshape({1, g.oc, 1, 1}));
  if (relu) acc = kernels::activation(Activation::relu, acc);
  kernels::copy(acc, y);
  return y;
}

ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype) {
  const mixprec::cuda::detail::DeviceGuard guard(grad_y.device().index);
  const Device dev = grad_y.device();
  const bool nhwc = g.channels_last;
  const Tensor gy = in_layout(grad_y, nhwc);
  ConvGrads out;
  Tensor w, dw, xc;  // the data pass's weight; the filter pass's output and input
  if (need_x) {
    out.x = empty_in(g.x_shape(), gy.dtype(), dev, nhwc);
    w = in_layout(weight.dtype() == gy.dtype() ? weight : kernels::cast(weight, gy.dtype()), nhwc);
  }
  if (need_weight) {
    out.weight = Tensor::empty(g.w_shape(), weight_dtype, dev);
    // Channels-last writes the gradient KRSC, then copies it into the weight's layout.
    dw = nhwc ? empty_in(g.w_shape(), weight_dtype, dev, true) : out.weight;
    xc = in_layout(x.dtype() == gy.dtype() ? x : kernels::cast(x, gy.dtype()), nhwc);
  }
  // A channels-last pass no engine runs (as in the forward): the NCHW backward on contiguous
  // copies, the input's gradient laid out again. Only weight-sized tensors are made to ask.
  if (nhwc) {
    const auto narrow_w = [&] { return w.defined() ? w : empty_in(g.w_shape(), gy.dtype(), dev, true); };
    const bool data_ok = !need_x || has_engine(g, Pass::backward_data, out.x, w, gy);
    const bool filter_ok = !need_weight || has_engine(g, Pass::backward_filter, xc, dw, gy) ||
                           has_engine(g, Pass::backward_filter, xc, narrow_w(), gy);
    if (!data_ok || !filter_ok) {
      out = ConvGrads();
      ConvGrads r = cuda::conv2d_backward(kernels::contig(gy), xc.defined() ? kernels::contig(xc) : x, weight,
                                          g.in_nchw(), need_x, need_weight, need_bias, bias_dtype, weight_dtype);
      if (r.x.defined()) r.x = kernels::channels_last(r.x);
      return r;
    }
  }
  if (need_x && out.x.numel() > 0)
    MIXPREC_CHECK(run_pass(g, Pass::backward_data, out.x, w, gy), "conv2d backward (data) on ", dev.str(),
                  ": cuDNN has no engine for ", describe(g, gy));
  if (need_weight) {
    if (dw.numel() > 0 && !run_pass(g, Pass::backward_filter, xc, dw, gy)) {
      // An f32 weight gradient from 16-bit operands (autocast's wide weight) where no engine
      // writes f32 from them (bf16 on cuDNN 9.19): the gradient in the operands' dtype (f32
      // accumulation inside cuDNN, one rounding), widened; PyTorch's autocast gives the same. The
      // operands widened to an f32 convolution instead took 2.2 times the step (GPU run
      // 2026-11-26, cnn 420,1000 amp-bf16: 20.4 ms against 9.1). Last, the widened operands.
      MIXPREC_CHECK(weight_dtype != gy.dtype(), "conv2d backward (filter) on ", dev.str(), ": cuDNN has no engine for ",
                    describe(g, gy));
      Tensor narrow = empty_in(g.w_shape(), gy.dtype(), dev, nhwc);
      if (run_pass(g, Pass::backward_filter, xc, narrow, gy)) {
        dw = narrow;
      } else {
        MIXPREC_CHECK(run_pass(g, Pass::backward_filter, in_layout(kernels::cast(xc, weight_dtype), nhwc), dw,
                               in_layout(kernels::cast(gy, weight_dtype), nhwc)),
                      "conv2d backward (filter) on ", dev.str(), ": cuDNN has no engine for ", describe(g, gy));
      }
    }
    if (!dw.same(out.weight)) kernels::copy(dw, out.weight);  // widens and/or reorders in one pass
  }
  // Channels-last: the sum over N, H and W is one over the rows of the [N*H*W, C] bytes.
  if (need_bias)
    out.bias = nhwc ? kernels::sum(kernels::nhwc_view(gy), {0, 1, 2}, false, bias_dtype)
                    : kernels::sum(gy, {0, 2, 3}, false, bias_dtype);
  return out;
}

}  // namespace mixprec::kernels::cuda
