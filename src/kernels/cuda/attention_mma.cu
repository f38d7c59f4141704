// Tensor-core attention for bf16 and f16 (attention.cuh's mma_forward and mma_backward): the
// launches of attention_mma.cuh's kernels, where they apply (attention_wmma.cuh's, the ones they
// replace, with MIXPREC_CUDA_ATTENTION=wmma). The design: those headers.
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wmma.cuh"

namespace mixprec::kernels::cuda::attn {
namespace {

using mma::kRows;
using mma::kThreads;

// MIXPREC_CUDA_ATTENTION=wmma: attention_wmma.cuh's kernels (the GPU runs' A/B of the two), read
// once.
bool wmma_asked() {
  static const bool on = [] {
    const char* v = std::getenv("MIXPREC_CUDA_ATTENTION");
    return v != nullptr && std::string_view(v) == "wmma";
  }();
  return on;
}

// The kernels of one set, and the dynamic shared memory each asks for.
template <class T, int E>
struct Kernels {
  decltype(&mma::forward_kernel<T, E>) forward;
  decltype(&mma::backward_dq_kernel<T, E>) dq;
  decltype(&mma::backward_dkv_kernel<T, E>) dkv;
  size_t forward_bytes, backward_bytes;
};
template <class T, int E>
Kernels<T, E> kernels_of() {
  if (wmma_asked())
    return {staged::forward_kernel<T, E>, staged::backward_dq_kernel<T, E>, staged::backward_dkv_kernel<T, E>,
            staged::Layout<E>::kForward, staged::Layout<E>::kBackward};
  return {mma::forward_kernel<T, E>, mma::backward_dq_kernel<T, E>, mma::backward_dkv_kernel<T, E>,
          mma::Shared<E>::kForward, mma::Shared<E>::kBackward};
}

// Whether the build holds sm_80-or-later code of this file's kernels for the current device (a
// build for sm_75 only, or compute_75 PTX JIT-compiled for a newer GPU, has the trapping bodies).
// Every kernel here is compiled for the same architectures, so one kernel answers for all; cached
// per device index.
bool has_code() {
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  MIXPREC_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& c = cached[device < 64 ? device : 63];
  if (c.load() == 0) {
    cudaFuncAttributes a{};
    const bool ok = cudaFuncGetAttributes(&a, mma::forward_kernel<bf16, 16>) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();  // no image for this device: not an error of the op
    c.store(ok && a.ptxVersion >= 80 && a.binaryVersion >= 80 ? 1 : 2);
  }
  return c.load() == 1;
}

template <class T>
constexpr bool kMmaType = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// f(T{}, integral_constant<E>) where the mma kernels apply to the dtype, sizes and params; false
// (nothing called) elsewhere.
template <class F>
bool dispatch(DType t, const Sizes& z, const AttentionParams& p, F&& f) {
  if (p.dropout != 0.0 || z.e != z.ev || !(z.e == 16 || z.e == 32 || z.e == 64)) return false;
  if (t != DType::bf16 && t != DType::f16) return false;
  return dispatch_floating(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!kMmaType<T>) {
      return false;
    } else {
      switch (z.e) {
        case 16:
          return f(tag, std::integral_constant<int, 16>{});
        case 32:
          return f(tag, std::integral_constant<int, 32>{});
        default:
          return f(tag, std::integral_constant<int, 64>{});
      }
    }
  });
}

dim3 grid_of(int64_t rows, int64_t bh) { return dim3(unsigned((rows + kRows - 1) / kRows), unsigned(bh)); }

}  // namespace

bool mma_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Sizes& z,
                 AttentionForward& dst) {
  return dispatch(q.dtype(), z, p, [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int E = decltype(dim)::value;
    const Kernels<T, E> set = kernels_of<T, E>();
    const Launch on(q);
    if (!has_code()) return false;
    allow_shared(set.forward, set.forward_bytes);
    set.forward<<<grid_of(z.tq, z.bh), kThreads, set.forward_bytes, on.stream()>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), static_cast<T*>(dst.out.data_ptr()),
        static_cast<float*>(dst.lse.data_ptr()), z, p);
    MIXPREC_CUDA_CHECK_LAUNCH();
    return true;
  });
}

bool mma_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                  const Tensor& grad_out, const AttentionParams& p, const Sizes& z, AttentionGrads& dst) {
  return dispatch(q.dtype(), z, p, [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int E = decltype(dim)::value;
    const Kernels<T, E> set = kernels_of<T, E>();
    const Launch on(q);
    if (!has_code()) return false;
    const Tensor dsum = Tensor::empty({z.bh * z.tq}, DType::f32, q.device());
    const float* lse = static_cast<const float*>(fwd.lse.data_ptr());
    float* ds = static_cast<float*>(dsum.data_ptr());
    allow_shared(set.dq, set.backward_bytes);
    set.dq<<<grid_of(z.tq, z.bh), kThreads, set.backward_bytes, on.stream()>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(fwd.out), view_of<T>(grad_out), lse, ds,
        static_cast<T*>(dst.dq.data_ptr()), z, p);
    MIXPREC_CUDA_CHECK_LAUNCH();
    allow_shared(set.dkv, set.backward_bytes);
    set.dkv<<<grid_of(z.tk, z.bh), kThreads, set.backward_bytes, on.stream()>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(grad_out), lse, ds, static_cast<T*>(dst.dk.data_ptr()),
        static_cast<T*>(dst.dv.data_ptr()), z, p);
    MIXPREC_CUDA_CHECK_LAUNCH();
    return true;
  });
}

}  // namespace mixprec::kernels::cuda::attn
