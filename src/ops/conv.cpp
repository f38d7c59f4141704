// conv2d (autocast class lower): stride, padding, dilation, groups, bias and an optional fused
// ReLU; oneDNN forward, backward-data and backward-weights on the fast path, reference otherwise.
#include <algorithm>
#include <utility>

#include "ops/common.h"

namespace mixprec::ops {
namespace {

kernels::ConvGeometry geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  MIXPREC_CHECK(x.dim() == 4, "conv2d: input must be [N, C, H, W] (or [C, H, W]), got ", shape_str(x.shape()));
  MIXPREC_CHECK(w.dim() == 4, "conv2d: weight must be [out_channels, in_channels/groups, kH, kW], got ",
                shape_str(w.shape()));
  MIXPREC_CHECK(o.groups >= 1, "conv2d: groups must be >= 1, got ", o.groups);
  MIXPREC_CHECK(o.stride.h >= 1 && o.stride.w >= 1, "conv2d: stride must be >= 1, got (", o.stride.h, ", ", o.stride.w,
                ")");
  MIXPREC_CHECK(o.padding.h >= 0 && o.padding.w >= 0, "conv2d: padding must be >= 0, got (", o.padding.h, ", ",
                o.padding.w, ")");
  MIXPREC_CHECK(o.dilation.h >= 1 && o.dilation.w >= 1, "conv2d: dilation must be >= 1, got (", o.dilation.h, ", ",
                o.dilation.w, ")");
  kernels::ConvGeometry g;
  g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.oc = w.size(0), g.kh = w.size(2), g.kw = w.size(3);
  g.stride_h = o.stride.h, g.stride_w = o.stride.w, g.pad_h = o.padding.h, g.pad_w = o.padding.w;
  g.dil_h = o.dilation.h, g.dil_w = o.dilation.w, g.groups = o.groups;
  MIXPREC_CHECK(g.oc % g.groups == 0, "conv2d: weight ", shape_str(w.shape()), " has ", g.oc,
                " output channels, not divisible by groups=", g.groups);
  MIXPREC_CHECK(g.c == w.size(1) * g.groups, "conv2d: input ", shape_str(x.shape()), " has ", g.c,
                " channels, but weight ", shape_str(w.shape()), " with groups=", g.groups, " expects ",
                w.size(1) * g.groups);
  const int64_t ekh = (g.kh - 1) * g.dil_h + 1, ekw = (g.kw - 1) * g.dil_w + 1;  // dilated kernel extent
  const int64_t ph = g.h + 2 * g.pad_h, pw = g.w + 2 * g.pad_w;
  MIXPREC_CHECK(ekh <= ph && ekw <= pw, "conv2d: kernel ", ekh, "x", ekw,
                (g.dil_h > 1 || g.dil_w > 1 ? " (dilated)" : ""), " of weight ", shape_str(w.shape()),
                " is larger than the padded input ", ph, "x", pw, " of input ", shape_str(x.shape()), " (padding ",
                g.pad_h, ", ", g.pad_w, ")");
  g.oh = (ph - ekh) / g.stride_h + 1;
  g.ow = (pw - ekw) / g.stride_w + 1;
  if (b.defined())
    MIXPREC_CHECK(b.dim() == 1 && b.size(0) == g.oc, "conv2d: bias must be [", g.oc, "] for weight ",
                  shape_str(w.shape()), ", got ", shape_str(b.shape()));
  return g;
}

// geometry() after the checks every convolution op makes of its (autocast) operands.
kernels::ConvGeometry checked_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  check_floating(w, "conv2d", "weight");
  if (b.defined()) check_floating(b, "conv2d", "bias");
  kernels::ConvGeometry g = geometry(x, w, b, o);
  MIXPREC_CHECK(x.dtype() == w.dtype(), "conv2d: input is ", dtype_name(x.dtype()), " but weight is ",
                dtype_name(w.dtype()), " (use autocast, or cast one of them)");
  return g;
}

