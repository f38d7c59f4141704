// The kernel profiler (mixprec/profile.h): each kernel call counted once, in its phase, with the
// FLOPs of the matrix kernels counted from their shapes and the oneDNN implementation it ran.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/dnnl_common.h"
#include "mixprec/autograd.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"
#include "mixprec/random.h"

namespace mixprec {
namespace {

// The rows of one (phase, kernel) pair; the profile keeps one row per dtype and implementation.
std::vector<profile::Row> rows_of(const std::vector<profile::Row>& rows, const std::string& phase,
                                  const std::string& kernel) {
  std::vector<profile::Row> out;
  for (const auto& r : rows)
    if (r.phase == phase && r.kernel == kernel) out.push_back(r);
  return out;
}

// Stops the profiler however the test ends, so no other test runs under it.
struct Profiling {
  Profiling() { profile::start(); }
  ~Profiling() { profile::stop(); }
};

class Profile : public ::testing::TestWithParam<kernels::Backend> {};

TEST_P(Profile, LinearForwardAndBackwardKernelsTheirPhasesFlopsAndImplementation) {
  const kernels::BackendGuard backend(GetParam());
  Generator gen(3);
  const Tensor x = Tensor::randn({32, 64}, gen);
  const Tensor w = Tensor::randn({48, 64}, gen).set_requires_grad();
  std::vector<profile::Row> rows;
  {
    const Profiling on;
    const Tensor y = ops::linear(x, w);
    Tensor loss;
    {
      const profile::PhaseScope phase("loss");
      loss = ops::sum(y);
    }
    loss.backward();
    rows = profile::rows();
  }
  // Off: nothing more is counted.
  (void)ops::linear(x, w.detach());
  EXPECT_EQ(profile::rows().size(), rows.size());

  const auto fwd = rows_of(rows, "forward", "matmul");
  ASSERT_EQ(fwd.size(), 1u);
  EXPECT_EQ(fwd[0].calls, 1);
  EXPECT_EQ(fwd[0].dtype, "f32");
  EXPECT_EQ(fwd[0].flops, 2.0 * 32 * 48 * 64);  // y [32,48] = x [32,64] @ w^T
  EXPECT_GT(fwd[0].seconds, 0.0);
  // x needs no gradient: the backward's one product is dW [48,64] = dy^T [48,32] @ x.
  const auto bwd = rows_of(rows, "backward", "matmul");
  ASSERT_EQ(bwd.size(), 1u);
  EXPECT_EQ(bwd[0].calls, 1);
  EXPECT_EQ(bwd[0].flops, 2.0 * 48 * 64 * 32);
  // The sum ran under the PhaseScope's label, not "forward".
  EXPECT_FALSE(rows_of(rows, "loss", "sum").empty());
  EXPECT_TRUE(rows_of(rows, "forward", "sum").empty());
  // The implementation: oneDNN's primitive on the fast backend ("brg:avx512_core", ...),
  // "reference" on the reference backend (what a fast kernel that declines a case shows too).
  for (const auto& r : {fwd[0], bwd[0]}) {
    if (GetParam() == kernels::Backend::ref)
      EXPECT_EQ(r.impl, "reference");
    else
      EXPECT_TRUE(!r.impl.empty() && r.impl.rfind("ref", 0) != 0) << r.impl;
  }
  // The slowest row first.
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i - 1].seconds, rows[i].seconds);
}

TEST_P(Profile, ConvAndCausalAttentionFlopsFromTheirShapes) {
  const kernels::BackendGuard backend(GetParam());
  Generator gen(4);
  // conv: N 2, C 3 -> OC 5, 3x3 kernel, 8x8 input, padding 1: 8x8 output.
  const Tensor x = Tensor::randn({2, 3, 8, 8}, gen).set_requires_grad();
  const Tensor w = Tensor::randn({5, 3, 3, 3}, gen).set_requires_grad();
  // attention: B 2, H 3, T 4, E 8, causal: query i sees i + 1 keys, 1 + 2 + 3 + 4 = 10 pairs.
  const Tensor q = Tensor::randn({2, 3, 4, 8}, gen).set_requires_grad();
  std::vector<profile::Row> rows;
  {
    const Profiling on;
    ops::Conv2dOptions o;
    o.padding = 1;
    ops::sum(ops::conv2d(x, w, Tensor(), o)).backward();
    ops::AttentionOptions a;
    a.causal = true;
    ops::sum(ops::scaled_dot_product_attention(q, q, q, a)).backward();
    rows = profile::rows();
  }
  const double conv = 2.0 * (2 * 5 * 8 * 8) * (3 * 3 * 3);
  const auto sum_flops = [&](const std::string& phase, const std::string& kernel) {
    double f = 0.0;
    for (const auto& r : rows_of(rows, phase, kernel)) f += r.flops;
    return f;
  };
  EXPECT_EQ(sum_flops("forward", "conv2d_forward"), conv);
  EXPECT_EQ(sum_flops("backward", "conv2d_backward"), 2 * conv);  // data and weight gradients
  const double attention = 2.0 * (2 * 3) * 10 * (8 + 8);          // S = Q K^T and O = P V
  EXPECT_EQ(sum_flops("forward", "attention_forward"), attention);
  EXPECT_EQ(sum_flops("backward", "attention_backward"), 2 * attention);
}

