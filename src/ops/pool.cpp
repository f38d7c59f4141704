// Pooling (autocast class keep): max_pool2d (for backward it keeps its input where the op before
// keeps it anyway, else the argmax: two bits an output for windows up to 4 elements, one byte up
// to 256),
// avg_pool2d and adaptive_avg_pool2d, over [N, C, H, W] or [C, H, W].
#include "autograd/nodes.h"
#include "ops/common.h"

namespace mixprec::ops {
namespace {

// PyTorch's pooling_output_shape: floor or ceil, and in ceil mode the last window must start
// inside the input or its left padding.
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// Runs f on a 4-d view of x ([C, H, W] gains a batch of one) and drops the added dim again.
template <class F>
Tensor batched(const Tensor& x, F&& f) {
  if (x.dim() != 3) return f(x);
  Tensor y = f(reshape(x, {1, x.size(0), x.size(1), x.size(2)}));
  return reshape(y, {y.size(1), y.size(2), y.size(3)});
}

}  // namespace

kernels::PoolGeometry pool_geometry(std::string_view op, const Shape& x, IntPair k, const Pool2dOptions& o, bool max) {
  MIXPREC_CHECK(x.size() == 4, op, ": input must be [N, C, H, W] or [C, H, W], got ", shape_str(x));
  MIXPREC_CHECK(k.h >= 1 && k.w >= 1, op, ": kernel_size must be >= 1, got (", k.h, ", ", k.w, ")");
  const IntPair stride = o.stride == IntPair(0) ? k : o.stride;
  MIXPREC_CHECK(stride.h >= 1 && stride.w >= 1, op, ": stride must be >= 1, got (", stride.h, ", ", stride.w, ")");
  MIXPREC_CHECK(max || o.dilation == IntPair(1), op, ": dilation is for max pooling only");
  MIXPREC_CHECK(o.dilation.h >= 1 && o.dilation.w >= 1, op, ": dilation must be >= 1");
  MIXPREC_CHECK(o.padding.h >= 0 && o.padding.w >= 0 && o.padding.h <= k.h / 2 && o.padding.w <= k.w / 2, op,
                ": padding (", o.padding.h, ", ", o.padding.w, ") must be >= 0 and at most half the kernel (", k.h,
                ", ", k.w, ")");
  kernels::PoolGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kh = k.h, g.kw = k.w, g.stride_h = stride.h, g.stride_w = stride.w;
  g.pad_h = o.padding.h, g.pad_w = o.padding.w, g.dil_h = o.dilation.h, g.dil_w = o.dilation.w;
  g.count_include_pad = o.count_include_pad;
  g.oh = pooled_size(g.h, g.kh, g.pad_h, g.stride_h, g.dil_h, o.ceil_mode);
  g.ow = pooled_size(g.w, g.kw, g.pad_w, g.stride_w, g.dil_w, o.ceil_mode);
  MIXPREC_CHECK(g.oh >= 1 && g.ow >= 1, op, ": kernel ", (g.kh - 1) * g.dil_h + 1, "x", (g.kw - 1) * g.dil_w + 1,
                " is larger than the padded input ", g.h + 2 * g.pad_h, "x", g.w + 2 * g.pad_w, " of input ",
                shape_str(x));
  return g;
}

Tensor max_pool2d(const Tensor& x_in, IntPair kernel_size, const Pool2dOptions& o) {
  return batched(x_in, [&](Tensor x) {
    amp::autocast(OpId::max_pool2d, {&x});
    check_floating(x, "max_pool2d");
    const kernels::PoolGeometry g = pool_geometry("max_pool2d", x.shape(), kernel_size, o, true);
    // A channels-last input keeps its layout, in the output, the argmax and the gradient (kernels/shape.h).
    const Tensor xd = kernels::in_layout_of(x.detach(), x);
    kernels::MaxPoolResult r = kernels::max_pool2d_forward(xd, g);
    // An input the op before keeps for its own backward (a ReLU's output, a fused conv-ReLU's) is
    // read again rather than an argmax saved: the backward finds the same winners, and the step
    // holds no byte per output for the pool. Otherwise the argmax is kept.
    if (xd.storage() == x.storage() && autograd::kept_by_grad_fn(x)) {
      return autograd::record(
          r.dst, "max_pool2d", {x},
          [xd, g](const Tensor& gy, const autograd::Node&) {
            return std::vector<Tensor>{kernels::max_pool2d_backward_from_input(kernels::in_layout_of(gy, xd), xd, g)};
          },
          {xd});
    }
    // A window of up to 4 taps (the 2x2 pool) keeps its argmax in two bits an output; the
    // backward unpacks it into a temporary for as long as it runs. A channels-last argmax is
    // packed in its bytes' order (NHWC) and unpacked into the same layout.
    if (g.argmax_fits_two_bits() && autograd::grad_enabled() && autograd::any_requires_grad({x})) {
      const bool cl = kernels::is_channels_last(r.argmax);
      const Tensor packed = kernels::pack_argmax_2bit(cl ? kernels::nhwc_view(r.argmax) : r.argmax);
      r.argmax = Tensor();
      return autograd::record(r.dst, "max_pool2d", {x}, [packed, g, cl](const Tensor& gy, const autograd::Node&) {
        const Tensor argmax = cl ? kernels::nchw_view(kernels::unpack_argmax_2bit(packed, {g.n, g.oh, g.ow, g.c}))
                                 : kernels::unpack_argmax_2bit(packed, {g.n, g.c, g.oh, g.ow});
        return std::vector<Tensor>{kernels::max_pool2d_backward(kernels::in_layout_of(gy, argmax), argmax, g)};
      });
    }
    const Tensor argmax = r.argmax;
    return autograd::record(r.dst, "max_pool2d", {x}, [argmax, g](const Tensor& gy, const autograd::Node&) {
      return std::vector<Tensor>{kernels::max_pool2d_backward(kernels::in_layout_of(gy, argmax), argmax, g)};
    });
  });
}

Tensor avg_pool2d(const Tensor& x_in, IntPair kernel_size, const Pool2dOptions& o) {
  return batched(x_in, [&](Tensor x) {
    amp::autocast(OpId::avg_pool2d, {&x});
    check_floating(x, "avg_pool2d");
    const kernels::PoolGeometry g = pool_geometry("avg_pool2d", x.shape(), kernel_size, o, false);
    Tensor out = kernels::avg_pool2d_forward(kernels::contig(x.detach()), g);
    return autograd::record(out, "avg_pool2d", {x}, [g](const Tensor& gy, const autograd::Node&) {
      return std::vector<Tensor>{kernels::avg_pool2d_backward(kernels::contig(gy), g)};
    });
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, IntPair output_size) {
  return batched(x_in, [&](Tensor x) {
    amp::autocast(OpId::adaptive_avg_pool2d, {&x});
    check_floating(x, "adaptive_avg_pool2d");
    MIXPREC_CHECK(x.dim() == 4, "adaptive_avg_pool2d: input must be [N, C, H, W] or [C, H, W], got ",
                  shape_str(x.shape()));
    MIXPREC_CHECK(output_size.h >= 1 && output_size.w >= 1, "adaptive_avg_pool2d: output size must be >= 1, got (",
                  output_size.h, ", ", output_size.w, ")");
    MIXPREC_CHECK(x.size(2) >= 1 && x.size(3) >= 1, "adaptive_avg_pool2d: empty input ", shape_str(x.shape()));
    kernels::PoolGeometry g;
    g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
    g.oh = output_size.h, g.ow = output_size.w;
    g.adaptive = true;
    Tensor out = kernels::avg_pool2d_forward(kernels::contig(x.detach()), g);
    return autograd::record(out, "adaptive_avg_pool2d", {x}, [g](const Tensor& gy, const autograd::Node&) {
      return std::vector<Tensor>{kernels::avg_pool2d_backward(kernels::contig(gy), g)};
    });
  });
}

}  // namespace mixprec::ops
