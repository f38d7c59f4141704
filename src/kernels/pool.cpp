// Dispatch of the pool family (pool.h): the GPU's kernels for CUDA tensors; on the CPU the fast kernel
// where it supports the case, else the reference.
#include "kernels/pool.h"

#include "kernels/shape.h"

namespace mixprec::kernels {

MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  if (is_channels_last(x)) {
#ifdef MIXPREC_WITH_CUDA
    MaxPoolResult r;
    if (x.device().is_cuda() && cuda::max_pool2d_forward_nhwc(x, g, r)) return r;
#endif
    MaxPoolResult nchw = max_pool2d_forward(contig(x), g);
    return {channels_last(nchw.dst), channels_last(nchw.argmax)};
  }
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::max_pool2d_forward(x, g);
#endif
  if (use_fast()) {
    MaxPoolResult r;
    r.dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype());
    r.argmax = Tensor::empty({g.n, g.c, g.oh, g.ow}, g.argmax_dtype());
    if (cpu::max_pool2d_forward(x, g, r)) return r;
  }
  note_reference();
  return ref::max_pool2d_forward(x, g);
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g) {
  if (is_channels_last(argmax)) {
#ifdef MIXPREC_WITH_CUDA
    Tensor gx;
    if (argmax.device().is_cuda() && cuda::max_pool2d_backward_nhwc(channels_last(grad_y), argmax, g, gx)) return gx;
#endif
    return channels_last(max_pool2d_backward(contig(grad_y), contig(argmax), g));
  }
  const DeviceScope on({&grad_y, &argmax});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::max_pool2d_backward(grad_y, argmax, g);
#endif
  if (use_fast()) {
    Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, grad_y.dtype());
    if (cpu::max_pool2d_backward(grad_y, argmax, g, gx)) return gx;
  }
  note_reference();
  return ref::max_pool2d_backward(grad_y, argmax, g);
}

Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g) {
  if (is_channels_last(x)) {
#ifdef MIXPREC_WITH_CUDA
    Tensor gx;
    if (x.device().is_cuda() && cuda::max_pool2d_backward_from_input_nhwc(channels_last(grad_y), x, g, gx)) return gx;
#endif
    return channels_last(max_pool2d_backward_from_input(contig(grad_y), contig(x), g));
  }
  const DeviceScope on({&grad_y, &x});
#ifdef MIXPREC_WITH_CUDA
  // The GPU finds the winners with the forward's own scan (kernels/cuda/pool.cu), so the result
  // is the argmax form's.
  if (on.cuda()) return cuda::max_pool2d_backward_from_input(grad_y, x, g);
#endif
  if (use_fast()) {
    Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, grad_y.dtype());
    if (cpu::max_pool2d_backward_from_input(grad_y, x, g, gx)) return gx;
  }
  note_reference();
  return ref::max_pool2d_backward_from_input(grad_y, x, g);
}

Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::avg_pool2d_forward(x, g);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype());
    if (cpu::avg_pool2d_forward(x, g, dst)) return dst;
  }
  note_reference();
  return ref::avg_pool2d_forward(x, g);
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g) {
  const DeviceScope on(grad_y);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::avg_pool2d_backward(grad_y, g);
#endif
  if (use_fast()) {
    Tensor gx = Tensor::empty({g.n, g.c, g.h, g.w}, grad_y.dtype());
    if (cpu::avg_pool2d_backward(grad_y, g, gx)) return gx;
  }
  note_reference();
  return ref::avg_pool2d_backward(grad_y, g);
}

Tensor pack_argmax_2bit(const Tensor& argmax) {
  const DeviceScope on(argmax);
  MIXPREC_ASSERT(argmax.dtype() == DType::u8, "pack_argmax_2bit: a ", dtype_name(argmax.dtype()), " argmax");
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::pack_argmax_2bit(argmax);
#endif
  if (use_fast()) {
    Tensor packed = Tensor::empty({(argmax.numel() + 3) / 4}, DType::u8);
    if (cpu::pack_argmax_2bit(argmax, packed)) return packed;
  }
  note_reference();
  return ref::pack_argmax_2bit(argmax);
}

Tensor unpack_argmax_2bit(const Tensor& packed, const Shape& shape) {
  const DeviceScope on(packed);
  MIXPREC_ASSERT(packed.dtype() == DType::u8 && packed.numel() == (shape_numel(shape) + 3) / 4,
                 "unpack_argmax_2bit: ", packed.numel(), " bytes for ", shape_str(shape));
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::unpack_argmax_2bit(packed, shape);
#endif
  if (use_fast()) {
    Tensor argmax = Tensor::empty(shape, DType::u8);
    if (cpu::unpack_argmax_2bit(packed, argmax)) return argmax;
  }
  note_reference();
  return ref::unpack_argmax_2bit(packed, shape);
}

}  // namespace mixprec::kernels
