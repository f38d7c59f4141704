// Kernels of the embedding family (ops/embedding.cpp): the gather of weight rows by index and the
// scatter-add of the gradient's rows back into a [V, D] weight gradient, accumulated in f32 (f64
// for f64). Reference: ref/embedding.cpp; fast: cpu/embedding.cpp; dispatch: embedding.cpp.
#pragma once
#include <string>

#include "kernels/backend.h"
#include "mixprec/error.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// The error of an index out of [0, rows) at flat (row-major) position `pos` of the indices.
inline std::string bad_embedding_index(int64_t pos, int64_t value, int64_t rows) {
  return detail::concat("embedding: indices[", pos, "] = ", value, " is not a row index in [0, ", rows, ")");
}

// weight [V, D], indices i64 of any shape S -> S + [D] in weight's dtype (row copies, no rounding).
// An index outside [0, V) throws one line naming embedding and the index's position.
Tensor embedding_forward(const Tensor& weight, const Tensor& indices);
// grad S + [D] -> [V, D] in `dtype`: row v is the sum of the gradient rows whose index is v, taken
// in index order in f32 (f64 for f64) and rounded once; rows no index names are 0. The indices
// were checked by the forward (an out-of-range one contributes nothing here).
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype);

namespace ref {
Tensor embedding_forward(const Tensor& weight, const Tensor& indices);
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype);
}  // namespace ref

namespace cpu {
bool embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& dst);
bool embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, Tensor& dst);
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/embedding.cu
// An index out of [0, V) is recorded in loss.cu's device flag (the forward writes a NaN row) and
// thrown at the host's next wait, as nll_loss's bad targets are (loss.h: report_bad_targets).
Tensor embedding_forward(const Tensor& weight, const Tensor& indices);
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype);
}  // namespace cuda

}  // namespace mixprec::kernels
