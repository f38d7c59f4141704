// Pooling: f64 gradient checks (max with padding/stride/dilation/ceil mode/overlap, avg with
// both divisor rules, adaptive with uneven windows), known values, the fast path against the
// reference in f32/bf16/f16, the argmax storage, and shape errors.
#include <gtest/gtest.h>

#include <string>

#include "conv_test_util.h"
#include "gradcheck.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;
using ops::Pool2dOptions;

// Distinct values, so max pooling has no ties and finite differences stay on one side of the
// argmax (a tie makes max non-differentiable).
Tensor distinct(Generator& g, const Shape& s) {
  const int64_t n = shape_numel(s);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i) * 0.37;
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[size_t(i)], v[size_t(g.next_u64() % uint64_t(i + 1))]);
  return Tensor::from_vector(v, s, DType::f64).set_requires_grad();
}

struct PoolCase {
  std::string name;
  Shape x;
  ops::IntPair k;
  Pool2dOptions o;
};

TEST(PoolGradcheck, MaxPool) {
  const std::vector<PoolCase> cases = {
      {"2x2", {2, 3, 6, 6}, 2, {}},
      {"3x3_stride1_overlap", {1, 2, 5, 5}, 3, {.stride = 1}},
      {"3x3_stride2_pad1", {1, 2, 7, 6}, 3, {.stride = 2, .padding = 1}},
      {"dilation2", {1, 2, 7, 7}, 2, {.stride = 1, .dilation = 2}},
      {"ceil_mode", {1, 2, 7, 7}, 2, {.ceil_mode = true}},
      {"rect_2x3", {1, 1, 6, 9}, {2, 3}, {.stride = {1, 2}}},
      {"unbatched", {2, 4, 4}, 2, {}},
  };
  for (const PoolCase& c : cases) {
    Generator g(1);
    EXPECT_TRUE(testing::gradcheck("max_pool2d/" + c.name,
                                   [&](const std::vector<Tensor>& x) { return ops::max_pool2d(x[0], c.k, c.o); },
                                   {distinct(g, c.x)}));
  }
}

TEST(PoolGradcheck, AvgPool) {
  const std::vector<PoolCase> cases = {
      {"2x2", {2, 3, 6, 6}, 2, {}},
      {"3x3_pad1_include", {1, 2, 5, 5}, 3, {.stride = 2, .padding = 1}},
      {"3x3_pad1_exclude", {1, 2, 5, 5}, 3, {.stride = 2, .padding = 1, .count_include_pad = false}},
      {"ceil_mode", {1, 2, 7, 6}, 3, {.stride = 2, .padding = 1, .ceil_mode = true}},
      {"overlap", {1, 1, 6, 6}, 3, {.stride = 1}},
  };
  for (const PoolCase& c : cases) {
    Generator g(2);
    EXPECT_TRUE(testing::gradcheck("avg_pool2d/" + c.name,
                                   [&](const std::vector<Tensor>& x) { return ops::avg_pool2d(x[0], c.k, c.o); },
                                   {Tensor::uniform(c.x, g, -1, 1, DType::f64).set_requires_grad()}));
  }
}

TEST(PoolGradcheck, AdaptiveAvgPool) {
  for (const auto& [in, out] : std::vector<std::pair<Shape, ops::IntPair>>{
           {{2, 3, 7, 7}, 3}, {{1, 2, 5, 8}, {2, 3}}, {{1, 2, 4, 4}, 1}, {{1, 1, 3, 3}, 5}}) {
    Generator g(3);
    EXPECT_TRUE(testing::gradcheck("adaptive_avg_pool2d",
                                   [&](const std::vector<Tensor>& x) { return ops::adaptive_avg_pool2d(x[0], out); },
                                   {Tensor::uniform(in, g, -1, 1, DType::f64).set_requires_grad()}));
  }
}

TEST(Pool, KnownValues) {
  // 4x4 ramp 0..15.
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[size_t(i)] = float(i);
  const Tensor x = Tensor::from_vector(v, {1, 1, 4, 4});
  EXPECT_EQ(ops::max_pool2d(x, 2).to_vector(), (std::vector<float>{5, 7, 13, 15}));
  EXPECT_EQ(ops::avg_pool2d(x, 2).to_vector(), (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));
  // 3x3 window, stride 2, padding 1: corner window covers 4 real pixels (0,1,4,5) of 9.
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1}).to_vector()[0], 10.f / 9.f);
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1, .count_include_pad = false}).to_vector()[0], 2.5f);
  // Ceil mode, 4 -> 2 windows of 3 with stride 2: rows/cols [0,3) and [2,4).
  EXPECT_EQ(ops::max_pool2d(x, 3, {.stride = 2, .ceil_mode = true}).to_vector(), (std::vector<float>{10, 11, 14, 15}));
  // Its avg divisor: the last window is clipped to the input (not counted past it): (10+11+14+15)/4.
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .ceil_mode = true}).to_vector()[3], 12.5f);
  // Adaptive 4 -> 3: windows [0,2), [1,3), [2,4).
  EXPECT_FLOAT_EQ(ops::adaptive_avg_pool2d(x, 3).to_vector()[0], 2.5f);
  EXPECT_FLOAT_EQ(ops::adaptive_avg_pool2d(x, 1).to_vector()[0], 7.5f);
}

TEST(Pool, MaxPropagatesNaNAndKeepsArgmaxInOneByte) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, NAN, 3, 4}, {1, 1, 2, 2}).set_requires_grad();
  Tensor y = ops::max_pool2d(x, 2);
  EXPECT_TRUE(std::isnan(y.item()));
  const kernels::MaxPoolResult r = kernels::max_pool2d_forward(
      Tensor::zeros({1, 1, 4, 4}),
      {.n = 1, .c = 1, .h = 4, .w = 4, .oh = 2, .ow = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2});
  EXPECT_EQ(r.argmax.dtype(), DType::u8);
}

