// conv2d: f64 gradient checks (stride, padding, dilation, groups, bias, fused ReLU), the oneDNN
// path against the reference in f32, bf16 and f16 (forward, backward-data, backward-weights),
// the primitive and reordered-weight caches, autocast, and shape errors that name the layer.
#include <gtest/gtest.h>

#include <iterator>
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "gradcheck.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/autocast.h"
#include "mixprec/cpu.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/profile.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;
using ops::Conv2dOptions;

struct ConvCase {
  std::string name;
  Shape x, w;
  Conv2dOptions o;
  bool bias = true;
};

// Small enough for finite differences, varied enough to cover every index rule.
std::vector<ConvCase> cases() {
  return {
      {"basic_pad1", {2, 3, 5, 5}, {4, 3, 3, 3}, {.padding = 1}},
      {"no_pad_no_bias", {1, 2, 6, 5}, {3, 2, 3, 2}, {}, false},
      {"stride2", {2, 2, 7, 7}, {3, 2, 3, 3}, {.stride = 2, .padding = 1}},
      {"stride_2x1_pad_0x1", {1, 2, 6, 5}, {2, 2, 2, 3}, {.stride = {2, 1}, .padding = {0, 1}}},
      {"dilation2", {1, 2, 7, 7}, {2, 2, 3, 3}, {.padding = 2, .dilation = 2}},
      {"groups2", {2, 4, 5, 5}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}},
      {"depthwise", {1, 3, 5, 5}, {3, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 3}},
      {"floor_mode_leftover", {1, 1, 6, 6}, {2, 1, 1, 1}, {.stride = 4}},
      {"fused_relu", {2, 3, 5, 5}, {4, 3, 3, 3}, {.padding = 1, .relu = true}},
  };
}

Tensor run_conv(const std::vector<Tensor>& in, const ConvCase& c) {
  return ops::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), c.o);
}

TEST(ConvGradcheck, EveryCaseInF64) {
  for (const ConvCase& c : cases()) {
    Generator g(7);
    std::vector<Tensor> in{Tensor::uniform(c.x, g, -1, 1, DType::f64).set_requires_grad(),
                           Tensor::uniform(c.w, g, -1, 1, DType::f64).set_requires_grad()};
    if (c.bias) in.push_back(Tensor::uniform({c.w[0]}, g, -1, 1, DType::f64).set_requires_grad());
    EXPECT_TRUE(testing::gradcheck(
        "conv2d/" + c.name, [&](const std::vector<Tensor>& x) { return run_conv(x, c); }, in));
  }
}

TEST(ConvGradcheck, UnbatchedInput) {
  Generator g(3);
  std::vector<Tensor> in{Tensor::uniform({2, 4, 4}, g, -1, 1, DType::f64).set_requires_grad(),
                         Tensor::uniform({3, 2, 3, 3}, g, -1, 1, DType::f64).set_requires_grad()};
  EXPECT_TRUE(testing::gradcheck(
      "conv2d/unbatched",
      [](const std::vector<Tensor>& x) { return ops::conv2d(x[0], x[1], Tensor(), {.padding = 1}); }, in));
}

TEST(Conv, KnownValues) {
  // 1x1x3x3 input, 2x2 kernel of ones, no padding: each output sums a 2x2 window.
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = Tensor::ones({1, 1, 2, 2});
  Tensor b = Tensor::from_vector(std::vector<float>{0.5f}, {1});
  EXPECT_EQ(ops::conv2d(x, w, b).to_vector(), (std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f}));
}

// ---- oneDNN against the reference ----

struct Sizes {
  std::string name;
  Shape x, w;
  Conv2dOptions o;
};
std::vector<Sizes> fast_cases() {
  return {
      {"3x3_pad1", {4, 16, 12, 12}, {32, 16, 3, 3}, {.padding = 1}},
      {"3x3_stride2", {3, 16, 13, 13}, {24, 16, 3, 3}, {.stride = 2, .padding = 1}},
      {"5x5_no_pad", {2, 8, 11, 9}, {16, 8, 5, 5}, {}},
      {"stride_2x1_pad_2x0", {2, 8, 10, 9}, {16, 8, 3, 3}, {.stride = {2, 1}, .padding = {2, 0}}},
      {"dilation2", {2, 16, 12, 12}, {16, 16, 3, 3}, {.padding = 2, .dilation = 2}},
      {"groups4", {2, 32, 9, 9}, {32, 8, 3, 3}, {.padding = 1, .groups = 4}},
      {"depthwise", {2, 16, 10, 10}, {16, 1, 3, 3}, {.padding = 1, .groups = 16}},
      {"one_input_channel", {4, 1, 14, 14}, {40, 1, 3, 3}, {.padding = 1}},
      // First layers (at most 4 channels and 32 taps): their weight gradient is mixprec's kernel
      // in f32 and bf16 (ConvFast.FirstLayerWeightGradient...). Channel counts not a multiple of 4,
      // positions not of 16, more images than one part of 4, strides, padding and dilation.
      {"first_layer_3ch_strided_dilated",
       {6, 3, 15, 13},
       {10, 3, 3, 3},
       {.stride = 2, .padding = {2, 1}, .dilation = {1, 2}}},
      {"first_layer_1ch_5x5", {5, 1, 11, 17}, {13, 1, 5, 5}, {.stride = {1, 2}, .padding = 2}},
      // In bf16 and f16, mixprec's first-layer forward (ConvFast.FirstLayerForward...): 30 taps, 6
      // output channels (a group of four and one of two), rows of 35 outputs (16, 16 and 3).
      {"first_layer_2ch_3x5_pad_0x2", {3, 2, 9, 35}, {6, 2, 3, 5}, {.padding = {0, 2}}},
      {"1x1", {2, 32, 7, 7}, {48, 32, 1, 1}, {}},
      // From 16 images a bf16 weight gradient runs as a forward convolution, and with stride 1 the
      // input gradient too (ConvFast.Bf16GradientsRunAsForwardConvolutions...): padding on both
      // sides, on one, and none.
      {"batch16_3x3_pad1", {16, 8, 7, 6}, {12, 8, 3, 3}, {.padding = 1}},
      {"batch17_5x3_pad_1x0", {17, 6, 9, 8}, {10, 6, 5, 3}, {.padding = {1, 0}}},
      {"wide", {2, 64, 10, 10}, {96, 64, 3, 3}, {.padding = 1}},
  };
}

