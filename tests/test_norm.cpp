// batch_norm, layer_norm and cat: f64 gradient checks, running statistics against a reference
// computation, eval mode, BatchNorm2d's state_dict, autocast (batch norm's mixed class, layer
// norm's fp32 class and its 16-bit x̂), and the fast kernels
// against the reference in f32/bf16/f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conv_test_util.h"
#include "gradcheck.h"
#include "kernels/norm.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/convert.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;
using testutil::bytes_of;

bool same_bits(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() && bytes_of(a) == bytes_of(b); }

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
  // Against f64 from the module's own (f32) statistics: a handful of f32 roundings of the terms
  // (the scale 1 / sqrt(var + eps) from f64, its product with w, x - mean or the shift, the sum).
  const std::vector<double> mf = bn.running_mean.to_vector_f64(), vf = bn.running_var.to_vector_f64();
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = i / 4 % 3;
    const double scale = w[c] / std::sqrt(vf[c] + 1e-5);
    const double bound = 8 * 0x1p-24 * (std::fabs(xv[i] * scale) + std::fabs(mf[c] * scale) + std::fabs(b[c]));
    EXPECT_NEAR(y[i], (xv[i] - mf[c]) * scale + b[c], bound) << i;
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

TEST(NormAutocast, BatchNormKeepsA16BitInputLayerNormRunsInF32) {
  nn::BatchNorm2d bn(3);
  nn::LayerNorm ln({5});
  Generator g(6);
  const Tensor x = Tensor::randn({2, 3, 4, 5}, g).to(DType::bf16);
  amp::Autocast ac(DType::bf16);
  EXPECT_EQ(bn(x).dtype(), DType::bf16);  // class mixed: f32 weights and statistics
  EXPECT_EQ(bn(x.to(DType::f32)).dtype(), DType::f32);
  EXPECT_EQ(ln(x).dtype(), DType::f32);  // class fp32
}

// A batch norm under 16-bit autocast (class mixed) computes what the f32 batch norm of the
// upcast input computes, rounded once to the input's dtype, forward and backward, bit for bit on
// each backend, and keeps the 16-bit input for backward instead of an f32 copy of it. So in
// conv -> batch norm -> ReLU -> conv, where the next conv rounds its input to 16 bits anyway and
// hands back a 16-bit gradient, the step computes the same numbers with half the saved bytes.
TEST(NormAutocast, BatchNormOn16BitsIsTheF32PathRoundedOnceAndSavesHalf) {
  Generator g(23);
  const Shape shape{8, 4, 8, 8};  // 8 x 4 x 64 elements: whole 64-byte allocator blocks in 16 bits
  const Tensor w0 = convtest::rand(g, {4}, DType::f32, 0.5, 1.5), b0 = convtest::rand(g, {4}, DType::f32);
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const Tensor x0 = convtest::rand(g, shape, t, -2, 3), gy = convtest::rand(g, shape, t);
    for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
      BackendGuard guard(be);
      for (bool training : {true, false}) {
        struct Run {
          Tensor y, gx, gw, gb, rm, rv;
          int64_t kept = 0;
        };
        auto run = [&](bool autocast) {
          Run r;
          r.rm = Tensor::full({4}, 0.25), r.rv = Tensor::full({4}, 2.0);
          Tensor x = x0.clone().set_requires_grad(), w = w0.clone().set_requires_grad(),
                 b = b0.clone().set_requires_grad();
          const int64_t before = allocator::stats().live_total;
          {
            std::optional<amp::Autocast> ac;
            if (autocast) ac.emplace(t);
            // the f32 path: the cast autocast's fp32 class made, then the cast the next conv makes
            const Tensor in = ops::neg(ops::neg(x));  // an intermediate: only the norm can keep it
            Tensor y = ops::batch_norm(autocast ? in : in.to(DType::f32), r.rm, r.rv, w, b, training);
            r.y = autocast ? y : y.to(t);
          }
          r.kept = allocator::stats().live_total - before - int64_t(r.y.nbytes());
          r.y.backward(gy);
          r.gx = x.grad(), r.gw = w.grad(), r.gb = b.grad();
          return r;
        };
        const Run mixed = run(true), f32 = run(false);
        EXPECT_EQ(mixed.y.dtype(), t);
        EXPECT_EQ(mixed.gx.dtype(), t);
        EXPECT_EQ(mixed.gw.dtype(), DType::f32);
        EXPECT_TRUE(same_bits(mixed.y, f32.y)) << "y, training " << training;
        EXPECT_TRUE(same_bits(mixed.gx, f32.gx)) << "grad x, training " << training;
        EXPECT_TRUE(same_bits(mixed.gw, f32.gw)) << "grad weight, training " << training;
        EXPECT_TRUE(same_bits(mixed.gb, f32.gb)) << "grad bias, training " << training;
        EXPECT_TRUE(same_bits(mixed.rm, f32.rm) && same_bits(mixed.rv, f32.rv))
            << "running statistics, training " << training;
        // The f32 path keeps the f32 copy of the input (4 bytes an element) and, by the second
        // cast's node, nothing more; the mixed one the 16-bit input itself (2 bytes).
        EXPECT_EQ(f32.kept - mixed.kept, shape_numel(shape) * 2) << "bytes kept beside y, training " << training;
      }
    }
  }
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