// What a convolution's backward keeps (only what it will read), and that backward.
struct ConvBackward {
  Tensor x_saved, w_saved;  // x for the weight gradient, the weight for the input's
  kernels::ConvGeometry g;
  DType bias_t = DType::f32, weight_t = DType::f32;

  // The gradients of the inputs from grad_y (dense, in y's layout).
  std::vector<Tensor> gradients(const Tensor& gy, const autograd::Node& n) const {
    const bool need_b = n.next.size() > 2 && n.needs_grad(2);
    return listed(
        kernels::conv2d_backward(gy, x_saved, w_saved, g, n.needs_grad(0), n.needs_grad(1), need_b, bias_t, weight_t),
        n);
  }
  // The same from the gradient of a max pool over y (its u8 argmax, or packed two bits an output
  // where argmax_2bit; geometry pool), after a ReLU where relu_y (the pool's output) is defined.
  std::vector<Tensor> gradients_through_pool(const Tensor& grad, Tensor argmax, bool argmax_2bit,
                                             const kernels::PoolGeometry& pool, Tensor relu_y,
                                             const autograd::Node& n) const {
    const bool need_b = n.next.size() > 2 && n.needs_grad(2);
    return listed(
        kernels::conv2d_max_pool2d_backward(grad, std::move(argmax), argmax_2bit, pool, std::move(relu_y), x_saved,
                                            w_saved, g, n.needs_grad(0), n.needs_grad(1), need_b, bias_t, weight_t),
        n);
  }
  static std::vector<Tensor> listed(const kernels::ConvGrads& grads, const autograd::Node& n) {
    std::vector<Tensor> r{grads.x, grads.weight};
    if (n.next.size() > 2) r.push_back(grads.bias);
    return r;
  }
};

// A convolution's operands as the kernels take them, the graph's inputs, and its backward.
struct Saved {
  Tensor xd, wk, bd;           // x dense (in the forward's layout), the weight, the bias
  std::vector<Tensor> inputs;  // the graph's inputs
  ConvBackward backward;       // what the recorded lambda captures, and nothing else
};

// x, w, b_cast: the operands after autocast (the bias is cast into x's dtype here); x_in, w_in,
// b_in: the op's arguments.
Saved saved(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Tensor& x, const Tensor& w,
            const Tensor& b_cast, const kernels::ConvGeometry& g) {
  const Tensor b = b_cast.defined() && b_cast.dtype() != x.dtype() ? b_cast.to(x.dtype()) : b_cast;
  Saved s;
  s.backward.g = g;
  // The weight goes in undetached when dense: its storage and version key the reordered-weight cache.
  s.xd = g.channels_last ? kernels::channels_last(x.detach()) : kernels::contig(x.detach());
  s.wk = w.is_contiguous() ? w : kernels::contig(w.detach());
  s.bd = b.defined() ? kernels::contig(b.detach()) : Tensor();
  // Save only what backward will read: x for the weight gradient, the weight for the input's.
  const bool x_grad = x.defined() && x.requires_grad(), w_grad = w.requires_grad();
  s.backward.x_saved = w_grad ? s.xd : Tensor();
  s.backward.w_saved = x_grad ? s.wk : Tensor();
  // As in linear: an f32 weight or bias that autocast turned bf16 gets its gradient in f32,
  // straight from the convolution's f32 accumulation, with the graph edge past the cast node.
  const bool w_wide = w_in.dtype() == DType::f32 && w.dtype() == DType::bf16;
  const bool b_wide = b.defined() && b_in.dtype() == DType::f32 && b.dtype() == DType::bf16;
  s.backward.bias_t = b.defined() ? (b_wide ? DType::f32 : b.dtype()) : DType::f32;
  s.backward.weight_t = w_wide ? DType::f32 : w.dtype();
  s.inputs = {x, w_wide ? w_in : w};
  if (b.defined()) s.inputs.push_back(b_wide ? b_in : b);
  return s;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dOptions& o) {
  check_floating(x_in, "conv2d", "input");
  if (x_in.dim() == 3) {  // unbatched [C, H, W], as PyTorch allows
    const Shape& s = x_in.shape();
    Tensor y = conv2d(reshape(x_in, {1, s[0], s[1], s[2]}), w_in, b_in, o);
    return reshape(y, {y.size(1), y.size(2), y.size(3)});
  }
  Tensor x = x_in, w = w_in, b = b_in;
  amp::autocast(OpId::conv2d, {&x, &w, &b});
  kernels::ConvGeometry g = checked_geometry(x, w, b, o);
  g.channels_last = o.channels_last || kernels::is_channels_last(x);
  const Saved s = saved(x_in, w_in, b_in, x, w, b, g);
  Tensor out = kernels::conv2d_forward(s.xd, s.wk, s.bd, g, o.relu);
  // relu'(.) = [y > 0]; dropped as soon as the mask is applied (the lambda is mutable).
  Tensor y_mask = o.relu ? out.detach() : Tensor();
  return autograd::record(out, "conv2d", s.inputs,
                          [bw = s.backward, g, y_mask](const Tensor& g_in, const autograd::Node& n) mutable {
                            // The output is no longer needed once masked: freed before the convolution runs.
                            // The gradient in the forward's layout (y's).
                            const Tensor gy = y_mask.defined()  ? relu_masked_grad(g_in, y_mask)
                                              : g.channels_last ? kernels::channels_last(g_in)
                                                                : kernels::contig(g_in);
                            return bw.gradients(gy, n);
                          },
                          {s.backward.x_saved, s.backward.w_saved, y_mask});
}

