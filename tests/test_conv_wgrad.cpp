// The weight gradient as one matmul per tap (kernels::cpu::backward_weights_as_gemm,
// cpu/conv_wgrad_gemm.cpp): its values against the f64 reference on the geometries the grid
// must hold (padding on both sides, on one axis, none; 1x1, 3x3, 5x3 kernels; odd sizes; one
// image, more than 16, and chunks of images with a short last one), from bf16 operands into bf16
// and f32 gradients and from f32 ones; and which layers take it on which host kind.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "conv_wgrad_cases.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;
using wgradtest::backward_impl;
using wgradtest::geometry_of;
using wgradtest::reference_wgrad;
using wgradtest::WgradCase;

std::vector<WgradCase> wgrad_cases() {
  std::vector<WgradCase> cases = wgradtest::stride1_cases();
  cases.push_back({"planes_14x14", {16, 32, 14, 14}, {48, 32, 3, 3}, 1, 1});
  // 24 images a chunk on this grid (15 x 15): chunks of 24, 24 and 7.
  cases.push_back({"three_chunks", {55, 8, 14, 14}, {16, 8, 3, 3}, 1, 1});
  return cases;
}

bool bf16_matmuls() { return kernels::cpu::has_avx512_bf16() || kernels::cpu::has_amx_bf16(); }

// The kernel itself, from bf16 operands into a bf16 and an f32 gradient and from f32 operands:
// within one rounding of the output dtype and the f32 accumulation bound of the reference's sum
// (the grid's zero positions add exact zeros).
TEST(ConvWgradGemm, MatchesTheReference) {
  if (!bf16_matmuls()) GTEST_SKIP() << "no bf16 matmuls on this CPU (neither AVX512-BF16 nor AMX-BF16)";
  for (const WgradCase& c : wgrad_cases()) {
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = geometry_of(c);
    for (DType in_t : {DType::bf16, DType::f32}) {
      Generator gen(31);
      const Tensor x = convtest::rand(gen, c.x, in_t), w = convtest::rand(gen, c.w, in_t);
      const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, in_t);
      const Tensor ref = reference_wgrad(x.to(DType::f64), w.to(DType::f64), gy.to(DType::f64), c);
      const Tensor abs = reference_wgrad(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(gy), c);
      for (DType out_t : {DType::bf16, DType::f32}) {
        if (in_t == DType::f32 && out_t == DType::bf16) continue;  // not a combination conv2d_backward makes
        SCOPED_TRACE(std::string(dtype_name(in_t)) + " -> " + std::string(dtype_name(out_t)));
        Tensor dw = Tensor::empty(c.w, out_t);
        kernels::cpu::backward_weights_as_gemm(gy, x, g, dw);
        EXPECT_TRUE(convtest::close_accumulated(dw, ref.to(out_t), abs, double(g.n * g.oh * g.ow), "backward weights"));
      }
    }
  }
}