// The fast kernel (f32 arithmetic) against the reference run in f64 on the same inputs, per
// element: 2 ulp of the output's dtype (the f32 result rounded, then rounded to the dtype) plus the
// f32 accumulation bound of its reductions, n * 2^-24 (n = 64 along a row for y and x's gradient,
// 37 rows for the weight's and bias's), times the element's magnitude plus its tensor's RMS (the
// scale of the row sums that cancel: the mean, sum(gy * w) and sum(gy * w * x̂)).
TEST(NormFast, LayerNormAffineMatchesReference) {
  for (DType t : {DType::f32, DType::bf16}) {
    Generator g(13);
    const Tensor x = convtest::rand(g, {37, 64}, t, -2, 3), gy = convtest::rand(g, {37, 64}, t);
    const Tensor w = convtest::rand(g, {64}, t, 0.5, 1.5), b = convtest::rand(g, {64}, t);
    auto run = [&](kernels::Backend be, DType as) {
      BackendGuard guard(be);
      Tensor xl = x.to(as).detach().set_requires_grad(), wl = w.to(as).detach().set_requires_grad(),
             bl = b.to(as).detach().set_requires_grad();
      Tensor y = ops::layer_norm(xl, {64}, wl, bl);
      y.backward(gy.to(as));
      return std::vector<Tensor>{y, xl.grad(), wl.grad(), bl.grad()};
    };
    const auto ref = run(kernels::Backend::ref, DType::f64), fast = run(kernels::Backend::cpu, t);
    for (size_t i = 0; i < ref.size(); ++i) {
      const std::vector<double> r = ref[i].to_vector_f64(), f = fast[i].to_vector_f64();
      ASSERT_EQ(fast[i].dtype(), t);
      double rms = 0;
      for (double v : r) rms += v * v;
      rms = std::sqrt(rms / double(r.size()));
      const double n = i < 2 ? 64 : 37;
      for (size_t k = 0; k < r.size(); ++k)
        EXPECT_NEAR(f[k], r[k], 2 * convtest::ulp_of(t, r[k]) + n * std::ldexp(1.0, -24) * (std::fabs(r[k]) + rms))
            << dtype_name(t) << " layer_norm output " << i << " [" << k << "]";
    }
  }
}

// ---- layer norm's saved x̂ (what autocast keeps for backward instead of the f32 input) ----

