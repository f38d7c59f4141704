// CUDA kernels of the embedding family (embedding.h): the gather of weight rows (an element per
// thread) and the scatter-add of the gradient's rows with f32 (f64 for f64) atomicAdd into a zeroed
// buffer, then one rounding to the weight's dtype. The atomics make the order of each row's sum,
// and so its last bits, vary from run to run (the CPU's counting sort is deterministic); an index
// out of range is recorded in loss.cu's device flag (bad_index.cuh), its row NaN, and thrown at
// the host's next wait, as nll_loss's bad targets are.
#include "kernels/cuda/bad_index.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

// dst[i, d] = weight[idx_i, d] (NaN for a bad index, recorded in `bad`).
template <class T>
__global__ void gather_kernel(const T* weight, const int64_t* idx, T* dst, int64_t n, int64_t rows, int64_t dim,
                              BadIndex* bad) {
  for (int64_t e = global_thread(); e < n * dim; e += grid_threads()) {
    const int64_t i = e / dim, d = e - i * dim, v = idx[i];
    dst[e] = check_index(bad, kEmbeddingIndex, i, v, rows) ? weight[v * dim + d] : convert_to<T>(NAN);
  }
}

// acc[idx_i, d] += grad[i, d] (A: f32, or f64 for f64 gradients); bad indices add nothing.
template <class G, class A>
__global__ void scatter_add_kernel(const G* grad, const int64_t* idx, A* acc, int64_t n, int64_t rows,
                                   int64_t dim) {
  for (int64_t e = global_thread(); e < n * dim; e += grid_threads()) {
    const int64_t i = e / dim, d = e - i * dim, v = idx[i];
    if (v >= 0 && v < rows) atomicAdd(&acc[v * dim + d], A(to_acc(grad[e])));
  }
}

}  // namespace

Tensor embedding_forward(const Tensor& weight, const Tensor& indices) {
  const Tensor w = contig(weight), idx = contig(indices);
  const int64_t rows = w.size(0), dim = w.size(1), n = idx.numel();
  Shape shape = idx.shape();
  shape.push_back(dim);
  Tensor dst = Tensor::empty(shape, w.dtype());
  if (n * dim == 0) return dst;
  const Launch on(w);
  BadIndex* bad = bad_index_flag();
  dispatch_floating(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gather_kernel<T><<<blocks_for(n * dim), kThreads, 0, on.stream()>>>(
        static_cast<const T*>(w.data_ptr()), static_cast<const int64_t*>(idx.data_ptr()),
        static_cast<T*>(dst.data_ptr()), n, rows, dim, bad);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return dst;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, DType dtype) {
  const Tensor g = contig(grad), idx = contig(indices);
  const int64_t dim = g.size(-1), n = idx.numel();
  const DType acc_dtype = g.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor acc = Tensor::zeros({num_embeddings, dim}, acc_dtype);
  if (n * dim > 0) {
    const Launch on(g);
    dispatch_floating(g.dtype(), [&](auto tag) {
      using G = decltype(tag);
      using A = acc_t<G>;
      scatter_add_kernel<G, A><<<blocks_for(n * dim), kThreads, 0, on.stream()>>>(
          static_cast<const G*>(g.data_ptr()), static_cast<const int64_t*>(idx.data_ptr()),
          static_cast<A*>(acc.data_ptr()), n, num_embeddings, dim);
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  }
  return acc.dtype() == dtype ? acc : kernels::cast(acc, dtype);
}

}  // namespace mixprec::kernels::cuda
