// batch_norm, layer_norm and cat: f64 gradient checks, running statistics against a reference
// computation, eval mode, BatchNorm2d's state_dict, autocast (fp32 class), and the fast kernels
// against the reference in f32/bf16/f16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "conv_test_util.h"
#include "gradcheck.h"
#include "mixprec/autocast.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;

Tensor U(Generator& g, const Shape& s, double lo = -1, double hi = 1) {
  return Tensor::uniform(s, g, lo, hi, DType::f64).set_requires_grad();
}

TEST(NormGradcheck, BatchNormTraining) {
  Generator g(1);
  for (const Shape& s : std::vector<Shape>{{4, 3, 3, 2}, {5, 2}, {3, 2, 4}}) {
    const int64_t c = s[1];
    EXPECT_TRUE(testing::gradcheck(
        "batch_norm/train " + shape_str(s),
        [](const std::vector<Tensor>& x) { return ops::batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], true); },
        {U(g, s), U(g, {c}, 0.5, 1.5), U(g, {c})}));
  }
  // Without affine parameters, and with running statistics being updated on the side.
  Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
  EXPECT_TRUE(testing::gradcheck(
      "batch_norm/train no affine",
      [&](const std::vector<Tensor>& x) { return ops::batch_norm(x[0], rm, rv, Tensor(), Tensor(), true, 0.3); },
      {U(g, {4, 3, 2, 2})}));
}

TEST(NormGradcheck, BatchNormEval) {
  Generator g(2);
  const Tensor rm = Tensor::uniform({3}, g, -0.5, 0.5, DType::f64), rv = Tensor::uniform({3}, g, 0.5, 2, DType::f64);
  EXPECT_TRUE(testing::gradcheck(
      "batch_norm/eval", [&](const std::vector<Tensor>& x) { return ops::batch_norm(x[0], rm, rv, x[1], x[2], false); },
      {U(g, {2, 3, 3, 3}), U(g, {3}), U(g, {3})}));
}

TEST(NormGradcheck, LayerNorm) {
  Generator g(3);
  EXPECT_TRUE(testing::gradcheck("layer_norm/last dim",
                                 [](const std::vector<Tensor>& x) { return ops::layer_norm(x[0], {5}, x[1], x[2]); },
                                 {U(g, {3, 5}), U(g, {5}, 0.5, 1.5), U(g, {5})}));
  EXPECT_TRUE(testing::gradcheck("layer_norm/two dims",
                                 [](const std::vector<Tensor>& x) {
                                   return ops::layer_norm(x[0], {3, 4}, x[1], x[2]);
                                 },
                                 {U(g, {2, 3, 4}), U(g, {3, 4}), U(g, {3, 4})}));
  EXPECT_TRUE(testing::gradcheck(
      "layer_norm/no affine", [](const std::vector<Tensor>& x) { return ops::layer_norm(x[0], {6}); }, {U(g, {4, 6})}));
}

TEST(NormGradcheck, Cat) {
  Generator g(4);
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_TRUE(testing::gradcheck("cat/dim " + std::to_string(dim),
                                   [dim](const std::vector<Tensor>& x) {
                                     return ops::cat({x[0], x[1], x[2]}, dim);
                                   },
                                   {U(g, {2, 3, 2}), U(g, {2, 3, 2}), U(g, {2, 3, 2})}));
  }
  EXPECT_TRUE(testing::gradcheck("cat/uneven",
                                 [](const std::vector<Tensor>& x) {
                                   return ops::cat({x[0], x[1]}, 1);
                                 },
                                 {U(g, {2, 1, 3}), U(g, {2, 4, 3})}));
}

TEST(Cat, ValuesPromotionAndErrors) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_vector(std::vector<float>{5, 6}, {2, 1}, DType::bf16);
  const Tensor c = ops::cat({a, b}, 1);
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(c.to_vector(), (std::vector<float>{1, 2, 5, 3, 4, 6}));
  EXPECT_THROW(ops::cat({a, Tensor::zeros({3, 1})}, 1), Error);
  EXPECT_THROW(ops::cat({}, 0), Error);
  EXPECT_THROW(ops::cat({a, Tensor::zeros({2})}, 0), Error);
}

// ---- running statistics and modes ----