// The forward's x̂ output, rounded once to its dtype, and the backward from x̂ (no mean) equal to
// the backward from x, in the reference and the fast kernel.
TEST(NormKernels, LayerNormXhatOutputAndBackwardFromXhat) {
  Generator g(21);
  const int64_t rows = 37, cols = 64;
  const Tensor x = convtest::rand(g, {rows, cols}, DType::f32, -2, 3), gy = convtest::rand(g, {rows, cols}, DType::f32);
  const Tensor w = convtest::rand(g, {cols}, DType::f32, 0.5, 1.5), b = convtest::rand(g, {cols}, DType::f32);
  // x̂ in f64 from the f64 reference's statistics.
  Tensor m64, r64;
  const Tensor x64 = x.to(DType::f64);
  (void)kernels::ref::layer_norm_forward(x64, w, b, 1e-5, m64, r64, Tensor());
  const std::vector<double> xv = x64.to_vector_f64(), mv = m64.to_vector_f64(), rv = r64.to_vector_f64();
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      want[size_t(r * cols + j)] = (xv[size_t(r * cols + j)] - mv[size_t(r)]) * rv[size_t(r)];
  const Tensor want_t = Tensor::from_vector(want, {rows, cols}, DType::f64);
  for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu})
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(be == kernels::Backend::ref ? "ref " : "cpu ") + std::string(dtype_name(t)));
      BackendGuard guard(be);
      Tensor mean, rstd;
      const Tensor xhat = Tensor::empty({rows, cols}, t);
      const Tensor y = kernels::layer_norm_forward(x, w, b, 1e-5, mean, rstd, xhat);
      // Rounded once (half an ulp), plus the f32 compute of the fast kernel: a few f32 ulps of |x̂| <= 8.
      EXPECT_TRUE(convtest::close(
          xhat.to(DType::f64), want_t,
          [&](size_t i) { return convtest::ulp_of(t, want[i]) / 2 + 8 * 8 * convtest::kU32; }, "x̂"));
      // The same y as without x̂.
      Tensor mean2, rstd2;
      EXPECT_TRUE(convtest::close(
          kernels::layer_norm_forward(x, w, b, 1e-5, mean2, rstd2), y, [](size_t) { return 0.0; }, "y unchanged"));
      if (t != DType::f32) continue;
      // Backward from the f32 x̂ (mean undefined) against backward from x: the same formula, so the
      // same values up to the f32 rounding of x̂ (relative 2^-24 on terms of size |g| |x̂| <= 8 |g|).
      const kernels::NormGrads from_x = kernels::layer_norm_backward(gy, x, mean, rstd, w, true, true, true);
      const kernels::NormGrads from_xhat = kernels::layer_norm_backward(gy, xhat, Tensor(), rstd, w, true, true, true);
      const double rmax = *std::max_element(rv.begin(), rv.end());
      EXPECT_TRUE(convtest::close(
          from_xhat.x, from_x.x, [&](size_t) { return rmax * 64 * 8 * convtest::kU32; }, "gx"));
      EXPECT_TRUE(convtest::close(
          from_xhat.weight, from_x.weight, [&](size_t) { return rows * 16 * convtest::kU32; }, "gw"));
      EXPECT_TRUE(convtest::close(
          from_xhat.bias, from_x.bias, [](size_t) { return 0.0; }, "gb"));
    }
}

