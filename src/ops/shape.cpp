// Shape and dtype ops (autocast class keep): reshape/flatten/transpose/slice/expand (views where
// possible), contiguous, cast; and cat (class promote: mixed floating dtypes go to the widest,
// inside autocast or not, as in PyTorch).
#include <optional>

#include "ops/common.h"

namespace mixprec::ops {

static Tensor make_view(const Tensor& x, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = x.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

// The strides that show x's elements, in order, as `shape` without a copy, or nothing where none
// do (ATen's computeStride): x's dimensions are grouped into chunks that are contiguous among
// themselves, and each chunk must map to whole dimensions of `shape`.
static std::optional<Shape> view_strides(const Tensor& x, const Shape& shape) {
  const Shape &old_shape = x.shape(), &old_strides = x.strides();
  if (x.numel() == 0 || old_shape.empty()) return contiguous_strides(shape);
  Shape strides(shape.size(), 1);
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_stride = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[size_t(d)];
    // The chunk ends at d where dimension d - 1 does not continue it.
    if (d == 0 || (old_shape[size_t(d - 1)] != 1 && old_strides[size_t(d - 1)] != tensor_numel * chunk_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        strides[size_t(view_d)] = view_numel * chunk_stride;
        view_numel *= shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_stride = old_strides[size_t(d - 1)];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MIXPREC_CHECK(infer < 0, "reshape ", shape_str(x.shape()), " -> ", shape_str(shape_in), ": only one -1 allowed");
      infer = int64_t(i);
    } else {
      MIXPREC_CHECK(shape[i] >= 0, "reshape: bad dimension in ", shape_str(shape_in));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MIXPREC_CHECK(known > 0 && x.numel() % known == 0, "reshape ", shape_str(x.shape()), " -> ", shape_str(shape_in),
                  ": ", x.numel(), " elements do not divide");
    shape[size_t(infer)] = x.numel() / known;
  }
  MIXPREC_CHECK(shape_numel(shape) == x.numel(), "reshape ", shape_str(x.shape()), " -> ", shape_str(shape_in), ": ",
                x.numel(), " elements vs ", shape_numel(shape));
  // Same shape: the tensor itself (no node), so an op that reshapes its result to the shape it
  // already has (linear on 2-d input) is the op anomaly mode names, not "reshape".
  if (shape == x.shape()) return x;
  // A view wherever x's strides allow one (a slice of a contiguous tensor split or merged along
  // dimensions it keeps whole, as q/k/v of a fused projection are), else a contiguous copy.
  const std::optional<Shape> strides = view_strides(x, shape);
  Tensor src = strides || x.is_contiguous() ? x : x.contiguous();
  Tensor out = make_view(src, shape, strides ? *strides : contiguous_strides(shape), src.offset());
  const Shape& in_shape = src.shape();  // the lambda keeps a copy
  return autograd::record(out, "reshape", {src}, [in_shape](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::contig(g).reshape(in_shape)};
  });
}

Tensor flatten(const Tensor& x, int64_t start_dim) {
  const int64_t sd = wrap_dim(start_dim, x.dim(), "flatten");
  Shape s(x.shape().begin(), x.shape().begin() + sd);
  int64_t rest = 1;
  for (int64_t d = sd; d < x.dim(); ++d) rest *= x.size(d);
  s.push_back(rest);
  return reshape(x, s);
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  const int64_t a = wrap_dim(d0, x.dim(), "transpose"), b = wrap_dim(d1, x.dim(), "transpose");
  Shape shape = x.shape(), strides = x.strides();
  std::swap(shape[size_t(a)], shape[size_t(b)]);
  std::swap(strides[size_t(a)], strides[size_t(b)]);
  Tensor out = make_view(x, shape, strides, x.offset());
  return autograd::record(out, "transpose", {x}, [a, b](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{g.transpose(a, b)};
  });
}

Tensor expand(const Tensor& x, const Shape& shape_in) {
  const int64_t nd = int64_t(shape_in.size()), lead = nd - x.dim();
  MIXPREC_CHECK(lead >= 0, "expand ", shape_str(x.shape()), " -> ", shape_str(shape_in),
                ": fewer dims than the tensor");
  Shape shape = shape_in, strides(size_t(nd), 0);
  bool repeats = lead > 0;
  for (int64_t d = 0; d < nd; ++d) {
    if (d < lead) {
      MIXPREC_CHECK(shape[size_t(d)] >= 0, "expand ", shape_str(x.shape()), " -> ", shape_str(shape_in),
                    ": a new leading dim needs a size");
      continue;
    }
    const int64_t have = x.size(d - lead);
    int64_t& want = shape[size_t(d)];
    if (want == -1) want = have;
    MIXPREC_CHECK(want == have || have == 1, "expand ", shape_str(x.shape()), " -> ", shape_str(shape_in), ": dim ", d,
                  " of size ", have, " can only be repeated from size 1");
    if (want == have)
      strides[size_t(d)] = x.strides()[size_t(d - lead)];
    else
      repeats = true;
  }
  if (!repeats) return x;
  Tensor out = make_view(x, shape, strides, x.offset());
  const Shape& in_shape = x.shape();  // the lambda keeps a copy
  return autograd::record(out, "expand", {x}, [in_shape](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{sum_to(kernels::contig(g), in_shape)};  // over the repeated dims
  });
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  const int64_t d = wrap_dim(dim, x.dim(), "slice");
  const int64_t n = x.size(d);
  MIXPREC_CHECK(0 <= start && start <= end && end <= n, "slice: range [", start, ", ", end,
                ") out of bounds for dimension ", d, " of size ", n);
  Shape shape = x.shape();
  shape[size_t(d)] = end - start;
  Tensor out = make_view(x, shape, x.strides(), x.offset() + start * x.strides()[size_t(d)]);
  const Shape& in_shape = x.shape();  // the lambda keeps a copy
  const DType dt = x.dtype();
  return autograd::record(out, "slice", {x}, [=](const Tensor& g, const autograd::Node&) {
    Tensor full = Tensor::zeros(in_shape, dt, g.device());
    Tensor part = make_view(full, g.shape(), full.strides(), start * full.strides()[size_t(d)]);
    kernels::copy(g, part);
    return std::vector<Tensor>{full};
  });
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = x.detach().clone();
  return autograd::record(out, "contiguous", {x},
                          [](const Tensor& g, const autograd::Node&) { return std::vector<Tensor>{g}; });
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  if (format == MemoryFormat::contiguous) return contiguous(x);
  MIXPREC_CHECK(x.dim() == 4, "contiguous(channels_last): needs a 4-d [N, C, H, W] tensor, got ", shape_str(x.shape()));
  if (kernels::nhwc_dense(x)) return x;
  Tensor out = kernels::channels_last(x);
  return autograd::record(out, "contiguous", {x},
                          [](const Tensor& g, const autograd::Node&) { return std::vector<Tensor>{g}; });
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  // A channels-last tensor keeps its layout (PyTorch's .to(dtype) keeps the memory format), so
  // autocast's cast of a channels-last input hands the convolution channels-last bytes.
  if (kernels::is_channels_last(x)) {
    Tensor out = kernels::empty_channels_last(x.shape(), dtype, x.device());
    kernels::copy(x, out);
    return record_cast(x, out);
  }
  return record_cast(x, kernels::cast(x, dtype));
}

Tensor record_cast(const Tensor& x, const Tensor& out) {
  if (!is_floating(out.dtype()) || !is_floating(x.dtype())) return out;  // integer results carry no gradient
  const DType src_t = x.dtype();
  return autograd::record(out, "cast", {x}, [src_t](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::cast(g, src_t)};
  });
}

Tensor to_device(const Tensor& x, const Device& device) {
  if (x.device() == device) return x;
  Tensor out = kernels::to_device(x, device);
  if (!is_floating(x.dtype())) return out;
  const Device src_device = x.device();
  return autograd::record(out, "to_device", {x}, [src_device](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::to_device(g, src_device)};
  });
}