Tensor conv2d_max_pool2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dOptions& o,
                         IntPair kernel_size, const Pool2dOptions& po) {
  // The two ops where the pool cannot follow the convolution in one call: channels-last, an
  // unbatched input.
  if (o.channels_last || x_in.dim() != 4 || kernels::is_channels_last(x_in))
    return max_pool2d(conv2d(x_in, w_in, b_in, o), kernel_size, po);
  Tensor x = x_in, w = w_in, b = b_in;
  amp::autocast(OpId::conv2d_max_pool2d, {&x, &w, &b});
  check_floating(x, "conv2d", "input");
  const kernels::ConvGeometry g = checked_geometry(x, w, b, o);
  const kernels::PoolGeometry pg = pool_geometry("max_pool2d", g.y_shape(), kernel_size, po, true);
  const Saved s = saved(x_in, w_in, b_in, x, w, b, g);
  kernels::MaxPoolResult r = kernels::conv2d_max_pool2d_forward(s.xd, s.wk, s.bd, g, pg, o.relu);
  const bool any_grad =
      std::any_of(s.inputs.begin(), s.inputs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!autograd::grad_enabled() || !any_grad) return r.dst;
  // The argmax in two bits an output where the window has at most 4 taps, as max_pool2d keeps it.
  const bool packed = pg.argmax_fits_two_bits();
  const Tensor argmax = packed ? kernels::pack_argmax_2bit(r.argmax) : r.argmax;
  r.argmax = Tensor();
  // The ReLU's mask: [y > 0] of the pooled output, each value its window's winner's (the kernels
  // apply it as they route the gradient; dropped once used: the lambda is mutable).
  Tensor y_mask = o.relu ? r.dst.detach() : Tensor();
  return autograd::record(
      r.dst, "conv2d_max_pool2d", s.inputs,
      [bw = s.backward, pg, packed, argmax, y_mask](const Tensor& g_in, const autograd::Node& n) mutable {
        return bw.gradients_through_pool(kernels::contig(g_in), argmax, packed, pg, std::move(y_mask), n);
      },
      {s.backward.x_saved, s.backward.w_saved, y_mask});
}

}  // namespace mixprec::ops