// The backward from autocast's 16-bit x̂ with a gradient of the same dtype and an f32 grad_x (a
// transformer's norms) reads both in place where the rows are a multiple of 16 long: bf16 with
// AVX-512 (cpu/norm.cpp, layer_norm_row_backward_bf16), bf16 and f16 with AVX2
// (layer_norm_row_backward_16_avx2). Its gradients must be, bit for bit, those of the same values
// widened to f32 beforehand, the converted path it replaces (the path f16 takes on AVX-512 hosts,
// and both dtypes on a host with neither); with and without the weight, grad_x or not, rows in
// whole groups and not.
TEST(NormKernels, LayerNormBackwardOn16BitsIsTheF32KernelsBits) {
  Generator g(22);
  for (DType t : {DType::bf16, DType::f16})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 128}, {1, 16}, {5, 48}, {300, 1024}})
      for (bool weighted : {true, false})
        for (bool need_x : {true, false}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(rows) + " x " + std::to_string(cols) +
                       (weighted ? " weighted" : "") + (need_x ? " grad_x" : ""));
          const Tensor gy = convtest::rand(g, {rows, cols}, DType::f32, -3, 3).to(t);
          const Tensor xhat = convtest::rand(g, {rows, cols}, DType::f32, -4, 4).to(t);
          const Tensor rstd = convtest::rand(g, {rows}, DType::f32, 0.1, 5);
          const Tensor w = weighted ? convtest::rand(g, {cols}, DType::f32, 0.5, 1.5) : Tensor();
          kernels::NormGrads direct, widened;
          ASSERT_TRUE(
              kernels::cpu::layer_norm_backward(gy, xhat, Tensor(), rstd, w, need_x, true, true, DType::f32, direct));
          ASSERT_TRUE(kernels::cpu::layer_norm_backward(gy.to(DType::f32), xhat.to(DType::f32), Tensor(), rstd, w,
                                                        need_x, true, true, DType::f32, widened));
          if (need_x) {
            EXPECT_TRUE(same_bits(direct.x, widened.x)) << "grad_x";
          }
          EXPECT_TRUE(same_bits(direct.weight, widened.weight)) << "grad_weight";
          EXPECT_TRUE(same_bits(direct.bias, widened.bias)) << "grad_bias";
        }
}

// Under 16-bit autocast, layer norm saves x̂ in that dtype, not its f32 input: the forward keeps
// half the bytes of an f32 input that nothing else holds, and the gradients stay within the bound
// that rounding x̂ once allows (first order in the unit roundoff u) of the f64 gradients.
TEST(NormAutocast, LayerNormSavesXhatIn16BitsWithinItsBound) {
  Generator g(22);
  const int64_t rows = 64, cols = 128;  // 64 rows x 128 f32 = 32 KiB: whole 64-byte blocks
  const Tensor x0 = convtest::rand(g, {rows, cols}, DType::f32, -2, 3),
               gy = convtest::rand(g, {rows, cols}, DType::f32);
  const Tensor w0 = convtest::rand(g, {cols}, DType::f32, 0.5, 1.5), b0 = convtest::rand(g, {cols}, DType::f32);
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
      BackendGuard guard(be);
      Tensor xl = x0.clone().set_requires_grad(), wl = w0.clone().set_requires_grad(),
             bl = b0.clone().set_requires_grad();
      int64_t kept_autocast = 0, kept_f32 = 0;
      for (bool autocast : {false, true}) {
        std::optional<amp::Autocast> ac;
        if (autocast) ac.emplace(t);
        Tensor y;
        const int64_t before = allocator::stats().live_total;
        {
          const Tensor h = ops::neg(ops::neg(xl));  // an intermediate: only the norm's saved tensors can keep it
          y = ops::layer_norm(h, {cols}, wl, bl);
        }
        (autocast ? kept_autocast : kept_f32) = allocator::stats().live_total - before - int64_t(y.nbytes());
      }
      // The f32 input (4 bytes an element) and its f32 row means against x̂ (2 bytes): backward
      // from x̂ needs no mean. Both keep rstd.
      EXPECT_EQ(kept_f32 - kept_autocast, rows * cols * 2 + rows * 4) << "bytes kept beside y";
      Tensor y;
      {
        amp::Autocast ac(t);
        y = ops::layer_norm(xl, {cols}, wl, bl);
      }
      y.backward(gy);
      // f64 reference gradients and the first-order bound of a relative error u in each x̂.
      Tensor m, rs;
      const Tensor x64 = x0.to(DType::f64), gy64 = gy.to(DType::f64), w64 = w0.to(DType::f64);
      (void)kernels::ref::layer_norm_forward(x64, w64, b0.to(DType::f64), 1e-5, m, rs, Tensor());
      const kernels::NormGrads want = kernels::ref::layer_norm_backward(gy64, x64, m, rs, w64, true, true, true);
      const std::vector<double> xv = x64.to_vector_f64(), gv = gy64.to_vector_f64(), wv = w64.to_vector_f64(),
                                mv = m.to_vector_f64(), rv = rs.to_vector_f64();
      const double u = convtest::ulp_of(t, 1.0);  // twice the unit roundoff: slack for the f32 compute
      std::vector<double> bx(xv.size()), bw(size_t(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        double mean_gx = 0, mean_abs = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = size_t(r * cols + j);
          const double xh = (xv[k] - mv[size_t(r)]) * rv[size_t(r)], gg = gv[k] * wv[size_t(j)];
          mean_gx += gg * xh / double(cols);
          mean_abs += std::abs(gg * xh) / double(cols);
          bw[size_t(j)] += std::abs(gv[k] * xh) * u + 1e-6;
        }
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = size_t(r * cols + j);
          const double xh = (xv[k] - mv[size_t(r)]) * rv[size_t(r)];
          bx[k] = rv[size_t(r)] * (u * std::abs(xh) * (std::abs(mean_gx) + mean_abs) + 1e-5);
        }
      }
      EXPECT_TRUE(convtest::close(
          xl.grad().to(DType::f64), want.x, [&](size_t i) { return bx[i]; }, "grad x"));
      EXPECT_TRUE(convtest::close(
          wl.grad().to(DType::f64), want.weight, [&](size_t i) { return bw[i]; }, "grad weight"));
    }
  }
}