// Forward, and all three gradients, on the fast path and on the reference, from the same inputs.
struct ConvRun {
  Tensor y, gx, gw, gb;
};
ConvRun conv_run(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy, const Conv2dOptions& o,
                 kernels::Backend be) {
  BackendGuard guard(be);
  Tensor xl = x.clone().set_requires_grad(), wl = w.clone().set_requires_grad(), bl = b.clone().set_requires_grad();
  ConvRun r;
  r.y = ops::conv2d(xl, wl, bl, o);
  r.y.backward(gy);
  r.gx = xl.grad(), r.gw = wl.grad(), r.gb = bl.grad();
  return r;
}

TEST(ConvFast, MatchesReferenceInEveryDType) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (const Sizes& c : fast_cases()) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(t)));
      Generator g(11);
      const Tensor x = convtest::rand(g, c.x, t), w = convtest::rand(g, c.w, t, -0.5, 0.5);
      const Tensor b = convtest::rand(g, {c.w[0]}, t);
      Shape y_shape;
      {
        BackendGuard ref(kernels::Backend::ref);
        y_shape = ops::conv2d(x, w, b, c.o).shape();
      }
      const Tensor gy = convtest::rand(g, y_shape, t);
      const ConvRun ref = conv_run(x, w, b, gy, c.o, kernels::Backend::ref);
      const ConvRun fast = conv_run(x, w, b, gy, c.o, kernels::Backend::cpu);
      // Bounds: sums of |products| from the reference on absolute values.
      const ConvRun abs = conv_run(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(b), convtest::abs_of(gy),
                                   c.o, kernels::Backend::ref);
      const int64_t groups = c.o.groups, k = c.w[2] * c.w[3];
      const double fwd_terms = double(c.w[1] * k + 1), bwd_data_terms = double(c.w[0] / groups * k),
                   wgrad_terms = double(ref.y.numel() / c.w[0]);
      EXPECT_TRUE(convtest::close_accumulated(fast.y, ref.y, abs.y, fwd_terms, "forward"));
      EXPECT_TRUE(convtest::close_accumulated(fast.gx, ref.gx, abs.gx, bwd_data_terms, "backward data"));
      EXPECT_TRUE(convtest::close_accumulated(fast.gw, ref.gw, abs.gw, wgrad_terms, "backward weights"));
      EXPECT_TRUE(convtest::close_accumulated(fast.gb, ref.gb, abs.gb, wgrad_terms, "bias gradient"));
    }
  }
}

TEST(ConvFast, FusedReluMatchesReference) {
  for (DType t : {DType::f32, DType::bf16}) {
    Generator g(5);
    const Tensor x = convtest::rand(g, {2, 8, 9, 9}, t), w = convtest::rand(g, {16, 8, 3, 3}, t, -0.5, 0.5);
    const Tensor b = convtest::rand(g, {16}, t), gy = convtest::rand(g, {2, 16, 9, 9}, t);
    const Conv2dOptions o{.padding = 1, .relu = true};
    const ConvRun ref = conv_run(x, w, b, gy, o, kernels::Backend::ref);
    const ConvRun fast = conv_run(x, w, b, gy, o, kernels::Backend::cpu);
    const ConvRun abs = conv_run(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(b), convtest::abs_of(gy), o,
                                 kernels::Backend::ref);
    EXPECT_TRUE(convtest::close_accumulated(fast.y, ref.y, abs.y, 8 * 9 + 1, "forward"));
    // The ReLU mask is y > 0 on both sides (a sign flip would need |y| below the f32 accumulation error).
    EXPECT_TRUE(convtest::close_accumulated(fast.gx, ref.gx, abs.gx, 16 * 9, "backward data"));
    EXPECT_TRUE(convtest::close_accumulated(fast.gw, ref.gw, abs.gw, 2 * 81, "backward weights"));
    EXPECT_TRUE(convtest::close_accumulated(fast.gb, ref.gb, abs.gb, 2 * 81, "bias gradient"));
    for (float v : fast.y.to_vector()) ASSERT_GE(v, 0.f);
  }
}