Tensor cat(const std::vector<Tensor>& xs_in, int64_t dim) {
  MIXPREC_CHECK(!xs_in.empty(), "cat: needs at least one tensor");
  std::vector<Tensor> xs = xs_in;
  // Promotion is cat's whole autocast policy (OpId::cat is `promote`) and applies outside autocast
  // too, so it is done here for any number of inputs (amp::autocast takes a fixed list).
  DType t = xs[0].defined() ? xs[0].dtype() : DType::f32;
  for (size_t i = 0; i < xs.size(); ++i) {
    MIXPREC_CHECK(xs[i].defined(), "cat: tensor ", i, " is undefined");
    MIXPREC_CHECK(xs[i].device() == xs[0].device(), "cat: inputs on different devices (tensor 0 on ",
                  xs[0].device().str(), ", tensor ", i, " on ", xs[i].device().str(),
                  "); move them to one device with .to(device)");
    if (is_floating(xs[i].dtype()) && is_floating(t))
      t = promote_floating(t, xs[i].dtype());
    else
      MIXPREC_CHECK(xs[i].dtype() == t, "cat: tensor ", i, " is ", dtype_name(xs[i].dtype()), " but tensor 0 is ",
                    dtype_name(xs[0].dtype()));
  }
  for (Tensor& x : xs)
    if (x.dtype() != t) x = x.to(t);
  const Tensor& first = xs[0];
  const int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[size_t(d)] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    bool fits = xs[i].dim() == first.dim();
    for (int64_t k = 0; fits && k < first.dim(); ++k) fits = k == d || xs[i].size(k) == first.size(k);
    MIXPREC_CHECK(fits, "cat: tensor ", i, " has shape ", shape_str(xs[i].shape()), " but tensor 0 has ",
                  shape_str(first.shape()), "; all dims but ", d, " must match");
    out_shape[size_t(d)] += xs[i].size(d);
  }
  Tensor out = Tensor::empty(out_shape, t, first.device());
  std::vector<int64_t> offsets;
  int64_t off = 0;
  for (const Tensor& x : xs) {
    Tensor part = out.slice(d, off, off + x.size(d));  // a view: out requires no grad yet
    kernels::copy(x.detach(), part);
    offsets.push_back(off);
    off += x.size(d);
  }
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.size(d));
  return autograd::record(out, "cat", xs, [d, offsets, sizes](const Tensor& g, const autograd::Node& n) {
    std::vector<Tensor> grads(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i)
      if (n.needs_grad(i)) grads[i] = kernels::contig(g.slice(d, offsets[i], offsets[i] + sizes[i]));
    return grads;
  });
}

}  // namespace mixprec::ops