// ---- layer norm's output in another dtype (what a pre-norm block's first Linear reads) ----

// y in y_dtype: on the fast kernel the bits of its f32 y cast (one rounding of the same f32
// value), on the reference its f64 y rounded once (half an ulp of y_dtype); the backward takes a
// 16-bit gradient and gives grad_x in grad_x_dtype with the bits of the backward from that
// gradient widened to f32 (widening is exact), from x and from x̂ alike.
TEST(NormKernels, LayerNormOutDtypeIsTheNormRoundedOnceAndTakesA16BitGradient) {
  Generator g(23);
  // The cpu backend under each rounding this host runs: the bf16 row kernel where it has
  // AVX512-BF16, the buffered path of AVX-512 CPUs without it (detail::native_bf16_rounding), the
  // AVX2 row kernel (bf16 and f16) on hosts without AVX-512.
  std::vector<std::pair<kernels::Backend, detail::ConversionPath>> runs = {
      {kernels::Backend::ref, detail::ConversionPath::best}};
  for (const detail::ConversionPath path : detail::bulk_conversion_paths())
    runs.emplace_back(kernels::Backend::cpu, path);
  // 37: a last group of one row (groups of 4); 72 columns: the AVX-512 bf16 row kernel's 32-lane
  // steps and a masked tail of 8; 75: tails of 11 there and of 3 in the AVX2 row kernel's 8 lanes.
  for (const int64_t cols : {int64_t(128), int64_t(72), int64_t(75)}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int64_t rows = 37;
    const Tensor x = convtest::rand(g, {rows, cols}, DType::f32, -2, 3);
    const Tensor w = convtest::rand(g, {cols}, DType::f32, 0.5, 1.5), b = convtest::rand(g, {cols}, DType::f32);
    Tensor m64, r64;
    const Tensor y64 = kernels::ref::layer_norm_forward(x.to(DType::f64), w, b, 1e-5, m64, r64, Tensor());
    const std::vector<double> yv = y64.to_vector_f64();
    for (const auto& [be, path] : runs)
      for (DType t : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::string(be == kernels::Backend::ref ? "ref " : "cpu ") + std::string(dtype_name(t)) + " " +
                     detail::conversion_path_name(path));
        const detail::ConversionPathScope scope(path);
        BackendGuard guard(be);
        Tensor mean, rstd, mean2, rstd2;
        const Tensor xhat = Tensor::empty({rows, cols}, t), xhat2 = Tensor::empty({rows, cols}, t);
        const Tensor y = kernels::layer_norm_forward(x, w, b, 1e-5, mean, rstd, xhat, t);
        const Tensor y32 = kernels::layer_norm_forward(x, w, b, 1e-5, mean2, rstd2, xhat2);
        ASSERT_EQ(y.dtype(), t);
        if (be == kernels::Backend::cpu) {
          EXPECT_TRUE(same_bits(y, y32.to(t))) << "y is the f32 y cast";
        } else {
          EXPECT_TRUE(convtest::close(
              y.to(DType::f64), y64, [&](size_t i) { return convtest::ulp_of(t, yv[i]) / 2; }, "y rounded once"));
        }
        EXPECT_TRUE(same_bits(xhat, xhat2) && same_bits(mean, mean2) && same_bits(rstd, rstd2)) << "saved tensors";
        const Tensor gy = convtest::rand(g, {rows, cols}, DType::f32).to(t);
        for (bool from_xhat : {false, true}) {
          SCOPED_TRACE(from_xhat ? "from x̂" : "from x");
          const Tensor& xs = from_xhat ? xhat : x;
          const Tensor ms = from_xhat ? Tensor() : mean;
          const kernels::NormGrads got =
              kernels::layer_norm_backward(gy, xs, ms, rstd, w, true, true, true, DType::f32);
          const kernels::NormGrads want =
              kernels::layer_norm_backward(gy.to(DType::f32), xs, ms, rstd, w, true, true, true);
          ASSERT_EQ(got.x.dtype(), DType::f32);
          EXPECT_TRUE(same_bits(got.x, want.x)) << "grad x";
          EXPECT_TRUE(same_bits(got.weight, want.weight)) << "grad weight";
          EXPECT_TRUE(same_bits(got.bias, want.bias)) << "grad bias";
        }
      }
  }
}