TEST(ConvFusion, SequentialConvReluEqualsTheUnfusedPair) {
  // Sequential runs Conv2d+ReLU as one convolution with a ReLU post-op; values and gradients
  // must be exactly those of conv then relu (rounding commutes with relu).
  for (DType t : {DType::f32, DType::bf16}) {
    default_generator().manual_seed(3);
    nn::Sequential m(nn::Conv2d(3, 8, 3, {.padding = 1}), nn::ReLU());
    auto& conv = dynamic_cast<nn::Conv2d&>(m[0]);
    Generator g(4);
    Tensor x = Tensor::randn({2, 3, 9, 9}, g).to(t).detach().set_requires_grad();
    const Tensor gy = Tensor::randn({2, 8, 4, 4}, g).to(t).detach();
    auto run = [&](bool fused) {
      conv.weight.set_grad(Tensor());
      x.set_grad(Tensor());
      amp::Autocast ac(DType::bf16, t == DType::bf16);
      Tensor y = fused ? m(x) : ops::relu(ops::conv2d(x, conv.weight, conv.bias, {.padding = 1}));
      // A pool after it hands the convolution a gradient nobody else holds (masked in place).
      ops::max_pool2d(y, 2).backward(gy);
      return std::vector<Tensor>{y, x.grad(), conv.weight.grad()};
    };
    const auto fused = run(true), plain = run(false);
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(convtest::close(
          fused[i], plain[i], [](size_t) { return 0.0; }, "output " + std::to_string(i)));
  }
}

TEST(ConvFusion, ReluMaskInPlaceMatchesTheReferenceOnSpecialValues) {
  // y > 0 keeps the gradient: NaN, -0, +0 and negatives drop it; +inf and the smallest
  // subnormal keep it. 1000 elements: vector body and scalar tail.
  const float specials[] = {NAN, -0.f, 0.f, -1.f, INFINITY, -INFINITY, 1e-40f, 2.f, -1e-40f, 3.5f};
  for (DType t : {DType::f32, DType::bf16}) {
    std::vector<float> yv(1000), gv(1000);
    for (size_t i = 0; i < yv.size(); ++i) yv[i] = specials[i % 10], gv[i] = float(i) + 0.5f;
    const Tensor y = Tensor::from_vector(yv, {1000}, t);
    Tensor fast = Tensor::from_vector(gv, {1000}, t), ref = fast.clone();
    kernels::relu_mask_inplace(fast, y);
    {
      BackendGuard guard(kernels::Backend::ref);
      kernels::relu_mask_inplace(ref, y);
    }
    EXPECT_TRUE(convtest::close(
        fast, ref, [](size_t) { return 0.0; }, std::string(dtype_name(t))));
    const std::vector<float> r = ref.to_vector();
    EXPECT_EQ(r[0], 0.f);  // NaN drops
    EXPECT_NE(r[4], 0.f);  // +inf keeps
    EXPECT_NE(r[6], 0.f);  // a positive subnormal keeps (bf16 has f32's exponent range)
  }
}

kernels::ConvGeometry impl_test_geometry() {
  kernels::ConvGeometry g{.n = 8, .c = 64, .h = 14, .w = 14, .oc = 128, .kh = 3, .kw = 3, .oh = 14, .ow = 14};
  g.pad_h = g.pad_w = 1;
  return g;
}
constexpr kernels::cpu::ConvPass kConvPasses[] = {
    kernels::cpu::ConvPass::forward, kernels::cpu::ConvPass::backward_data, kernels::cpu::ConvPass::backward_weights};

// Every pass of an f32 and a bf16 convolution reaches one of oneDNN's optimised implementations
// (not its reference one), on any host; bf16 where oneDNN has bf16 convolutions, which all need
// AVX-512 in oneDNN 2.6 (an AVX2 host has none: the op widens bf16 to f32 there, as
// ProfileHost.Bf16InF32RunsOneDnnsF32Kernels checks).
TEST(ConvFast, UsesOneDnnsOptimisedImplementations) {
  const kernels::ConvGeometry g = impl_test_geometry();
  std::vector<DType> types{DType::f32};
  if (kernels::cpu::dnnl_isa_name().rfind("avx512", 0) == 0)
    types.push_back(DType::bf16);
  else
    std::printf("[ skipped  ] bf16: oneDNN has no bf16 convolution on this host (ISA %s)\n",
                kernels::cpu::dnnl_isa_name().c_str());
  for (DType t : types)
    for (auto pass : kConvPasses) {
      const std::string impl = kernels::cpu::conv_impl_name(g, t, pass);
      EXPECT_FALSE(impl.empty()) << dtype_name(t) << " pass " << int(pass);
      EXPECT_EQ(impl.find("ref"), std::string::npos) << dtype_name(t) << " pass " << int(pass) << ": " << impl;
    }
}