TEST(BatchNorm2d, RunningStatisticsMatchAReferenceComputation) {
  default_generator().manual_seed(0);
  nn::BatchNorm2d bn(3, {.momentum = 0.2});
  Generator g(5);
  std::vector<double> rm(3, 0.0), rv(3, 1.0);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::randn({4, 3, 5, 5}, g, DType::f32, 2.0);
    bn(x);
    const std::vector<double> v = x.to_vector_f64();
    for (int64_t c = 0; c < 3; ++c) {
      double s = 0, ss = 0;
      const int64_t n = 4 * 25;
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t i = 0; i < 25; ++i) s += v[size_t((b * 3 + c) * 25 + i)];
      const double mean = s / double(n);
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t i = 0; i < 25; ++i) ss += std::pow(v[size_t((b * 3 + c) * 25 + i)] - mean, 2);
      rm[size_t(c)] = 0.8 * rm[size_t(c)] + 0.2 * mean;
      rv[size_t(c)] = 0.8 * rv[size_t(c)] + 0.2 * ss / double(n - 1);  // unbiased, as PyTorch
    }
    const std::vector<double> got_m = bn.running_mean.to_vector_f64(), got_v = bn.running_var.to_vector_f64();
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_NEAR(got_m[c], rm[c], 1e-5) << "step " << step;
      EXPECT_NEAR(got_v[c], rv[c], 1e-5 * rv[c]) << "step " << step;
    }
  }
  EXPECT_EQ(bn.num_batches_tracked.item(), 3.0);

  // Eval: normalises with the running statistics (and leaves them alone).
  bn.eval();
  bn.weight.copy_(Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}));
  bn.bias.copy_(Tensor::from_vector(std::vector<float>{0.5f, 0, -1}, {3}));
  const Tensor x = Tensor::randn({2, 3, 2, 2}, g);
  const std::vector<float> y = bn(x).to_vector(), xv = x.to_vector();
  const std::vector<float> w{1, 2, 3}, b{0.5f, 0, -1};
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = i / 4 % 3;
    EXPECT_NEAR(y[i], (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c], 1e-4);
  }
  EXPECT_EQ(bn.num_batches_tracked.item(), 3.0);
  EXPECT_NEAR(bn.running_mean.to_vector_f64()[0], rm[0], 1e-5);
}

TEST(BatchNorm2d, CumulativeAverageWhenMomentumIsNone) {
  nn::BatchNorm2d bn(1, {.momentum = std::nullopt});
  bn(Tensor::from_vector(std::vector<float>{0, 2}, {2, 1, 1, 1}));  // mean 1
  bn(Tensor::from_vector(std::vector<float>{3, 5}, {2, 1, 1, 1}));  // mean 4
  EXPECT_NEAR(bn.running_mean.item(), 2.5, 1e-6);                   // the plain average of 1 and 4
}

TEST(BatchNorm2d, StateDictNamesAsPyTorch) {
  nn::Sequential m(nn::Conv2d(1, 4, 3), nn::BatchNorm2d(4));
  std::vector<std::string> names;
  for (const auto& [n, t] : m.state_dict()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                             "1.running_var", "1.num_batches_tracked"}));
  const auto sd = m.state_dict();
  EXPECT_EQ(sd[6].second.dtype(), DType::i64);
  EXPECT_EQ(sd[6].second.dim(), 0);
  EXPECT_EQ(m.parameters().size(), 4u);  // buffers are not parameters
  EXPECT_EQ(nn::BatchNorm2d(32).name(),
            "BatchNorm2d(32, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
}

