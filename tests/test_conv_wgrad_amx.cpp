// The bf16 weight gradient on AMX tiles (kernels::cpu::backward_weights_amx,
// cpu/conv_wgrad_amx.cpp): its values against the f64 reference on the geometries the grid and the
// two pair packings must hold (padding on both sides, on one axis, none; 1x1, 3x3, 5x3 kernels, so
// taps of both parities; odd sizes; channels that are not multiples of 32; one image, and chunks of
// images with a short last one), into bf16 and f32 gradients; non-finite values; the bias gradient
// it sums on the way; and which layers take it on which host kind. The kernel needs AMX-BF16:
// elsewhere its value tests skip, and the path test asserts that no layer takes it.
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

std::vector<WgradCase> cases() {
  std::vector<WgradCase> all = wgradtest::stride1_cases();
  all.push_back({"channels_past_32", {5, 40, 14, 14}, {70, 40, 3, 3}, 1, 1});
  // 18 images a chunk on this grid (15 x 15, 4096 positions a chunk): chunks of 18, 18 and 4.
  all.push_back({"three_chunks", {40, 8, 14, 14}, {16, 8, 3, 3}, 1, 1});
  return all;
}

constexpr const char* kNoAmx = "needs AMX-BF16 (the kernel's TDPBF16PS): this CPU has none";

// Within one rounding of the output dtype and the f32 accumulation bound of the reference's sum
// (products of bf16 values are exact in f32; the grid's zero positions add exact zeros).
TEST(ConvWgradAmx, MatchesTheReference) {
  if (!kernels::cpu::has_amx_bf16()) GTEST_SKIP() << kNoAmx;
  for (const WgradCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = geometry_of(c);
    Generator gen(41);
    const Tensor x = convtest::rand(gen, c.x, DType::bf16), w = convtest::rand(gen, c.w, DType::bf16);
    const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, DType::bf16);
    const Tensor ref = reference_wgrad(x.to(DType::f64), w.to(DType::f64), gy.to(DType::f64), c);
    const Tensor abs = reference_wgrad(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(gy), c);
    for (DType out_t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(dtype_name(out_t));
      kernels::ConvGrads out;
      out.weight = Tensor::empty(c.w, out_t);
      kernels::cpu::backward_weights_amx(gy, x, g, out);
      const Tensor& dw = out.weight;
      EXPECT_TRUE(convtest::close_accumulated(dw, ref.to(out_t), abs, double(g.n * g.oh * g.ow), "backward weights"));
    }
  }
}

// An inf at the first position of channel 1 of grad_y (or of x) leaves every other output (input)
// channel's gradient finite and equal to the reference's; in the planted channel the grid's zeros
// may meet the inf where the reference has no product (NaN where it is finite): not compared.
TEST(ConvWgradAmx, NonFiniteValuesStayInTheirChannel) {
  if (!kernels::cpu::has_amx_bf16()) GTEST_SKIP() << kNoAmx;
  for (const WgradCase& c : cases()) {
    if (c.name != "3x3_no_pad_one_image" && c.name != "5x3_pad_2x0_odd" && c.name != "three_chunks") continue;
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = geometry_of(c);
    for (bool in_grad_y : {true, false}) {
      SCOPED_TRACE(in_grad_y ? "inf in grad_y's channel 1" : "inf in x's channel 1");
      Generator gen(43);
      const Tensor x = convtest::rand(gen, c.x, DType::bf16), w = convtest::rand(gen, c.w, DType::bf16);
      const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, DType::bf16);
      const Tensor abs = reference_wgrad(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(gy), c);
      std::vector<double> planted = (in_grad_y ? gy : x).to_vector_f64();
      planted[size_t(in_grad_y ? g.oh * g.ow : g.h * g.w)] = INFINITY;  // image 0, channel 1, (0, 0)
      const Tensor bad = Tensor::from_vector(planted, (in_grad_y ? gy : x).shape(), DType::f64).to(DType::bf16);
      const Tensor& xs = in_grad_y ? x : bad;
      const Tensor& gys = in_grad_y ? bad : gy;
      const Tensor ref = reference_wgrad(xs.to(DType::f64), w.to(DType::f64), gys.to(DType::f64), c).to(DType::f32);
      kernels::ConvGrads out;
      out.weight = Tensor::empty(c.w, DType::f32);
      kernels::cpu::backward_weights_amx(gys, xs, g, out);
      const Tensor& dw = out.weight;
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
            if (!std::isfinite(r[i]) || !(std::fabs(f[i] - r[i]) <= tol))
              if (wrong++ < 3)
                ADD_FAILURE() << "oc " << oc << " c " << ch << " tap " << k << ": " << f[i] << ", ref " << r[i];
          }
        }
      EXPECT_EQ(wrong, 0) << "of " << compared;
    }
  }
}