// ops::layer_norm's out_dtype under autocast is layer_norm then .to(dtype), fused: the same output
// on the fast kernels (within the one rounding on the reference), and the same gradients for x,
// weight and bias from the same 16-bit upstream gradient, in both backends.
TEST(NormAutocast, LayerNormOutDtypeIsTheNormThenTheCast) {
  Generator g(24);
  const int64_t rows = 64, cols = 96;
  const Tensor x0 = convtest::rand(g, {rows, cols}, DType::f32, -2, 3);
  const Tensor w0 = convtest::rand(g, {cols}, DType::f32, 0.5, 1.5), b0 = convtest::rand(g, {cols}, DType::f32);
  for (DType t : {DType::bf16, DType::f16})
    for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
      SCOPED_TRACE(std::string(be == kernels::Backend::ref ? "ref " : "cpu ") + std::string(dtype_name(t)));
      BackendGuard guard(be);
      const Tensor gy = convtest::rand(g, {rows, cols}, DType::f32).to(t);
      Tensor y[2], gx[2], gw[2], gb[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.clone().set_requires_grad(), w = w0.clone().set_requires_grad(),
               b = b0.clone().set_requires_grad();
        {
          amp::Autocast ac(t);
          y[fused] = fused ? ops::layer_norm(x, {cols}, w, b, 1e-5, t) : ops::layer_norm(x, {cols}, w, b).to(t);
        }
        y[fused].backward(gy);
        gx[fused] = x.grad(), gw[fused] = w.grad(), gb[fused] = b.grad();
      }
      ASSERT_EQ(y[1].dtype(), t);
      if (be == kernels::Backend::cpu)
        EXPECT_TRUE(same_bits(y[1], y[0])) << "y";
      else
        EXPECT_TRUE(convtest::close(
            y[1].to(DType::f64), y[0].to(DType::f64), [&](size_t) { return convtest::ulp_of(t, 8.0); },
            "y within an ulp of the rounded f32 y"));
      EXPECT_TRUE(same_bits(gx[1], gx[0])) << "grad x";
      EXPECT_TRUE(same_bits(gw[1], gw[0])) << "grad weight";
      EXPECT_TRUE(same_bits(gb[1], gb[0])) << "grad bias";
    }
  // Not a floating dtype: one line.
  EXPECT_THROW((void)ops::layer_norm(x0, {cols}, w0, b0, 1e-5, DType::i64), Error);
}

}  // namespace
}  // namespace mixprec