TEST(BatchNorm2d, ErrorsNameTheLayer) {
  nn::BatchNorm2d bn(8);
  try {
    bn(Tensor::zeros({2, 4, 3, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("BatchNorm2d(8"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 4, 3, 3]"), std::string::npos) << m;
  }
  EXPECT_THROW(bn(Tensor::zeros({1, 8, 1, 1})), Error);  // one value per channel in training
}

TEST(NormAutocast, Fp32ClassRunsInF32On16BitInput) {
  nn::BatchNorm2d bn(3);
  nn::LayerNorm ln({5});
  Generator g(6);
  const Tensor x = Tensor::randn({2, 3, 4, 5}, g).to(DType::bf16);
  amp::Autocast ac(DType::bf16);
  EXPECT_EQ(bn(x).dtype(), DType::f32);
  EXPECT_EQ(ln(x).dtype(), DType::f32);
}

// ---- fast kernels against the reference ----

TEST(NormFast, MatchesReferenceInEveryDType) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Generator g(12);
    const Tensor x = convtest::rand(g, {6, 5, 7, 9}, t, -2, 3);
    const Tensor w = convtest::rand(g, {5}, DType::f32, 0.5, 1.5), b = convtest::rand(g, {5}, DType::f32);
    const Tensor gy = convtest::rand(g, {6, 5, 7, 9}, t);
    struct Out {
      Tensor y, gx, gw, gb, rm, rv;
    };
    auto run = [&](kernels::Backend be, bool training, bool layer) {
      BackendGuard guard(be);
      Tensor xl = x.clone().set_requires_grad(), wl = w.clone().set_requires_grad(), bl = b.clone().set_requires_grad();
      Out o;
      o.rm = Tensor::zeros({5}), o.rv = Tensor::ones({5});
      if (layer) {
        o.y = ops::layer_norm(xl, {9});
      } else {
        o.y = ops::batch_norm(xl, o.rm, o.rv, wl, bl, training);
      }
      o.y.backward(gy);
      o.gx = xl.grad(), o.gw = wl.grad(), o.gb = bl.grad();
      return o;
    };
    // Tolerance: 1 ulp of the dtype plus f32 accumulation over the reduced extent (6*7*9 terms).
    auto tol = [&](const Tensor& ref, double scale) {
      const std::vector<double> r = ref.to_vector_f64();
      return [r, t = ref.dtype(), scale](size_t i) { return 2 * convtest::ulp_of(t, r[i]) + scale; };
    };
    for (bool training : {true, false}) {
      const Out ref = run(kernels::Backend::ref, training, false), fast = run(kernels::Backend::cpu, training, false);
      EXPECT_TRUE(convtest::close(fast.y, ref.y, tol(ref.y, 1e-5), "batch_norm y"));
      EXPECT_TRUE(convtest::close(fast.gx, ref.gx, tol(ref.gx, 1e-5), "batch_norm gx"));
      EXPECT_TRUE(convtest::close(fast.gw, ref.gw, tol(ref.gw, 378 * 4 * convtest::kU32 * 4), "batch_norm gw"));
      EXPECT_TRUE(convtest::close(fast.gb, ref.gb, tol(ref.gb, 378 * 4 * convtest::kU32 * 4), "batch_norm gb"));
      EXPECT_TRUE(convtest::close(fast.rm, ref.rm, tol(ref.rm, 1e-6), "running_mean"));
      EXPECT_TRUE(convtest::close(fast.rv, ref.rv, tol(ref.rv, 1e-6), "running_var"));
    }
    const Out ref = run(kernels::Backend::ref, true, true), fast = run(kernels::Backend::cpu, true, true);
    EXPECT_TRUE(convtest::close(fast.y, ref.y, tol(ref.y, 1e-5), "layer_norm y"));
    EXPECT_TRUE(convtest::close(fast.gx, ref.gx, tol(ref.gx, 1e-5), "layer_norm gx"));
  }
}

TEST(NormFast, LayerNormAffineMatchesReference) {
  for (DType t : {DType::f32, DType::bf16}) {
    Generator g(13);
    const Tensor x = convtest::rand(g, {37, 64}, t, -2, 3), gy = convtest::rand(g, {37, 64}, t);
    const Tensor w = convtest::rand(g, {64}, t, 0.5, 1.5), b = convtest::rand(g, {64}, t);
    auto run = [&](kernels::Backend be) {
      BackendGuard guard(be);
      Tensor xl = x.clone().set_requires_grad(), wl = w.clone().set_requires_grad(), bl = b.clone().set_requires_grad();
      Tensor y = ops::layer_norm(xl, {64}, wl, bl);
      y.backward(gy);
      return std::vector<Tensor>{y, xl.grad(), wl.grad(), bl.grad()};
    };
    const auto ref = run(kernels::Backend::ref), fast = run(kernels::Backend::cpu);
    for (size_t i = 0; i < ref.size(); ++i) {
      const std::vector<double> r = ref[i].to_vector_f64();
      EXPECT_TRUE(convtest::close(
          fast[i], ref[i], [&](size_t k) { return 2 * convtest::ulp_of(ref[i].dtype(), r[k]) + 1e-4; },
          "layer_norm output " + std::to_string(i)));
    }
  }
}

}  // namespace
}  // namespace mixprec
