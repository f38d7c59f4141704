// The tensor-core attention kernels (src/kernels/cuda/attention_mma.cuh, on mma.sync fragments, and
// attention_wmma.cuh, the WMMA ones they replace) run on the CPU under cuda_shim.h and the mocks of
// mma.sync and WMMA, against the f64 reference kernel, with the bound the GPU test of the same
// kernels uses (tests/test_attention.cpp, AttentionKernels): at most twice the reference kernel's
// own error in the dtype, plus two units of roundoff of the largest true value. What this shows
// without a GPU: the fragments' layout (the mma.sync mock reads each lane's registers where the
// PTX ISA puts them), the tiles, the shared-memory layout (its size is what the launch asks for:
// reads and writes past it fail under AddressSanitizer), the causal and padding masks, the online
// softmax and the two backward passes. What it cannot: the hardware's tensor cores, timing, or races
// between warps (the shim's __syncwarp is a barrier of the whole block).
#include "cuda_shim.h"  // first: the CUDA keywords the kernel header uses

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "error_norms.h"  // tests/
#include "kernels/attention.h"
#include "mixprec/random.h"

#define __CUDA_ARCH__ 900  // the kernels' sm_80-and-later bodies
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wmma.cuh"
#undef __CUDA_ARCH__

// The kernels' `extern __shared__` arrays (cuda_shim.h), one per namespace of kernels.
namespace mixprec::kernels::cuda::attn::mma {
alignas(128) unsigned char smem[emulated::kSharedBytes];
}  // namespace mixprec::kernels::cuda::attn::mma
namespace mixprec::kernels::cuda::attn::staged {
alignas(128) unsigned char smem[emulated::kSharedBytes];
}  // namespace mixprec::kernels::cuda::attn::staged

