// Reference embedding: the gather of weight rows (byte copies) and the scatter-add of the
// gradient's rows, summed in index order in f32 (f64 for f64) and rounded once.
#include <cstring>

#include "kernels/embedding.h"
#include "kernels/shape.h"

namespace mixprec::kernels::ref {

Tensor embedding_forward(const Tensor& weight, const Tensor& indices) {
  const Tensor w = contig(weight);
  const int64_t rows = w.size(0), dim = w.size(1);
  const std::vector<int64_t> idx = indices.to_vector_i64();
  for (size_t i = 0; i < idx.size(); ++i)
    MIXPREC_CHECK(idx[i] >= 0 && idx[i] < rows, bad_embedding_index(int64_t(i), idx[i], rows));
  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor dst = Tensor::empty(shape, w.dtype());
  const size_t row_bytes = size_t(dim) * dtype_size(w.dtype());
  const char* src = static_cast<const char*>(w.data_ptr());
  char* out = static_cast<char*>(dst.data_ptr());
  for (size_t i = 0; i < idx.size(); ++i)
    if (row_bytes) std::memcpy(out + i * row_bytes, src + size_t(idx[i]) * row_bytes, row_bytes);
  return dst;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype) {
  const std::vector<int64_t> idx = indices.to_vector_i64();
  const int64_t dim = grad.size(-1);
  const std::vector<double> g = grad.to_vector_f64();  // exact for every floating dtype
  auto scatter = [&](auto zero) {
    std::vector<decltype(zero)> acc(size_t(num_embeddings * dim), zero);
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] < 0 || idx[i] >= num_embeddings) continue;
      for (int64_t d = 0; d < dim; ++d) acc[size_t(idx[i] * dim + d)] += decltype(zero)(g[i * size_t(dim) + size_t(d)]);
    }
    return Tensor::from_vector(std::vector<double>(acc.begin(), acc.end()), {num_embeddings, dim}, dtype);
  };
  return grad.dtype() == DType::f64 || dtype == DType::f64 ? scatter(0.0) : scatter(0.0f);
}

}  // namespace mixprec::kernels::ref