// Each tap's grad_y window runs past its row into the next one's leading zeros (the operands are
// dense for oneDNN's brgemm). An inf at the first position of one channel of grad_y (or of x) must
// leave every other output (input) channel's gradient finite and equal to the reference's. In the
// planted channel the grid's zeros may meet the inf where the reference has no product (NaN where
// it is finite): not compared.
TEST(ConvWgradGemm, NonFiniteValuesStayInTheirChannel) {
  if (!bf16_matmuls()) GTEST_SKIP() << "no bf16 matmuls on this CPU (neither AVX512-BF16 nor AMX-BF16)";
  // No padding (x's first position is data), the longest window (5 x 3 taps), a short last chunk.
  for (const WgradCase& c : wgrad_cases()) {
    if (c.name != "3x3_no_pad_one_image" && c.name != "5x3_pad_2x0_odd" && c.name != "three_chunks") continue;
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = geometry_of(c);
    for (DType t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(dtype_name(t));
      for (bool in_grad_y : {true, false}) {
        SCOPED_TRACE(in_grad_y ? "inf in grad_y's channel 1" : "inf in x's channel 1");
        Generator gen(37);
        const Tensor x = convtest::rand(gen, c.x, t), w = convtest::rand(gen, c.w, t);
        const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, t);
        const Tensor abs = reference_wgrad(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(gy), c);
        std::vector<double> planted = (in_grad_y ? gy : x).to_vector_f64();
        planted[size_t(in_grad_y ? g.oh * g.ow : g.h * g.w)] = INFINITY;  // image 0, channel 1, (0, 0)
        const Tensor bad = Tensor::from_vector(planted, (in_grad_y ? gy : x).shape(), DType::f64).to(t);
        const Tensor& xs = in_grad_y ? x : bad;
        const Tensor& gys = in_grad_y ? bad : gy;
        const Tensor ref = reference_wgrad(xs.to(DType::f64), w.to(DType::f64), gys.to(DType::f64), c).to(DType::f32);
        Tensor dw = Tensor::empty(c.w, DType::f32);
        kernels::cpu::backward_weights_as_gemm(gys, xs, g, dw);
        // Every [oc][c] kernel but those of channel 1 (oc = 1 for grad_y, c = 1 for x).
        const std::vector<double> f = dw.to_vector_f64(), r = ref.to_vector_f64(), a = abs.to_vector_f64();
        const int64_t taps = g.kh * g.kw;
        int64_t compared = 0, wrong = 0;
        for (int64_t oc = 0; oc < g.oc; ++oc)
          for (int64_t ch = 0; ch < g.c; ++ch) {
            if ((in_grad_y ? oc : ch) == 1) continue;
            for (int64_t k = 0; k < taps; ++k) {
              const size_t i = size_t((oc * g.c + ch) * taps + k);
              const double tol = double(g.n * g.oh * g.ow) * convtest::kU32 * a[i] + 1e-30;
              ++compared;
              if (!std::isfinite(r[i]) || !(std::fabs(f[i] - r[i]) <= tol)) {
                if (wrong++ < 3)
                  ADD_FAILURE() << "oc " << oc << " c " << ch << " tap " << k << ": " << f[i] << ", ref " << r[i];
              }
            }
          }
        EXPECT_EQ(wrong, 0) << "of " << compared;
      }
    }
  }
}

// The grid: each image's rows and columns hold the plane and the larger of its two paddings, and
// x's rows reach the positions the last tap reads.
TEST(ConvWgradGemm, GridSharesThePaddingBetweenNeighbours) {
  kernels::ConvGeometry g{.n = 3, .c = 8, .h = 9, .w = 8, .oc = 4, .kh = 5, .kw = 3, .oh = 9, .ow = 6};
  g.pad_h = 2, g.pad_w = 0;
  const kernels::cpu::WgradGrid grid = kernels::cpu::wgrad_grid(g);
  EXPECT_EQ(grid.hp, 11);
  EXPECT_EQ(grid.wp, 8);
  EXPECT_EQ(grid.images, 3);  // the whole batch: fewer positions than a chunk's
  EXPECT_EQ(grid.positions, 3 * 11 * 8);
  EXPECT_EQ(grid.lead, 4 * 8 + 2);
  EXPECT_GE(grid.stride, grid.positions + grid.lead);
  EXPECT_LT(grid.stride, grid.positions + grid.lead + 32);
  EXPECT_EQ(grid.stride % 32, 0);
  // The wide cnn's second layer: chunks of the fewest whole eights of images that make
  // kWgradChunkPositions.
  kernels::ConvGeometry wide{.n = 64, .c = 420, .h = 14, .w = 14, .oc = 1000, .kh = 3, .kw = 3, .oh = 14, .ow = 14};
  wide.pad_h = wide.pad_w = 1;
  const kernels::cpu::WgradGrid chunked = kernels::cpu::wgrad_grid(wide);
  EXPECT_EQ(chunked.hp * chunked.wp, 225);
  EXPECT_EQ(chunked.images, 24);
  EXPECT_EQ(chunked.positions, 24 * 225);
}

struct RestoreWgradGemm {
  ~RestoreWgradGemm() { kernels::cpu::set_conv_wgrad_as_gemm(kernels::cpu::WgradGemm::where_faster); }
};

