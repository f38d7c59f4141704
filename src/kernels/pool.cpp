// Dispatch of the pool family (pool.h): the GPU's kernels for CUDA tensors; on the CPU the fast kernel
// where it supports the case, else the reference.
#include "kernels/pool.h"

namespace mixprec::kernels {

MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
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

}  // namespace mixprec::kernels