// Each host kind's bf16 convolutions run on its matrix unit: the forward on AMX tiles on the Intel
// kind (AMX-BF16; what oneDNN 2.6 picks for the backward passes there was not recorded, so they are
// not asserted), every pass on AVX512-BF16 dot products on the AMD Zen 5 kind (no AMX; oneDNN 2.6
// names them jit_bf16:avx512_core_bf16). Elsewhere nothing is asserted.
TEST(ConvFast, Bf16UsesTheHostsMatrixUnit) {
  std::string unit;
  std::vector<kernels::cpu::ConvPass> passes(std::begin(kConvPasses), std::end(kConvPasses));
  if (kernels::cpu::has_amx_bf16()) {
    unit = "amx";
    passes = {kernels::cpu::ConvPass::forward};
  } else if (kernels::cpu::has_avx512_bf16()) {
    unit = "avx512_core_bf16";
  } else {
    GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this host: no host kind's expectation applies";
  }
  const kernels::ConvGeometry g = impl_test_geometry();
  for (auto pass : passes) {
    const std::string impl = kernels::cpu::conv_impl_name(g, DType::bf16, pass);
    EXPECT_NE(impl.find(unit), std::string::npos)
        << "pass " << int(pass) << ": " << impl << " (expected " << unit << ")";
  }
}

// A first layer's weight gradient (at most 4 input channels and 32 taps) runs mixprec's kernel
// (the profile names it) on the AVX2 kind and with AVX-512, in fp32, bf16 and f16 (where a 16-bit
// layer computes in f32, the kernel still reads the 16-bit tensors), at 32 output channels (a width
// oneDNN's blocked kernels take, padding the one input channel to a block) and 42 (where oneDNN
// 2.6's bf16 kernel is its im2col GEMM), on 28 x 28 images and 13 x 11 ones (143 positions: a last
// vector of 7 on AVX2, of 15 on AVX-512). As in the nets, the input needs no gradient (a 16-bit
// layer's weight gradient then reads the 16-bit tensors, nothing cast): the weight and bias
// gradients are the f64 truth rounded once, within an f32 sum's bound. MatchesReferenceInEveryDType
// checks the first_layer_* cases with an input gradient too.
TEST(ConvFast, FirstLayerWeightGradientRunsMixprecsKernel) {
  if (!mixprec::cpu::has_avx2_fma()) GTEST_SKIP() << "no AVX2 and FMA: the scalar host runs oneDNN's kernels";
  for (const auto& [h, wd] : {std::pair<int64_t, int64_t>{28, 28}, {13, 11}})
    for (int64_t oc : {32, 42})
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " oc " + std::to_string(oc) + " " + std::to_string(h) + " x " +
                     std::to_string(wd));
        Generator gen(5);
        const Tensor x = convtest::rand(gen, {8, 1, h, wd}, t);
        const Tensor w = convtest::rand(gen, {oc, 1, 3, 3}, t);
        const Tensor b = convtest::rand(gen, {oc}, t);
        const Tensor gy = convtest::rand(gen, {8, oc, h, wd}, t);
        // The weight and bias gradients of conv2d(xi, wi, bi) against gyi on backend be.
        auto grads = [](kernels::Backend be, const Tensor& xi, const Tensor& wi, const Tensor& bi, const Tensor& gyi) {
          BackendGuard guard(be);
          Tensor wl = wi.clone().set_requires_grad(), bl = bi.clone().set_requires_grad();
          ops::conv2d(xi, wl, bl, {.padding = 1}).backward(gyi);
          return std::pair{wl.grad(), bl.grad()};
        };
        profile::start();
        const auto [gw, gb] = grads(kernels::Backend::cpu, x, w, b, gy);
        profile::stop();
        std::string impl;
        for (const auto& r : profile::rows())
          if (r.kernel == "conv2d_backward") impl = r.impl;
        EXPECT_EQ(impl, "mixprec:small_k_wgrad");
        const auto f64 = [](const Tensor& v) { return v.to(DType::f64); };
        const auto [tw, tb] = grads(kernels::Backend::ref, f64(x), f64(w), f64(b), f64(gy));
        const auto [aw, ab] = grads(kernels::Backend::ref, convtest::abs_of(x), f64(w), f64(b), convtest::abs_of(gy));
        const double terms = double(8 * h * wd);  // images x positions
        EXPECT_TRUE(convtest::close_rounded_once(gw, tw, aw, terms, "weight gradient"));
        EXPECT_TRUE(convtest::close_rounded_once(gb, tb, ab, terms, "bias gradient"));
      }
}