// Through ops::conv2d with the path forced on: the profile names it in bf16 and f32, with oneDNN's
// brgemm matmul (dense operands: gemm:jit would take its packing buffers from malloc, outside the
// allocator and the budget); a strided layer never takes it.
TEST(ConvWgradGemm, ForcedRunsThroughTheOp) {
  if (!bf16_matmuls()) GTEST_SKIP() << "no bf16 matmuls on this CPU (neither AVX512-BF16 nor AMX-BF16)";
  const RestoreWgradGemm restore;
  kernels::cpu::set_conv_wgrad_as_gemm(kernels::cpu::WgradGemm::force);
  const WgradCase c = wgrad_cases()[0];
  for (DType t : {DType::bf16, DType::f32}) {
    const std::string impl = backward_impl(c, t, 33);
    EXPECT_NE(impl.find("wgrad_as_gemm+brg:"), std::string::npos) << dtype_name(t) << ": " << impl;
  }
  BackendGuard guard(kernels::Backend::cpu);
  Generator gen(35);
  const Tensor x = convtest::rand(gen, {2, 16, 9, 9}, DType::bf16);
  Tensor w = convtest::rand(gen, {8, 16, 3, 3}, DType::bf16).set_requires_grad();
  profile::start();
  ops::conv2d(x, w, Tensor(), {.stride = 2, .padding = 1}).backward(convtest::rand(gen, {2, 8, 5, 5}, DType::bf16));
  profile::stop();
  for (const auto& r : profile::rows())
    if (r.kernel == "conv2d_backward") {
      EXPECT_EQ(r.impl.find("wgrad_as_gemm"), std::string::npos) << r.impl;
    }
}

// By default: on the AMD Zen 5 kind (AVX512-BF16, no AMX), where it was measured faster, a layer of
// at least kWgradGemmMinProducts weights per tap from 16 images takes it, in bf16 and f32, and a
// narrow one keeps the forward-convolution rewrite; on the Intel kind (AMX-BF16) both take
// oneDNN's split backward-weights (faster than either rewrite there, 2026-12-05: conv_paths.cpp);
// on Intel's AVX512-BF16 without AMX (the by_size kind) the wide one takes it (in f32: a layer that
// wide computes bf16 in f32 there) and the narrow one oneDNN's split.
TEST(ConvWgradGemm, DefaultFollowsTheHostKindAndTheLayersWidth) {
  if (!bf16_matmuls()) GTEST_SKIP() << "no bf16 matmuls on this CPU (neither AVX512-BF16 nor AMX-BF16)";
  const RestoreWgradGemm restore;
  kernels::cpu::set_conv_wgrad_as_gemm(kernels::cpu::WgradGemm::where_faster);
  const WgradCase wide{"wide", {16, 256, 4, 4}, {512, 256, 3, 3}, 1, 1};
  const WgradCase narrow{"narrow", {16, 64, 4, 4}, {64, 64, 3, 3}, 1, 1};
  ASSERT_GE(wide.w[0] * wide.w[1], kernels::cpu::kWgradGemmMinProducts);
  ASSERT_LT(narrow.w[0] * narrow.w[1], kernels::cpu::kWgradGemmMinProducts);
  const bool amx = kernels::cpu::has_amx_bf16();
  for (DType t : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const std::string wide_impl = backward_impl(wide, t, 33), narrow_impl = backward_impl(narrow, t, 33);
    EXPECT_EQ(wide_impl.find("wgrad_as_gemm") != std::string::npos, !amx) << wide_impl;
    EXPECT_EQ(wide_impl.find("wgrad_as_fwd"), std::string::npos) << wide_impl;
    EXPECT_EQ(narrow_impl.find("wgrad_as_fwd") != std::string::npos, !kernels::cpu::by_size_kind() && !amx)
        << narrow_impl;
    EXPECT_EQ(narrow_impl.find("wgrad_as_gemm"), std::string::npos) << narrow_impl;
  }
}

}  // namespace
}  // namespace mixprec
