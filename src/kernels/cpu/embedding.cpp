// Fast CPU embedding: the gather as OpenMP row copies; the backward as a counting sort of the
// positions by row, then each thread sums whole destination rows (no two threads write one row, no
// atomics), each row's gradient rows in index order in f32: the reference's bits, on any number
// of threads.
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/embedding.h"

namespace mixprec::kernels::cpu {

bool embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& dst) {
  if (!weight.is_contiguous() || !indices.is_contiguous()) return false;
  const int64_t rows = weight.size(0), n = indices.numel();
  const auto* idx = static_cast<const int64_t*>(indices.data_ptr());
  for (int64_t i = 0; i < n; ++i) MIXPREC_CHECK(idx[i] >= 0 && idx[i] < rows, bad_embedding_index(i, idx[i], rows));
  const size_t row_bytes = size_t(weight.size(1)) * dtype_size(weight.dtype());
  if (row_bytes == 0) return true;
  const char* src = static_cast<const char*>(weight.data_ptr());
  char* out = static_cast<char*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (detail::parallel_worth(n * int64_t(row_bytes), 1 << 16))
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + size_t(i) * row_bytes, src + size_t(idx[i]) * row_bytes, row_bytes);
  return true;
}

bool embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, Tensor& dst) {
  const DType t = grad.dtype();
  if (!f32_compute(t) || !grad.is_contiguous() || !indices.is_contiguous() || grad.dim() == 0) return false;
  const int64_t dim = grad.size(-1), n = indices.numel();
  const auto* idx = static_cast<const int64_t*>(indices.data_ptr());
  // Counting sort: the positions naming row v are order[first[v] .. first[v + 1]), ascending.
  std::vector<int64_t> first(size_t(num_embeddings) + 1, 0);
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] >= 0 && idx[i] < num_embeddings) ++first[size_t(idx[i]) + 1];
  for (int64_t v = 0; v < num_embeddings; ++v) first[size_t(v) + 1] += first[size_t(v)];
  std::vector<int64_t> order(size_t(first.back())), next(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] >= 0 && idx[i] < num_embeddings) order[size_t(next[size_t(idx[i])]++)] = i;
#pragma omp parallel if (detail::parallel_worth(num_embeddings * dim + n * dim, 1 << 15))
  {
    std::vector<float> acc(static_cast<size_t>(dim));
    std::vector<float> row(t == DType::f32 ? 0 : static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 16)
    for (int64_t v = 0; v < num_embeddings; ++v) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k = first[size_t(v)]; k < first[size_t(v) + 1]; ++k) {
        const float* g = in_f32(grad.data_ptr(), t, order[size_t(k)] * dim, dim, row.data());
        for (int64_t d = 0; d < dim; ++d) acc[size_t(d)] += g[d];
      }
      store_f32(dst.data_ptr(), t, v * dim, dim, acc.data());
    }
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