// A 16-bit first layer's forward (at most 4 input channels and 32 taps, stride 1): mixprec's own
// kernel, in bf16 (where oneDNN 2.6 has only its im2col GEMM for an NCHW output) and f16 (where it
// has no kernel at all), on every host with AVX-512BW, with or without a bf16 unit, and on AVX2
// hosts in f32 too (the profile names it). With the fused ReLU and a NaN input: the windows that
// hold it give NaN, the others are the f64 truth rounded once to nearest, within an f32 sum's
// bound. The second shape's output, 56 x 96 x 28 x 28 (8.4 MB in 16 bits), is stored with
// non-temporal stores. MatchesReferenceInEveryDType covers more geometries.
TEST(ConvFast, FirstLayerForwardRunsMixprecsKernel) {
  const bool avx2_host = mixprec::cpu::has_avx2_fma() && !mixprec::cpu::has_avx512f();
  if (!mixprec::cpu::has_avx512bw() && !avx2_host)
    GTEST_SKIP() << "an AVX-512 CPU without AVX-512BW, or neither AVX2 nor AVX-512: first layers run oneDNN's kernels";
  std::vector<DType> dtypes{DType::bf16, DType::f16};
  if (avx2_host) dtypes.push_back(DType::f32);  // AVX2 hosts: f32 too (oneDNN's kernel writes nChw8c)
  const Conv2dOptions o{.padding = 1, .relu = true};
  auto run = [&](kernels::Backend be, const Tensor& xi, const Tensor& wi, const Tensor& bi) {
    BackendGuard guard(be);
    return ops::conv2d(xi, wi, bi, o);
  };
  for (DType t : dtypes)
    for (const auto& [xs, oc] : std::vector<std::pair<Shape, int64_t>>{{{5, 1, 13, 21}, 7}, {{56, 1, 28, 28}, 96}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_str(xs));
      Generator gen(9);
      std::vector<double> xv = convtest::rand(gen, xs, DType::f64).to_vector_f64();
      const bool small = xs[0] == 5;
      if (small) xv[3 * 273 + 6 * 21 + 20] = NAN;  // image 3, row 6, last column
      const Tensor x = Tensor::from_vector(xv, xs, t);
      const Tensor w = convtest::rand(gen, {oc, 1, 3, 3}, t, -0.5, 0.5);
      const Tensor b = convtest::rand(gen, {oc}, t);  // (ops::conv2d rounds a bias to x's dtype)
      profile::start();
      const Tensor fast = run(kernels::Backend::cpu, x, w, b);
      profile::stop();
      std::string impl;
      for (const auto& r : profile::rows())
        if (r.kernel == "conv2d_forward") impl = r.impl;
      EXPECT_EQ(impl, "mixprec:first_layer_fwd");
      EXPECT_EQ(fast.dtype(), t);
      const Tensor truth = run(kernels::Backend::ref, x.to(DType::f64), w.to(DType::f64), b.to(DType::f64));
      const Tensor abs = run(kernels::Backend::ref, convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(b));
      EXPECT_TRUE(convtest::close_rounded_once(fast, truth, abs, 9 + 1, "forward"));
      int64_t nans = 0;
      for (double v : fast.to_vector_f64()) nans += std::isnan(v);
      // 7 channels x the 6 outputs whose 3x3 window holds the NaN (it sits on the right edge).
      EXPECT_EQ(nans, small ? 7 * 6 : 0);
    }
}

// bf16 gradients of a stride-1 convolution run as forward convolutions (the input gradient with
// the flipped, transposed weight, the weight gradient with the images as channels: cpu/conv.cpp),
// which oneDNN runs faster than its backward kernels on the AVX512-BF16 kind; both paths agree
// with the reference within the bound of an f32 sum, and a stride-2 layer keeps the backward ones.
TEST(ConvFast, Bf16GradientsRunAsForwardConvolutionsWhereTheGeometryAllows) {
  if (!kernels::cpu::has_avx512_bf16() && !kernels::cpu::has_amx_bf16())
    GTEST_SKIP() << "no bf16 convolutions on this CPU (neither AVX512-BF16 nor AMX-BF16)";
  struct Restore {
    ~Restore() {
      kernels::cpu::set_conv_dgrad_as_forward(true);
      kernels::cpu::set_conv_wgrad_as_forward(kernels::cpu::WgradForward::where_faster);
    }
  } restore;
  auto impl_of = [](const Tensor& x, const Tensor& w, const Tensor& gy, const Conv2dOptions& o) {
    BackendGuard guard(kernels::Backend::cpu);
    Tensor xl = x.clone().set_requires_grad(), wl = w.clone().set_requires_grad();
    profile::start();
    ops::conv2d(xl, wl, Tensor(), o).backward(gy);
    profile::stop();
    std::string impl;
    for (const auto& r : profile::rows())
      if (r.kernel == "conv2d_backward") impl = r.impl;
    return impl;
  };
  Generator g(21);
  const DType t = DType::bf16;
  const Tensor x = convtest::rand(g, {16, 24, 9, 9}, t), w = convtest::rand(g, {32, 24, 3, 3}, t, -0.5, 0.5);
  const Tensor b = convtest::rand(g, {32}, t), gy = convtest::rand(g, {16, 32, 9, 9}, t);
  const Conv2dOptions o{.padding = 1};
  const ConvRun ref = conv_run(x, w, b, gy, o, kernels::Backend::ref);
  const ConvRun abs = conv_run(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(b), convtest::abs_of(gy), o,
                               kernels::Backend::ref);
  for (bool rewrite : {true, false}) {
    SCOPED_TRACE(rewrite ? "as forward convolutions" : "oneDNN's backward kernels");
    kernels::cpu::set_conv_dgrad_as_forward(rewrite);
    // Forced: the rewrite's values are checked on every host kind, also where it is not the
    // default (Intel's AVX512-BF16 without AMX, and AMX: F32WeightGradientPathFollowsTheHostKind).
    kernels::cpu::set_conv_wgrad_as_forward(rewrite ? kernels::cpu::WgradForward::force
                                                    : kernels::cpu::WgradForward::off);
    const std::string impl = impl_of(x, w, gy, o);
    EXPECT_EQ(impl.find("dgrad_as_fwd") != std::string::npos, rewrite) << impl;
    EXPECT_EQ(impl.find("wgrad_as_fwd") != std::string::npos, rewrite) << impl;
    const ConvRun fast = conv_run(x, w, b, gy, o, kernels::Backend::cpu);
    EXPECT_TRUE(convtest::close_accumulated(fast.gx, ref.gx, abs.gx, 32 * 9, "backward data"));
    EXPECT_TRUE(convtest::close_accumulated(fast.gw, ref.gw, abs.gw, 16 * 81, "backward weights"));
    EXPECT_TRUE(convtest::close_accumulated(fast.gb, ref.gb, abs.gb, 16 * 81, "bias gradient"));
  }
  const Tensor gy2 = convtest::rand(g, {16, 32, 5, 5}, t);
  const std::string strided = impl_of(x, w, gy2, {.stride = 2, .padding = 1});
  EXPECT_EQ(strided.find("_as_fwd"), std::string::npos) << strided;
}

