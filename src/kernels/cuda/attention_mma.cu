// Tensor-core attention for bf16 and f16 (attention.cuh's mma_forward and mma_backward): the
// launches of attention_mma.cuh's kernels, where they apply. The design: that header.
#include <atomic>
#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"

namespace mixprec::kernels::cuda::attn {
namespace {

using mma::backward_dkv_kernel;
using mma::backward_dq_kernel;
using mma::forward_kernel;
using mma::kRows;
using mma::kThreads;
using mma::Layout;

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
    const bool ok = cudaFuncGetAttributes(&a, forward_kernel<bf16, 16>) == cudaSuccess;
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
    const auto kernel = forward_kernel<T, E>;
    const Launch on(q);
    if (!has_code()) return false;
    allow_shared(kernel, Layout<E>::kForward);
    kernel<<<grid_of(z.tq, z.bh), kThreads, Layout<E>::kForward, on.stream()>>>(
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
    const auto dq_kernel = backward_dq_kernel<T, E>;
    const auto dkv_kernel = backward_dkv_kernel<T, E>;
    const Launch on(q);
    if (!has_code()) return false;
    const Tensor dsum = Tensor::empty({z.bh * z.tq}, DType::f32, q.device());
    const float* lse = static_cast<const float*>(fwd.lse.data_ptr());
    float* ds = static_cast<float*>(dsum.data_ptr());
    allow_shared(dq_kernel, Layout<E>::kBackward);
    dq_kernel<<<grid_of(z.tq, z.bh), kThreads, Layout<E>::kBackward, on.stream()>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(fwd.out), view_of<T>(grad_out), lse, ds,
        static_cast<T*>(dst.dq.data_ptr()), z, p);
    MIXPREC_CUDA_CHECK_LAUNCH();
    allow_shared(dkv_kernel, Layout<E>::kBackward);
    dkv_kernel<<<grid_of(z.tk, z.bh), kThreads, Layout<E>::kBackward, on.stream()>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(grad_out), lse, ds, static_cast<T*>(dst.dk.data_ptr()),
        static_cast<T*>(dst.dv.data_ptr()), z, p);
    MIXPREC_CUDA_CHECK_LAUNCH();
    return true;
  });
}

}  // namespace mixprec::kernels::cuda::attn