namespace mixprec::testing {
namespace {

namespace mma = kernels::cuda::attn::mma;
namespace staged = kernels::cuda::attn::staged;
using kernels::AttentionParams;
using kernels::cuda::attn::Sizes;
using kernels::cuda::attn::view_of;

struct Case {
  int64_t b, h, tq, tk, e;
  bool causal;
  bool kv_unaligned = false;  // k and v as views the 16-byte staging cannot take (stage()'s other path)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.b << "x" << c.h << " Tq " << c.tq << " Tk " << c.tk << " E " << c.e << (c.causal ? " causal" : "")
      << (c.kv_unaligned ? " k, v unaligned" : "");
}

struct Result {
  std::vector<Tensor> t;  // output, dq, dk, dv, lse
};

// Which kernels: attention_mma.cuh's, or attention_wmma.cuh's.
enum class Set { mma, wmma };

// The emulated kernels of `set` on q, k, v, grad_out (in T; q a transposed view, as the GPT's qkv
// split).
template <class T, int E>
Result run_emulated(Set set, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& go,
                    const AttentionParams& p) {
  const Sizes z{q.size(0) * q.size(1), q.size(2), k.size(2), E, E};
  const DType t = q.dtype();
  Tensor out = Tensor::empty({q.size(0), q.size(1), z.tq, E}, t), lse = Tensor::empty({q.size(0), q.size(1), z.tq});
  Tensor dq = Tensor::empty(q.shape(), t), dk = Tensor::empty(k.shape(), t), dv = Tensor::empty(v.shape(), t);
  Tensor dsum = Tensor::empty({z.bh * z.tq});
  const auto blocks = [](int64_t rows) { return unsigned((rows + mma::kRows - 1) / mma::kRows); };
  const bool new_set = set == Set::mma;
  const auto forward = new_set ? mma::forward_kernel<T, E> : staged::forward_kernel<T, E>;
  const auto dq_kernel = new_set ? mma::backward_dq_kernel<T, E> : staged::backward_dq_kernel<T, E>;
  const auto dkv_kernel = new_set ? mma::backward_dkv_kernel<T, E> : staged::backward_dkv_kernel<T, E>;
  const size_t forward_bytes = new_set ? mma::Shared<E>::kForward : staged::Layout<E>::kForward;
  const size_t backward_bytes = new_set ? mma::Shared<E>::kBackward : staged::Layout<E>::kBackward;
  unsigned char* memory = new_set ? mma::smem : staged::smem;
  emulated::launch(blocks(z.tq), unsigned(z.bh), mma::kThreads, memory, forward_bytes, [&] {
    forward(view_of<T>(q), view_of<T>(k), view_of<T>(v), static_cast<T*>(out.data_ptr()),
            static_cast<float*>(lse.data_ptr()), z, p);
  });
  const float* lse_p = static_cast<const float*>(lse.data_ptr());
  emulated::launch(blocks(z.tq), unsigned(z.bh), mma::kThreads, memory, backward_bytes, [&] {
    dq_kernel(view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(out), view_of<T>(go), lse_p,
              static_cast<float*>(dsum.data_ptr()), static_cast<T*>(dq.data_ptr()), z, p);
  });
  emulated::launch(blocks(z.tk), unsigned(z.bh), mma::kThreads, memory, backward_bytes, [&] {
    dkv_kernel(view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(go), lse_p,
               static_cast<const float*>(dsum.data_ptr()), static_cast<T*>(dk.data_ptr()),
               static_cast<T*>(dv.data_ptr()), z, p);
  });
  return {{out, dq, dk, dv, lse}};
}

Result run_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& go, const AttentionParams& p) {
  const kernels::AttentionForward f = kernels::ref::attention_forward(q, k, v, p);
  const kernels::AttentionGrads g = kernels::ref::attention_backward(q, k, v, f, go, p);
  return {{f.out, g.dq, g.dk, g.dv, f.lse}};
}

using Param = std::tuple<Case, DType, Set>;
class EmulatedMmaAttention : public ::testing::TestWithParam<Param> {};

template <class F>
void with_kernel_types(DType t, int64_t e, F&& f) {
  const auto by_dim = [&](auto tag) {
    if (e == 16) f(tag, std::integral_constant<int, 16>{});
    if (e == 32) f(tag, std::integral_constant<int, 32>{});
    if (e == 64) f(tag, std::integral_constant<int, 64>{});
  };
  if (t == DType::bf16) by_dim(bf16_t{});
  if (t == DType::f16) by_dim(f16_t{});
}

TEST_P(EmulatedMmaAttention, MatchesTheReference) {
  // Not a structured binding: clang 14 cannot capture one in the lambdas below.
  const Case c = std::get<0>(GetParam());
  const DType t = std::get<1>(GetParam());
  const Set set = std::get<2>(GetParam());
  Generator gen(0x3a7 + uint64_t(c.tq * 131 + c.tk * 7 + c.e) + uint64_t(t));
  // Inputs in t (q a strided view); the f64 truth reads the same values.
  const auto input = [&](const Shape& s) { return Tensor::uniform(s, gen, -2, 2, DType::f64).to(t); };
  // k and v, where the case says so: rows of E + 1 from their second element (an odd row stride and
  // an address off 16 bytes), read element by element; every other operand in 16-byte pieces.
  const auto key_side = [&] {
    if (!c.kv_unaligned) return input({c.b, c.h, c.tk, c.e});
    return input({c.b, c.h, c.tk, c.e + 1}).slice(3, 1, c.e + 1);
  };
  const Tensor q = input({c.b, c.tq, c.h, c.e}).transpose(1, 2), k = key_side();
  const Tensor v = key_side(), go = input({c.b, c.h, c.tq, c.e});
  const auto f64 = [](const Tensor& x) { return x.to(DType::f64); };
  AttentionParams p;
  p.causal = c.causal;
  p.scale = 1.0 / std::sqrt(double(c.e));
  const Result truth = run_reference(f64(q), f64(k), f64(v), f64(go), p);
  const Result ref = run_reference(q, k, v, go, p);
  Result got;
  with_kernel_types(t, c.e, [&](auto tag, auto dim) {
    got = run_emulated<decltype(tag), decltype(dim)::value>(set, q, k, v, go, p);
  });
  ASSERT_EQ(got.t.size(), 5u);
  double scale = 0;
  for (size_t i = 0; i < 4; ++i)
    for (double x : truth.t[i].to_vector_f64()) scale = std::max(scale, std::fabs(x));
  const double u = t == DType::bf16 ? 0x1p-8 : 0x1p-11;
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(got.t[i].shape(), truth.t[i].shape()) << names[i];
    const Err eg = error_of(got.t[i], truth.t[i]), er = error_of(ref.t[i], truth.t[i]);
    EXPECT_LE(eg.max, 2 * er.max + 2 * u * scale) << names[i];
    EXPECT_LE(eg.rms, 2 * er.rms + 4 * 0x1p-24 * scale) << names[i] << " (rms)";
  }
  // The log-sum-exp in f32 from the f32 scores of t's exact products: within f32 rounding.
  const Err el = error_of(got.t[4], truth.t[4]);
  double lse_scale = 1;
  for (double x : truth.t[4].to_vector_f64()) lse_scale = std::max(lse_scale, std::fabs(x));
  EXPECT_LE(el.max, 64 * 0x1p-24 * lse_scale) << "lse";
}

// Tiles of 64 cut everywhere: one row; 65; Tq > Tk and Tk > Tq under the causal mask (whose rows
// see from 1 key to all); full attention with Tk > 2 tiles; two whole tiles. Three of them again
// with k and v unaligned.
const std::vector<Case> kCases = {
    {1, 2, 1, 1, 16, false},        {2, 1, 65, 65, 32, true},        {1, 2, 130, 70, 64, true},
    {1, 1, 70, 130, 16, true},      {1, 2, 47, 190, 64, false},      {2, 1, 128, 128, 32, true},
    {2, 1, 65, 65, 32, true, true}, {1, 2, 130, 70, 64, true, true}, {1, 1, 70, 130, 16, true, true},
};

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedMmaAttention,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(Set::mma, Set::wmma)),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           const Case& c = std::get<0>(p.param);
                           std::ostringstream name;
                           name << "T" << c.tq << "x" << c.tk << "_E" << c.e << (c.causal ? "_causal" : "")
                                << (c.kv_unaligned ? "_kv_unaligned" : "") << "_" << dtype_name(std::get<1>(p.param))
                                << (std::get<2>(p.param) == Set::wmma ? "_wmma" : "");
                           return name.str();
                         });

}  // namespace
}  // namespace mixprec::testing