// The f32 weight gradient of a stride-1 layer from 16 images: a forward convolution where the host
// has AVX512-BF16 on AMD (as fast as the split on the AMD kind, and no per-thread partials:
// docs/conv.md), oneDNN's backward-weights split over the batch elsewhere (8-20% faster for the
// wide cnn's fp32 step on an AVX-512 Xeon without BF16, 2026-11-27; 15-21% for the cnn 32/64 and
// cnn-bn fp32 steps on Intel's AVX512-BF16 without AMX, 2026-12-03, where bf16 takes the split
// too; 22-46% for every cnn step in both dtypes on AMX, 2026-12-05). bf16 on a host without a bf16
// unit computes in f32 and takes the same road.
TEST(ConvFast, F32WeightGradientPathFollowsTheHostKind) {
  const bool unit = kernels::cpu::bf16_unit();
  const bool rewrite = unit && !kernels::cpu::by_size_kind() && !kernels::cpu::has_amx_bf16();
  auto impl_of = [](DType t) {
    BackendGuard guard(kernels::Backend::cpu);
    Generator g(23);
    const Tensor x = convtest::rand(g, {16, 24, 9, 9}, t), w = convtest::rand(g, {32, 24, 3, 3}, t, -0.5, 0.5);
    const Tensor gy = convtest::rand(g, {16, 32, 9, 9}, t);
    Tensor wl = w.clone().set_requires_grad();
    profile::start();
    ops::conv2d(x, wl, Tensor(), {.padding = 1}).backward(gy);
    profile::stop();
    std::string impl;
    for (const auto& r : profile::rows())
      if (r.kernel == "conv2d_backward") impl = r.impl;
    return impl;
  };
  for (DType t : {DType::f32, DType::bf16}) {
    if (t == DType::bf16 && rewrite) continue;  // Bf16GradientsRunAsForwardConvolutions... covers it
    const std::string impl = impl_of(t);
    EXPECT_EQ(impl.find("wgrad_as_fwd") != std::string::npos, rewrite) << dtype_name(t) << ": " << impl;
    // Without a bf16 unit, bf16 runs oneDNN's f32 kernels (no bf16 implementation name).
    if (!unit) {
      EXPECT_EQ(impl.find("bf16"), std::string::npos) << dtype_name(t) << ": " << impl;
    }
  }
}

// kernels::cpu::conv_bias_gradient (vector lanes, four images at once) sums in the order its
// header documents, bit for bit: planes with whole blocks and a tail (7 x 7), only whole blocks
// (4 x 4), none (2 x 3); 6 images (a group of four and two alone); f32 and bf16 in, f32 and bf16 out.
TEST(ConvFast, BiasGradientSumsInItsDocumentedOrder) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (const auto& [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{7, 7}, {4, 4}, {2, 3}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(oh) + "x" + std::to_string(ow));
      Generator gen(41);
      kernels::ConvGeometry g;
      g.n = 6, g.oc = 5, g.oh = oh, g.ow = ow;
      const Tensor gy = convtest::rand(gen, {g.n, g.oc, oh, ow}, t, -100, 100);
      const std::vector<float> v = gy.to(DType::f32).to_vector();
      const int64_t plane = oh * ow;
      std::vector<float> want(size_t(g.oc));
      for (int64_t o = 0; o < g.oc; ++o) {
        float total = 0.f;
        for (int64_t n = 0; n < g.n; ++n) {
          const float* p = v.data() + (n * g.oc + o) * plane;
          float part[8] = {};
          int64_t i = 0;
          for (; i + 8 <= plane; i += 8)
            for (int l = 0; l < 8; ++l) part[l] += p[i + l];
          float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
          for (; i < plane; ++i) sum += p[i];
          total += sum;
        }
        want[size_t(o)] = total;
      }
      for (DType bt : {DType::f32, DType::bf16}) {
        Tensor bias = Tensor::empty({g.oc}, bt);
        kernels::cpu::conv_bias_gradient(gy, g, bias);
        EXPECT_EQ(bias.to_vector(), Tensor::from_vector(want, {g.oc}).to(bt).to_vector()) << dtype_name(bt);
      }
    }
  }
}

