// CUDA kernels of the embedding family (embedding.h): the gather of weight rows (an element per
// thread), and the gradient's scatter-add as PyTorch's embedding_dense_backward does it: the
// positions sorted by index (CUB's radix sort, stable: equal indices keep their position order),
// then each (row, column) of the weight's gradient sums its run of positions in that order in f32
// (f64 for f64) and is rounded once. No atomics, so the same bits on every run, as the CPU's
// counting sort gives them (mixprec/deterministic.h). An index out of range is recorded in
// loss.cu's device flag (bad_index.cuh), its row NaN, and thrown at the host's next wait, as
// nll_loss's bad targets are; its gradient goes nowhere.
#include <cub/device/device_radix_sort.cuh>

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

__global__ void iota_kernel(int64_t* dst, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = i;
}

// acc[v, d] = the sum over the positions i with index v of grad[i, d], in increasing i: `keys` are
// the indices sorted, `order` their positions (a stable sort), so v's run is found by binary search
// and read in order. A: f32, or f64 for f64 gradients.
template <class G, class A>
__global__ void run_sum_kernel(const G* grad, const int64_t* keys, const int64_t* order, A* acc, int64_t n,
                               int64_t rows, int64_t dim) {
  for (int64_t e = global_thread(); e < rows * dim; e += grid_threads()) {
    const int64_t v = e / dim, d = e - v * dim;
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    A s = 0;
    for (int64_t k = lo; k < n && keys[k] == v; ++k) s += A(to_acc(grad[order[k] * dim + d]));
    acc[e] = s;
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
  if (n * dim == 0 || num_embeddings == 0) {
    const Tensor zeros = Tensor::zeros({num_embeddings, dim}, acc_dtype, g.device());
    return zeros.dtype() == dtype ? zeros : kernels::cast(zeros, dtype);
  }
  Tensor acc = Tensor::empty({num_embeddings, dim}, acc_dtype, g.device());
  const Launch on(g);
  Tensor keys, order, scratch;
  {
    const MemoryScope scope(MemCategory::workspace);
    keys = Tensor::empty({n}, DType::i64, g.device());
    order = Tensor::empty({n}, DType::i64, g.device());
    Tensor positions = Tensor::empty({n}, DType::i64, g.device());
    iota_kernel<<<blocks_for(n), kThreads, 0, on.stream()>>>(static_cast<int64_t*>(positions.data_ptr()), n);
    MIXPREC_CUDA_CHECK_LAUNCH();
    const auto* k_in = static_cast<const int64_t*>(idx.data_ptr());
    auto* k_out = static_cast<int64_t*>(keys.data_ptr());
    const auto* v_in = static_cast<const int64_t*>(positions.data_ptr());
    auto* v_out = static_cast<int64_t*>(order.data_ptr());
    size_t bytes = 0;
    MIXPREC_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, v_in, v_out, n, 0, 64, on.stream()));
    scratch = Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::u8, g.device());
    MIXPREC_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(scratch.data_ptr(), bytes, k_in, k_out, v_in, v_out, n, 0, 64, on.stream()));
  }
  dispatch_floating(g.dtype(), [&](auto tag) {
    using G = decltype(tag);
    using A = acc_t<G>;
    run_sum_kernel<G, A><<<blocks_for(num_embeddings * dim), kThreads, 0, on.stream()>>>(
        static_cast<const G*>(g.data_ptr()), static_cast<const int64_t*>(keys.data_ptr()),
        static_cast<const int64_t*>(order.data_ptr()), static_cast<A*>(acc.data_ptr()), n, num_embeddings, dim);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  return acc.dtype() == dtype ? acc : kernels::cast(acc, dtype);
}

}  // namespace mixprec::kernels::cuda