// ---- the fast path against the reference ----

struct FastRun {
  Tensor y, gx;
};
template <class F>
FastRun pool_run(const Tensor& x, const Tensor& gy, kernels::Backend be, F&& f) {
  BackendGuard guard(be);
  Tensor xl = x.clone().set_requires_grad();
  FastRun r;
  r.y = f(xl);
  r.y.backward(gy);
  r.gx = xl.grad();
  return r;
}

TEST(PoolFast, MatchesReferenceInEveryDType) {
  using Fn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> fns = {
      {"max2x2", [](const Tensor& x) { return ops::max_pool2d(x, 2); }},
      {"max3x3s2p1", [](const Tensor& x) { return ops::max_pool2d(x, 3, {.stride = 2, .padding = 1}); }},
      {"max_dil_ceil",
       [](const Tensor& x) { return ops::max_pool2d(x, 2, {.stride = 2, .dilation = 2, .ceil_mode = true}); }},
      {"max3x3s1", [](const Tensor& x) { return ops::max_pool2d(x, 3, {.stride = 1}); }},
      {"avg2x2", [](const Tensor& x) { return ops::avg_pool2d(x, 2); }},
      {"avg3x3s2p1_excl",
       [](const Tensor& x) { return ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1, .count_include_pad = false}); }},
      {"avg3x3s1", [](const Tensor& x) { return ops::avg_pool2d(x, 3, {.stride = 1, .ceil_mode = true}); }},
      {"adaptive3",
       [](const Tensor& x) {
         return ops::adaptive_avg_pool2d(x, {3, 4});
       }},
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [name, f] : fns) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(t)));
      Generator g(8);
      const Tensor x = convtest::rand(g, {3, 5, 13, 11}, t);
      Shape ys;
      {
        BackendGuard ref(kernels::Backend::ref);
        ys = f(x).shape();
      }
      const Tensor gy = convtest::rand(g, ys, t);
      const FastRun ref = pool_run(x, gy, kernels::Backend::ref, f), fast = pool_run(x, gy, kernels::Backend::cpu, f);
      // Max is exact; averages and gradient sums over overlapping windows accumulate at most 16
      // f32 terms, each at most max|input|.
      auto bound = [t](const Tensor& expect, const Tensor& in) {
        double mx = 0;
        for (double v : in.to_vector_f64()) mx = std::max(mx, std::fabs(v));
        const std::vector<double> r = expect.to_vector_f64();
        return [r, t, mx](size_t i) { return convtest::ulp_of(t, r[i]) + 16 * 16 * convtest::kU32 * mx; };
      };
      EXPECT_TRUE(convtest::close(fast.y, ref.y, bound(ref.y, x), "forward"));
      EXPECT_TRUE(convtest::close(fast.gx, ref.gx, bound(ref.gx, gy), "backward"));
    }
  }
}

TEST(PoolFast, MaxPool2x2TiesAndNaNsPickWhatTheReferencePicks) {
  // Rows of 40 -> 20 outputs: 16 through the vector kernel and a tail of 4 through the scalar one.
  // Values from {0, 1, 2, NaN} make ties and NaNs common; the gradient shows which input won.
  for (DType t : {DType::f32, DType::bf16}) {
    Generator g(21);
    std::vector<float> v(2 * 3 * 7 * 40);
    for (float& x : v) {
      const uint64_t r = g.next_u64() % 8;
      x = r == 7 ? NAN : float(r % 3);
    }
    const Tensor x = Tensor::from_vector(v, {2, 3, 7, 40}, t);
    const Tensor gy = convtest::rand(g, {2, 3, 3, 20}, t);
    auto f = [](const Tensor& in) { return ops::max_pool2d(in, 2); };
    const FastRun ref = pool_run(x, gy, kernels::Backend::ref, f), fast = pool_run(x, gy, kernels::Backend::cpu, f);
    EXPECT_TRUE(convtest::close(
        fast.y, ref.y, [](size_t) { return 0.0; }, "forward"));
    EXPECT_TRUE(convtest::close(
        fast.gx, ref.gx, [](size_t) { return 0.0; }, "backward"));
  }
}

TEST(PoolErrors, KernelLargerThanInputNamesLayerAndShapes) {
  nn::MaxPool2d pool(5);
  try {
    pool(Tensor::zeros({1, 2, 3, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MaxPool2d(kernel_size=5"), std::string::npos) << m;
    EXPECT_NE(m.find("[1, 2, 3, 3]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::max_pool2d(Tensor::zeros({1, 1, 4, 4}), 2, {.padding = 2}), Error);  // pad > kernel/2
  EXPECT_THROW(ops::avg_pool2d(Tensor::zeros({1, 1, 4, 4}), 2, {.dilation = 2}), Error);
  EXPECT_THROW(ops::adaptive_avg_pool2d(Tensor::zeros({1, 1, 4, 4}), 0), Error);
  EXPECT_THROW(ops::max_pool2d(Tensor::zeros({4, 4}), 2), Error);
}

TEST(PoolModules, NamesAsPyTorchPrintsThem) {
  EXPECT_EQ(nn::MaxPool2d(2).name(), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  EXPECT_EQ(nn::AvgPool2d(3, {.stride = 2, .padding = 1}).name(), "AvgPool2d(kernel_size=3, stride=2, padding=1)");
  EXPECT_EQ(nn::AdaptiveAvgPool2d(1).name(), "AdaptiveAvgPool2d(output_size=1)");
}

}  // namespace
}  // namespace mixprec