TEST(ConvFast, OnePrimitivePerShapeAndOneWeightReorderPerVersion) {
  BackendGuard guard(kernels::Backend::cpu);
  Generator g(2);
  nn::Conv2d conv(16, 32, 3, {.padding = 1});
  optim::SGD opt(conv.parameters(), {.lr = 0.1});
  const Tensor x = Tensor::randn({4, 16, 10, 10}, g);
  auto step = [&] {
    opt.zero_grad();
    ops::sum(conv(x)).backward();
    opt.step();
  };
  step();  // creates the primitives
  kernels::cpu::conv_weight_cache_clear();
  const auto before = kernels::cpu::conv_cache_stats();
  step();
  step();
  const auto after = kernels::cpu::conv_cache_stats();
  EXPECT_EQ(after.misses, before.misses) << "a primitive was created in a steady-state step";
  const auto wc = kernels::cpu::conv_weight_cache_stats();
  // Two steps: the weight is reordered at most once per layout per step (forward, and
  // backward-data when the input needs a gradient: here it does not).
  EXPECT_LE(wc.reorders, 2 * 2);
  // Evaluating twice with the same weights reorders nothing new.
  const int64_t reorders = wc.reorders;
  {
    autograd::NoGradGuard no_grad;
    conv(x);
    conv(x);
  }
  EXPECT_LE(kernels::cpu::conv_weight_cache_stats().reorders, reorders + 1);
  // A change through the API (copy_) is seen: the next forward uses the new weights.
  Tensor w = conv.weight;
  w.copy_(Tensor::zeros(w.shape()));
  autograd::NoGradGuard no_grad;
  Tensor y = conv(x);
  const std::vector<float> yv = y.to_vector(), bv = conv.bias.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_EQ(yv[i], bv[i / 100 % 32]);
}

TEST(ConvFast, OptimizerStepIsSeenByTheWeightCache) {
  // The optimizer writes parameters in place; the next forward must not reuse a stale reorder.
  BackendGuard guard(kernels::Backend::cpu);
  Generator g(9);
  nn::Conv2d conv(8, 16, 3, {.padding = 1});
  optim::SGD opt(conv.parameters(), {.lr = 0.5});
  const Tensor x = Tensor::randn({2, 8, 6, 6}, g);
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    Tensor y = conv(x);
    Tensor expect, abs_sum;
    {
      BackendGuard ref(kernels::Backend::ref);
      autograd::NoGradGuard no_grad;
      const Tensor w = conv.weight.detach(), b = conv.bias.detach();
      expect = ops::conv2d(x, w, b, {.padding = 1});
      abs_sum = ops::conv2d(convtest::abs_of(x), convtest::abs_of(w), convtest::abs_of(b), {.padding = 1});
    }
    // A stale reorder is off by a whole step's update; the bound is an f32 sum's of 8 x 9 + 1 terms
    // (the steps' updates grow the weights, so the sums cancel more each step).
    ASSERT_TRUE(convtest::close_accumulated(y.detach(), expect, abs_sum, 8 * 9 + 1, "step " + std::to_string(i)));
    ops::sum(y).backward();
    opt.step();
  }
}

// A write through another handle of the weight's bytes (a detached view, as in PyTorch's
// `with no_grad(): w.copy_(...)`) must be seen too: versions belong to the bytes, not the handle.
TEST(ConvFast, WriteThroughADetachedViewIsSeenByTheWeightCache) {
  BackendGuard guard(kernels::Backend::cpu);
  Generator g(10);
  nn::Conv2d conv(8, 16, 3, {.padding = 1});
  const Tensor x = Tensor::randn({2, 8, 6, 6}, g);
  autograd::NoGradGuard no_grad;
  const std::vector<float> before = conv(x).to_vector();
  conv.weight.detach().copy_(Tensor::randn(conv.weight.shape(), g));
  const std::vector<float> after = conv(x).to_vector();
  Tensor expect, abs_sum;
  {
    BackendGuard ref(kernels::Backend::ref);
    expect = ops::conv2d(x, conv.weight, conv.bias, {.padding = 1});
    abs_sum =
        ops::conv2d(convtest::abs_of(x), convtest::abs_of(conv.weight), convtest::abs_of(conv.bias), {.padding = 1});
  }
  ASSERT_NE(after, before);
  ASSERT_TRUE(convtest::close_accumulated(Tensor::from_vector(after, expect.shape()), expect, abs_sum, 8 * 9 + 1));
}