// A host without AVX512-BF16 or AMX-BF16 (an AVX-512 Xeon, 2026-11-27) has no oneDNN bf16 kernel
// worth the name: its bf16 GEMM is gemm:jit converting to f32 (the MLP's amp-bf16 step took 2.7x
// its fp32 step) and it has no bf16 convolution at all. There bf16 matmuls and convolutions widen
// to f32, run oneDNN's f32 kernels, and round once on store, as f16 does on every CPU; so do the
// large ones on Intel's AVX512-BF16 without AMX (test_bf16_math.cpp). Here that road is forced, so
// the test runs on every host kind.
TEST(ProfileHost, Bf16InF32RunsOneDnnsF32Kernels) {
  const kernels::cpu::Bf16ProductsGuard f32_road(kernels::cpu::Bf16Products::f32);
  const kernels::BackendGuard backend(kernels::Backend::cpu);
  Generator gen(4);
  const Tensor x = Tensor::randn({64, 256}, gen, DType::bf16).set_requires_grad();
  const Tensor w = Tensor::randn({128, 256}, gen, DType::bf16).set_requires_grad();
  const Tensor img = Tensor::randn({4, 16, 12, 12}, gen, DType::bf16).set_requires_grad();
  const Tensor k = Tensor::randn({32, 16, 3, 3}, gen, DType::bf16).set_requires_grad();
  std::vector<profile::Row> rows;
  {
    const Profiling on;
    ops::sum(ops::linear(x, w)).backward();
    ops::Conv2dOptions o;
    o.padding = 1;
    ops::sum(ops::conv2d(img, k, Tensor(), o)).backward();
    rows = profile::rows();
  }
  const bool avx512 = kernels::cpu::dnnl_isa_name().rfind("avx512", 0) == 0;
  int seen = 0;
  for (const auto& r : rows) {
    const bool matmul = r.kernel == "matmul";
    if (!matmul && r.kernel.rfind("conv2d_", 0) != 0) continue;
    ++seen;
    EXPECT_EQ(r.dtype, "bf16") << r.kernel;
    // oneDNN's f32 kernels: brgemm for the products, a JIT or brgemm convolution; never its
    // emulated bf16 GEMM, a bf16 kernel, or mixprec's reference loops. On an AVX2 host oneDNN 2.6
    // has no brgemm matmul and no bf16 kernel at all: the products are its f32 JIT GEMM there.
    if (matmul) {
      EXPECT_EQ(r.impl.rfind(avx512 ? "brg:" : "gemm:jit", 0), 0u) << r.phase << " matmul: " << r.impl;
    }
    if (avx512 || !matmul) {
      EXPECT_EQ(r.impl.find("gemm"), std::string::npos) << r.phase << " " << r.kernel << ": " << r.impl;
    }
    EXPECT_EQ(r.impl.find("bf16"), std::string::npos) << r.phase << " " << r.kernel << ": " << r.impl;
    EXPECT_FALSE(r.impl.empty() || r.impl.rfind("ref", 0) == 0) << r.phase << " " << r.kernel << ": " << r.impl;
  }
  EXPECT_EQ(seen, 4);  // matmul and conv2d, forward and backward
}

INSTANTIATE_TEST_SUITE_P(Backends, Profile, ::testing::Values(kernels::Backend::cpu, kernels::Backend::ref),
                         [](const ::testing::TestParamInfo<kernels::Backend>& p) {
                           return p.param == kernels::Backend::cpu ? "fast" : "ref";
                         });

}  // namespace
}  // namespace mixprec
