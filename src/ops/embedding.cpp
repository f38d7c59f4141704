// embedding (autocast class keep): a gather of rows of a [V, D] weight by i64 indices of any shape;
// its backward scatter-adds the gradient's rows into a [V, D] weight gradient (f32 accumulation).
#include "ops/common.h"

namespace mixprec::ops {

Tensor embedding(const Tensor& weight_in, const Tensor& indices_in) {
  Tensor weight = weight_in, indices = indices_in;
  amp::autocast(OpId::embedding, {&weight, &indices});
  check_floating(weight, "embedding", "weight");
  MIXPREC_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, embedding_dim], got ",
                shape_str(weight.shape()));
  MIXPREC_CHECK(indices.defined() && indices.dtype() == DType::i64, "embedding: indices must be i64, got ",
                indices.defined() ? dtype_name(indices.dtype()) : "undefined", " ",
                indices.defined() ? shape_str(indices.shape()) : "");
  Tensor out = kernels::embedding_forward(weight, indices);
  const int64_t rows = weight.size(0);
  const DType dt = weight.dtype();
  const Tensor idx = indices.detach();  // integer data: no gradient, nothing a user's write could break
  return autograd::record(out, "embedding", {weight}, [=](const Tensor& g, const autograd::Node&) {
    return std::vector<Tensor>{kernels::embedding_backward(g, idx, rows, dt)};
  });
}

}  // namespace mixprec::ops