TEST(ConvAutocast, RunsInBf16AndGivesF32WeightGradients) {
  Generator g(4);
  nn::Conv2d conv(4, 8, 3, {.padding = 1});
  const Tensor x = Tensor::randn({2, 4, 8, 8}, g);
  Tensor y;
  {
    amp::Autocast ac(DType::bf16);
    y = conv(x);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  ops::sum(ops::cast(y, DType::f32)).backward();
  EXPECT_EQ(conv.weight.grad().dtype(), DType::f32);
  EXPECT_EQ(conv.bias.grad().dtype(), DType::f32);
}

TEST(ConvErrors, ChannelMismatchNamesTheLayerAndShapes) {
  nn::Conv2d conv(8, 16, 3, {.padding = 1});
  const Tensor x = Tensor::zeros({2, 3, 10, 10});
  try {
    conv(x);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Conv2d(8, 16"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3, 10, 10]"), std::string::npos) << m;
    EXPECT_NE(m.find("[16, 8, 3, 3]"), std::string::npos) << m;
  }
}

TEST(ConvErrors, KernelLargerThanPaddedInput) {
  nn::Conv2d conv(1, 4, 5);
  try {
    conv(Tensor::zeros({1, 1, 3, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Conv2d(1, 4"), std::string::npos) << m;
    EXPECT_NE(m.find("larger than the padded input 3x3"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::conv2d(Tensor::zeros({1, 4, 5, 5}), Tensor::zeros({6, 2, 3, 3}), Tensor(), {.groups = 3}), Error);
  EXPECT_THROW(ops::conv2d(Tensor::zeros({1, 4, 5}), Tensor::zeros({6, 4, 3, 3})), Error);
  EXPECT_THROW(ops::conv2d(Tensor::zeros({1, 4, 5, 5}), Tensor::zeros({6, 4, 3, 3}), Tensor::zeros({5})), Error);
  EXPECT_THROW(ops::conv2d(Tensor::zeros({1, 4, 5, 5}), Tensor::zeros({6, 4, 3, 3}), Tensor(), {.stride = 0}), Error);
}

TEST(ConvModule, ParameterNamesShapesAndInit) {
  default_generator().manual_seed(0);
  nn::Conv2d conv(6, 12, {3, 5}, {.groups = 2});
  const auto sd = conv.state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd[0].first, "weight");
  EXPECT_EQ(sd[0].second.shape(), (Shape{12, 3, 3, 5}));
  EXPECT_EQ(sd[1].first, "bias");
  const double bound = 1.0 / std::sqrt(3.0 * 15.0);  // fan_in = in/groups * kh * kw
  for (float v : conv.weight.to_vector()) ASSERT_LE(std::fabs(v), bound + 1e-7);
  EXPECT_EQ(conv.name(), "Conv2d(6, 12, kernel_size=(3, 5), stride=(1, 1), groups=2)");
}

// A fused ReLU keeps a NaN as ops::relu does (x > 0 or NaN ? x : +0), bit for bit, wherever it
// rides: a convolution's (oneDNN's kernels, mixprec's first-layer kernel), a convolution pooled by
// conv2d_max_pool2d, linear_relu; in every dtype. oneDNN's own ReLU post-op, max(x, 0) in its jit
// kernels, makes a NaN +0 on AVX-512 hosts: it is not used (docs/conv.md, "The fused ReLU").
TEST(FusedRelu, KeepsNaNAsTheReluOpDoes) {
  using testutil::bytes_of;
  std::vector<Device> devices{Device::cpu()};
  if (cuda::device_count() > 0) devices.push_back(Device::cuda(0));  // cuDNN's and cuBLASLt's fused ReLU
  for (const Device& device : devices)
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (int64_t c : {2, 8}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + ", " + std::to_string(c) + " input channels" +
                     (device.is_cuda() ? ", cuda" : ""));
        Generator g(21);
        std::vector<float> xv = Tensor::randn({2, c, 8, 6}, g).to_vector();
        xv[5] = NAN;     // image 0, channel 0, row 0
        xv[100] = -NAN;  // a NaN with its sign bit set
        const Tensor x = Tensor::from_vector(xv, {2, c, 8, 6}).to(t).to(device);
        const Tensor w = Tensor::randn({16, c, 3, 3}, g).to(t).to(device), b = Tensor::randn({16}, g).to(t).to(device);
        Conv2dOptions o{.padding = 1};
        const Tensor plain = ops::conv2d(x, w, b, o);
        int64_t nans = 0;
        for (double v : plain.to_vector_f64()) nans += std::isnan(v);
        ASSERT_GT(nans, 0);
        o.relu = true;
        EXPECT_EQ(bytes_of(ops::conv2d(x, w, b, o)), bytes_of(ops::relu(plain))) << "conv2d";
        EXPECT_EQ(bytes_of(ops::conv2d_max_pool2d(x, w, b, o, 2)), bytes_of(ops::max_pool2d(ops::relu(plain), 2)))
            << "conv2d_max_pool2d";
        const Tensor rows = x.reshape({2 * c * 4, 12}), lw = Tensor::randn({16, 12}, g).to(t).to(device);
        const Tensor lin = ops::linear(rows, lw, b);
        EXPECT_EQ(bytes_of(ops::linear_relu(rows, lw, b)), bytes_of(ops::relu(lin))) << "linear";
      }
}

}  // namespace
}  // namespace mixprec