// The bias gradient summed while grad_y is packed has conv_bias_gradient's bits (the same plane
// sums in the same image order, across chunks too), in f32 and bf16; and through the op, a layer
// with a bias gets the same gradients as with the kernel called alone.
TEST(ConvWgradAmx, BiasGradientHasTheBitsOfConvBiasGradient) {
  if (!kernels::cpu::has_amx_bf16()) GTEST_SKIP() << kNoAmx;
  for (const WgradCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = geometry_of(c);
    Generator gen(47);
    const Tensor x = convtest::rand(gen, c.x, DType::bf16);
    const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, DType::bf16);
    for (DType bias_t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(bias_t));
      kernels::ConvGrads out;
      out.weight = Tensor::empty(c.w, DType::bf16);
      out.bias = Tensor::empty({g.oc}, bias_t);
      kernels::cpu::backward_weights_amx(gy, x, g, out);
      Tensor expected = Tensor::empty({g.oc}, bias_t);
      kernels::cpu::conv_bias_gradient(gy, g, expected);
      EXPECT_EQ(out.bias.to_vector_f64(), expected.to_vector_f64());
    }
  }
  const WgradCase wide{"wide", {4, 256, 6, 6}, {512, 256, 3, 3}, 1, 1};
  const kernels::ConvGeometry g = geometry_of(wide);
  BackendGuard guard(kernels::Backend::cpu);
  Generator gen(49);
  const Tensor x = convtest::rand(gen, wide.x, DType::bf16);
  Tensor w = convtest::rand(gen, wide.w, DType::bf16, -0.5, 0.5).set_requires_grad();
  Tensor b = convtest::rand(gen, {g.oc}, DType::bf16).set_requires_grad();
  const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, DType::bf16);
  profile::start();
  ops::conv2d(x, w, b, {.padding = 1}).backward(gy);
  profile::stop();
  std::string impl;
  for (const auto& r : profile::rows())
    if (r.kernel == "conv2d_backward") impl = r.impl;
  EXPECT_NE(impl.find("mixprec:wgrad_amx"), std::string::npos) << impl;
  kernels::ConvGrads alone;
  alone.weight = Tensor::empty(wide.w, DType::bf16);
  alone.bias = Tensor::empty({g.oc}, DType::bf16);
  kernels::cpu::backward_weights_amx(gy, x, g, alone);
  EXPECT_EQ(w.grad().to_vector_f64(), alone.weight.to_vector_f64());
  EXPECT_EQ(b.grad().to_vector_f64(), alone.bias.to_vector_f64());
}

struct RestoreWgradAmx {
  ~RestoreWgradAmx() { kernels::cpu::set_conv_wgrad_amx(kernels::cpu::WgradAmx::where_faster); }
};

// By default a bf16 layer of at least kWgradGemmMinProducts weights per tap takes it on an AMX host
// and a narrower one keeps oneDNN's split backward-weights; f32 never takes it, nor a strided layer
// when forced; on a host without AMX-BF16 no layer does, forced or not.
TEST(ConvWgradAmx, DefaultFollowsTheHostKindAndTheLayersWidth) {
  const RestoreWgradAmx restore;
  kernels::cpu::set_conv_wgrad_amx(kernels::cpu::WgradAmx::where_faster);
  const WgradCase wide{"wide", {4, 256, 6, 6}, {512, 256, 3, 3}, 1, 1};
  const WgradCase narrow{"narrow", {4, 64, 6, 6}, {64, 64, 3, 3}, 1, 1};
  ASSERT_GE(wide.w[0] * wide.w[1], kernels::cpu::kWgradGemmMinProducts);
  ASSERT_LT(narrow.w[0] * narrow.w[1], kernels::cpu::kWgradGemmMinProducts);
  const bool amx = kernels::cpu::has_amx_bf16();
  const bool bf16 = amx || kernels::cpu::has_avx512_bf16();
  if (bf16) {
    const std::string wide_bf16 = backward_impl(wide, DType::bf16, 45);
    EXPECT_EQ(wide_bf16.find("mixprec:wgrad_amx") != std::string::npos, amx) << wide_bf16;
    const std::string narrow_bf16 = backward_impl(narrow, DType::bf16, 45);
    EXPECT_EQ(narrow_bf16.find("wgrad_amx"), std::string::npos) << narrow_bf16;
  }
  const std::string wide_f32 = backward_impl(wide, DType::f32, 45);
  EXPECT_EQ(wide_f32.find("wgrad_amx"), std::string::npos) << wide_f32;
  kernels::cpu::set_conv_wgrad_amx(kernels::cpu::WgradAmx::force);
  if (bf16) {
    const std::string forced = backward_impl(narrow, DType::bf16, 45);
    EXPECT_EQ(forced.find("mixprec:wgrad_amx") != std::string::npos, amx) << forced;
    const std::string strided = backward_impl(narrow, DType::bf16, 45, 2);
    EXPECT_EQ(strided.find("wgrad_amx"), std::string::npos) << strided;
  }
}

}  // namespace
}  // namespace mixprec
