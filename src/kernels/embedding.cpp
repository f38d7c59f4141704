// Dispatch of the embedding family (embedding.h): embedding.cu on a GPU, the fast CPU kernel where
// it supports the case, else the reference.
#include "kernels/embedding.h"

namespace mixprec::kernels {

namespace {
Shape gathered_shape(const Tensor& weight, const Tensor& indices) {
  Shape s = indices.shape();
  s.push_back(weight.size(1));
  return s;
}
}  // namespace

Tensor embedding_forward(const Tensor& weight, const Tensor& indices) {
  const DeviceScope on({&weight, &indices});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::embedding_forward(weight, indices);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(gathered_shape(weight, indices), weight.dtype());
    if (cpu::embedding_forward(weight, indices, dst)) return dst;
  }
  note_reference();
  return ref::embedding_forward(weight, indices);
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype) {
  const DeviceScope on({&grad, &indices});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::embedding_backward(grad, indices, num_embeddings, dtype);
#endif
  if (use_fast() && dtype == grad.dtype()) {
    Tensor dst = Tensor::empty({num_embeddings, grad.dim() ? grad.size(-1) : 0}, dtype);
    if (cpu::embedding_backward(grad, indices, num_embeddings, dst)) return dst;
  }
  note_reference();
  return ref::embedding_backward(grad, indices, num_embeddings, dtype);
}

}  // namespace mixprec::kernels
