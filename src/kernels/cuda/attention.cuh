// What the two CUDA attention files share (attention.cu: the f32-math kernels of any head dim and
// dtype; attention_mma.cu: the tensor-core kernels of bf16 and f16 at head dims 16, 32 and 64):
// the strided [B, H, T, E] view of an operand and the problem's sizes. CUDA builds, and the
// kernels' CPU emulation (tests/emulated/).
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"

namespace mixprec::kernels::cuda::attn {

// A [B, H, T, E] view of any strides.
template <class T>
struct View {
  const T* p;
  int64_t heads, sb, sh, st, se;
  // Row t of (batch, head) bh: its element e at row(bh, t)[e * se]. The division by the head count
  // is a 64-bit one (a call of tens of instructions): a loop over a row forms it once.
  __device__ const T* row(int64_t bh, int64_t t) const { return p + (bh / heads) * sb + (bh % heads) * sh + t * st; }
  __device__ T raw(int64_t bh, int64_t t, int64_t e) const { return row(bh, t)[e * se]; }
  __device__ acc_t<T> at(int64_t bh, int64_t t, int64_t e) const { return to_acc(raw(bh, t, e)); }
};
template <class T>
View<T> view_of(const Tensor& x) {
  return {
      static_cast<const T*>(x.data_ptr()), x.size(1), x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]};
}

struct Sizes {
  int64_t bh, tq, tk, e, ev;
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// attention_mma.cu. False, with nothing launched, where its kernels do not apply: dtypes other
// than bf16 and f16, head dims other than E = Ev of 16, 32 or 64, dropout, or a build without code
// for compute capability 8.0 or later on this device. z: sizes_of's (checked).
bool mma_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Sizes& z,
                 AttentionForward& dst);
bool mma_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                  const Tensor& grad_out, const AttentionParams& p, const Sizes& z, AttentionGrads& dst);

}  // namespace mixprec::kernels::cuda::attn
