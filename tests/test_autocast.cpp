// The autocast guard: each op class runs in the dtype ops.def gives it, parameters get f32
// gradients through the casts, the weight-cast cache lives as long as the outermost guard,
// guards nest, and the trace names what ran in which dtype.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "autocast/autocast_state.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"

namespace mixprec {
// gtest prints a failing case's DType parameter by name.
static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }

namespace {

struct Model {
  Tensor w, b;  // f32 leaf parameters
};
Model make_model(Generator& g, int64_t in = 8, int64_t out = 6) {
  return {Tensor::randn({out, in}, g, DType::f32, 0.3).set_requires_grad(),
          Tensor::randn({out}, g, DType::f32, 0.1).set_requires_grad()};
}
Tensor targets(int64_t n, int64_t classes) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = i % classes;
  return Tensor::from_vector(t, {n});
}

class AutocastBoth : public ::testing::TestWithParam<DType> {};

TEST_P(AutocastBoth, LowerOpsRunInTheAutocastDtype) {
  const DType half = GetParam();
  Generator g(1);
  Model m = make_model(g);
  Tensor x = Tensor::randn({4, 8}, g);
  amp::Autocast ac(half);
  EXPECT_TRUE(amp::is_autocast_enabled());
  EXPECT_EQ(amp::autocast_dtype(), half);
  EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), half);
  EXPECT_EQ(ops::linear(x, m.w).dtype(), half);
  EXPECT_EQ(ops::matmul(x, m.w.t()).dtype(), half);
  EXPECT_EQ(ops::matmul(x.reshape({2, 2, 8}), m.w.t()).dtype(), half);
  EXPECT_EQ(ops::linear(x.to(half), m.w, m.b).dtype(), half);
  // f64 is left alone, as in PyTorch.
  EXPECT_EQ(ops::matmul(x.to(DType::f64), m.w.t().to(DType::f64)).dtype(), DType::f64);
}

TEST_P(AutocastBoth, Fp32OpsUpcastHalfInputs) {
  const DType half = GetParam();
  Generator g(2);
  Tensor x = Tensor::randn({4, 6}, g, half);
  Tensor pos = Tensor::uniform({4, 6}, g, 0.5, 2.0, half);
  amp::Autocast ac(half);
  EXPECT_EQ(ops::softmax(x).dtype(), DType::f32);
  EXPECT_EQ(ops::log_softmax(x, 0).dtype(), DType::f32);
  EXPECT_EQ(ops::cross_entropy(x, targets(4, 6)).dtype(), DType::f32);
  EXPECT_EQ(ops::nll_loss(x, targets(4, 6)).dtype(), DType::f32);
  EXPECT_EQ(ops::mse_loss(x, pos).dtype(), DType::f32);
  EXPECT_EQ(ops::sum(x).dtype(), DType::f32);
  EXPECT_EQ(ops::sum(x, {0}).dtype(), DType::f32);
  EXPECT_EQ(ops::mean(x).dtype(), DType::f32);
  EXPECT_EQ(ops::exp(x).dtype(), DType::f32);
  EXPECT_EQ(ops::log(pos).dtype(), DType::f32);
  EXPECT_EQ(ops::pow(pos, 2.0).dtype(), DType::f32);
  EXPECT_EQ(ops::sqrt(pos).dtype(), DType::f32);
}

TEST_P(AutocastBoth, PromoteAndKeep) {
  const DType half = GetParam();
  const DType other_half = half == DType::bf16 ? DType::f16 : DType::bf16;
  Generator g(3);
  Tensor h = Tensor::randn({3, 4}, g, half), f = Tensor::randn({3, 4}, g);
  amp::Autocast ac(half);
  EXPECT_EQ(ops::add(h, f).dtype(), DType::f32);
  EXPECT_EQ(ops::mul(f, h).dtype(), DType::f32);
  EXPECT_EQ(ops::sub(h, h).dtype(), half);
  EXPECT_EQ(ops::div(h, Tensor::randn({3, 4}, g, other_half)).dtype(), DType::f32);
  EXPECT_EQ(ops::relu(h).dtype(), half);
  EXPECT_EQ(ops::relu(f).dtype(), DType::f32);
  EXPECT_EQ(ops::gelu(h).dtype(), half);
  EXPECT_EQ(ops::dropout(h, 0.5, true).dtype(), half);
  EXPECT_EQ(ops::neg(h).dtype(), half);
  EXPECT_EQ(ops::reshape(h, {12}).dtype(), half);
}

// An f32 parameter used in a 16-bit linear gets an f32 gradient (the cast's backward casts back),
// equal to the f32 computation within 16-bit rounding.
TEST_P(AutocastBoth, ParameterReceivesF32Gradient) {
  const DType half = GetParam();
  Generator g(4);
  Model m = make_model(g);
  Tensor x = Tensor::randn({5, 8}, g);
  Tensor loss;
  {
    amp::Autocast ac(half);
    Tensor y = ops::linear(x, m.w, m.b);
    ASSERT_EQ(y.dtype(), half);
    loss = ops::sum(ops::mul(y, y));
    ASSERT_EQ(loss.dtype(), DType::f32);
  }
  loss.backward();
  ASSERT_TRUE(m.w.grad().defined());
  EXPECT_EQ(m.w.grad().dtype(), DType::f32);
  EXPECT_EQ(m.b.grad().dtype(), DType::f32);
  EXPECT_EQ(m.w.grad().shape(), m.w.shape());
  // f32 reference: dL/dW = 2 y^T x, dL/db = 2 sum_rows(y).
  Tensor w32 = m.w.detach().set_requires_grad(), b32 = m.b.detach().set_requires_grad();
  Tensor y32 = ops::linear(x, w32, b32);
  ops::sum(ops::mul(y32, y32)).backward();
  const auto gw = m.w.grad().to_vector(), rw = w32.grad().to_vector();
  const auto gb = m.b.grad().to_vector(), rb = b32.grad().to_vector();
  // Per-element bounds, with u the 16-bit type's unit roundoff and A[k][i] = sum_l |x_kl w_il| + |b_i|
  // (a bound on |y_ki|): x and w rounded (u each) and y's f32 sum rounded to 16 bits (u) put y
  // within 3.1u A of f32's; the gradient 2y reaches linear's backward rounded to 16 bits (2 x 3.1u A
  // + 2u A); its products with the rounded x add 2u A |x|; at most one more rounding of the result
  // (u |g|). So |gw_ij - rw_ij| <= 13u sum_k A[k][i] |x_kj| and |gb_i - rb_i| <= 13u sum_k A[k][i].
  const double u = half == DType::bf16 ? 0x1p-8 : 0x1p-11;
  const std::vector<float> xv = x.to_vector(), wv = m.w.to_vector(), bv = m.b.to_vector();
  const int64_t rows = x.size(0), in = x.size(1), out = m.w.size(0);
  for (int64_t i = 0; i < out; ++i) {
    double bound_b = 0;
    std::vector<double> bound_w(size_t(in), 0.0);
    for (int64_t k = 0; k < rows; ++k) {
      double a = std::fabs(bv[size_t(i)]);
      for (int64_t l = 0; l < in; ++l) a += std::fabs(xv[size_t(k * in + l)] * wv[size_t(i * in + l)]);
      bound_b += 13 * u * a;
      for (int64_t j = 0; j < in; ++j) bound_w[size_t(j)] += 13 * u * a * std::fabs(xv[size_t(k * in + j)]);
    }
    for (int64_t j = 0; j < in; ++j)
      EXPECT_NEAR(gw[size_t(i * in + j)], rw[size_t(i * in + j)], bound_w[size_t(j)]) << i << ", " << j;
    EXPECT_NEAR(gb[size_t(i)], rb[size_t(i)], bound_b) << i;
  }
  // And not bit-identical: the forward really ran in 16 bits.
  EXPECT_NE(gw, rw);
}

TEST_P(AutocastBoth, WeightCastCacheLivesUntilTheOutermostGuardExits) {
  const DType half = GetParam();
  Generator g(5);
  Model m = make_model(g), m2 = make_model(g);
  Tensor fresh = Tensor::randn({6, 8}, g).set_requires_grad();
  Tensor x = Tensor::randn({2, 8}, g);
  ASSERT_EQ(amp::autocast_cache_size(), 0u);
  {
    amp::Autocast outer(half);
    Tensor y1 = ops::linear(x, m.w, m.b);
    EXPECT_EQ(amp::autocast_cache_size(), 2u);  // w and b
    Tensor y2 = ops::linear(ops::relu(x), m.w, m.b);
    EXPECT_EQ(amp::autocast_cache_size(), 2u);  // reused, not re-cast
    // Both uses share one cast node for w: one copy, one gradient path.
    ASSERT_NE(y1.grad_fn(), nullptr);
    EXPECT_EQ(y1.grad_fn()->next[1], y2.grad_fn()->next[1]);
    {
      amp::Autocast inner(half);
      ops::linear(x, m2.w);
      EXPECT_EQ(amp::autocast_cache_size(), 3u);
    }
    EXPECT_EQ(amp::autocast_cache_size(), 3u);  // inner exit keeps the outer's cache
    // Activations (non-leaves) and parameters under no_grad are not cached.
    ops::matmul(ops::affine(x, 2.0), ops::affine(m2.w, 1.0).t());
    {
      autograd::NoGradGuard ng;
      ops::linear(x, fresh);
    }
    EXPECT_EQ(amp::autocast_cache_size(), 3u);
  }
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
}

// cache_enabled=false (PyTorch's): each use of a parameter gets its own cast, nothing is cached,
// the gradient is the same up to where the two uses' gradients are summed, and an inner guard's
// setting ends with it. matmul, not linear: linear's bf16 weight gradient skips the cast node.
TEST_P(AutocastBoth, CacheDisabledCastsEveryUse) {
  const DType half = GetParam();
  Generator g(11);
  Tensor w = Tensor::randn({8, 6}, g, DType::f32, 0.3).set_requires_grad();
  Tensor x = Tensor::randn({4, 8}, g);
  EXPECT_TRUE(amp::is_autocast_cache_enabled());
  std::vector<float> grads[2];
  for (bool cache : {true, false}) {
    w.set_grad(Tensor());
    {
      amp::Autocast ac(half, /*enabled=*/true, /*cache_enabled=*/cache);
      EXPECT_EQ(amp::is_autocast_cache_enabled(), cache);
      Tensor y1 = ops::matmul(x, w);
      Tensor y2 = ops::matmul(ops::relu(x), w);
      ASSERT_EQ(y1.dtype(), half);
      EXPECT_EQ(amp::autocast_cache_size(), cache ? 1u : 0u);
      ASSERT_NE(y1.grad_fn(), nullptr);
      EXPECT_EQ(y1.grad_fn()->next[1] == y2.grad_fn()->next[1], cache);  // one cast node, or one per use
      ops::sum(ops::add(y1, y2)).backward();
    }
    ASSERT_EQ(w.grad().dtype(), DType::f32);
    grads[cache ? 0 : 1] = w.grad().to_vector();
  }
  EXPECT_TRUE(amp::is_autocast_cache_enabled());
  // The two differ only where the two uses' gradients meet: summed in 16 bits and rounded once
  // (u of the sum) with the cache, each widened and summed in f32 (one f32 rounding) without.
  const double u = half == DType::bf16 ? 0x1p-8 : 0x1p-11;
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_NEAR(grads[1][i], grads[0][i], (u + 0x1p-24) * std::fabs(grads[1][i]) + 1e-30) << i;

  amp::Autocast outer(half);
  const auto outer_cast = ops::matmul(x, w).grad_fn()->next[1];
  ASSERT_EQ(amp::autocast_cache_size(), 1u);
  {
    amp::Autocast inner(half, /*enabled=*/true, /*cache_enabled=*/false);
    EXPECT_NE(ops::matmul(x, w).grad_fn()->next[1], outer_cast);  // the outer's entry is not used...
    EXPECT_EQ(amp::autocast_cache_size(), 1u);                    // ...nor dropped
    amp::Autocast innermost(half);                                // caching again
    EXPECT_EQ(ops::matmul(x, w).grad_fn()->next[1], outer_cast);
  }
  EXPECT_TRUE(amp::is_autocast_cache_enabled());
  EXPECT_EQ(amp::autocast_cache_size(), 1u);
}

TEST_P(AutocastBoth, NestedDisabledGuardRunsInInputDtypes) {
  const DType half = GetParam();
  Generator g(6);
  Model m = make_model(g);
  Tensor x = Tensor::randn({3, 8}, g);
  amp::Autocast outer(half);
  {
    amp::Autocast off(false);
    EXPECT_FALSE(amp::is_autocast_enabled());
    EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), DType::f32);
    EXPECT_EQ(ops::softmax(x.to(half)).dtype(), half);
    {
      amp::Autocast on_again(half);
      EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), half);
    }
    EXPECT_EQ(ops::linear(x, m.w).dtype(), DType::f32);
  }
  EXPECT_TRUE(amp::is_autocast_enabled());
  EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), half);
}

// Gradient accumulation over micro-batches inside one autocast region: each backward runs
// through the cached cast once, and the next forward must still be differentiable.
TEST_P(AutocastBoth, TwoBackwardsInsideOneRegion) {
  const DType half = GetParam();
  Generator g(7);
  Model m = make_model(g);
  Tensor x = Tensor::randn({4, 8}, g);
  std::vector<float> first;
  {
    amp::Autocast ac(half);
    for (int step = 0; step < 2; ++step) {
      Tensor loss = ops::cross_entropy(ops::linear(x, m.w, m.b), targets(4, 6));
      ASSERT_NO_THROW(loss.backward()) << "step " << step;
      if (step == 0) first = m.w.grad().to_vector();
    }
    EXPECT_LE(amp::autocast_cache_size(), 2u);
  }
  const auto twice = m.w.grad().to_vector();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * first[i]) << i;
}

// linear's weight and bias gradients under autocast: with bf16 they are computed in f32 from
// the bf16 operands and sent straight to the f32 parameter (not rounded to bf16 on the way);
// with f16 they are stored in f16 first (f16's range is what loss scaling is about).
TEST_P(AutocastBoth, LinearParameterGradientPrecision) {
  const DType half = GetParam();
  Generator g(8);
  const int64_t batch = 64, in = 32, out = 16;
  Model m = make_model(g, in, out);
  const Tensor x = Tensor::randn({batch, in}, g);
  const Tensor c = Tensor::randn({batch, out}, g).to(half);  // dL/dy, exactly
  {
    amp::Autocast ac(half);
    ops::sum(ops::mul(ops::linear(x, m.w, m.b), c)).backward();
  }
  const std::vector<float> xv = x.to(half).to_vector(), cv = c.to_vector();
  const std::vector<float> gw = m.w.grad().to_vector(), gb = m.b.grad().to_vector();
  int64_t wider_than_half = 0;
  for (int64_t i = 0; i < out; ++i) {
    for (int64_t j = 0; j <= in; ++j) {  // j == in: the bias
      double want = 0, mag = 0;
      for (int64_t r = 0; r < batch; ++r) {
        const double p = double(cv[size_t(r * out + i)]) * (j < in ? double(xv[size_t(r * in + j)]) : 1.0);
        want += p;
        mag += std::fabs(p);
      }
      const float got = j < in ? gw[size_t(i * in + j)] : gb[size_t(i)];
      const float rounded = half == DType::bf16 ? bf16_to_f32(f32_to_bf16(got)) : f16_to_f32(f32_to_f16(got));
      wider_than_half += rounded != got;
      // f32 accumulation bound, plus half an ulp of the 16-bit store for f16
      const double tol = double(batch) * std::ldexp(1.0, -24) * mag +
                         (half == DType::f16 ? std::fabs(want) * std::ldexp(1.0, -11) : 0.0);
      EXPECT_NEAR(got, want, tol + 1e-30) << dtype_name(half) << " (" << i << ", " << j << ")";
    }
  }
  if (half == DType::bf16)
    EXPECT_GT(wider_than_half, out * in / 2) << "bf16 weight gradients look rounded to bf16";
  else
    EXPECT_EQ(wider_than_half, 0) << "f16 weight gradients must be f16 values";
}

// The same for conv2d, on both of oneDNN's backward-weights paths (one primitive on one thread;
// split over the batch on two). The expectation is the f64 convolution of the same 16-bit
// values; the f32-accumulation bound uses the f64 convolution of their absolute values.
TEST_P(AutocastBoth, ConvParameterGradientPrecision) {
  const DType half = GetParam();
  Generator g(10);
  const Tensor x = Tensor::randn({4, 3, 9, 9}, g);
  Tensor w = Tensor::randn({5, 3, 3, 3}, g, DType::f32, 0.3).set_requires_grad();
  Tensor b = Tensor::randn({5}, g, DType::f32, 0.1).set_requires_grad();
  const ops::Conv2dOptions o{.stride = 1, .padding = 1};
  const Tensor c = Tensor::randn({4, 5, 9, 9}, g).to(half);  // dL/dy, exactly
  // f64 oracle on the 16-bit values: the gradient, and the same with |x| and |c| for the bound.
  auto f64_grads = [&](bool absolute) {
    auto prep = [&](const Tensor& t) {
      std::vector<double> v = t.detach().to(half).to_vector_f64();
      if (absolute)
        for (double& e : v) e = std::fabs(e);
      return Tensor::from_vector(v, t.shape());
    };
    Tensor w64 = prep(w).set_requires_grad(), b64 = b.detach().to(half).to(DType::f64).set_requires_grad();
    ops::sum(ops::mul(ops::conv2d(prep(x), w64, b64, o), prep(c))).backward();
    return std::make_pair(w64.grad().to_vector_f64(), b64.grad().to_vector_f64());
  };
  const auto [want_w, want_b] = f64_grads(false);
  const auto [mag_w, mag_b] = f64_grads(true);
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    {
      amp::Autocast ac(half);
      ops::sum(ops::mul(ops::conv2d(x, w, b, o), c)).backward();
    }
    ASSERT_EQ(w.grad().dtype(), DType::f32);
    const std::vector<float> gw = w.grad().to_vector(), gb = b.grad().to_vector();
    int64_t wider_than_half = 0;
    const double terms = 4 * 9 * 9 * 3;  // products summed per weight (at most)
    for (size_t i = 0; i < gw.size(); ++i) {
      const float rounded = half == DType::bf16 ? bf16_to_f32(f32_to_bf16(gw[i])) : f16_to_f32(f32_to_f16(gw[i]));
      wider_than_half += rounded != gw[i];
      const double tol = terms * std::ldexp(1.0, -24) * mag_w[i] +
                         (half == DType::f16 ? std::fabs(want_w[i]) * std::ldexp(1.0, -11) : 0.0) + 1e-30;
      EXPECT_NEAR(gw[i], want_w[i], tol) << dtype_name(half) << " threads " << threads << " weight " << i;
    }
    for (size_t i = 0; i < gb.size(); ++i) {
      const double tol = terms * std::ldexp(1.0, -24) * mag_b[i] +
                         (half == DType::f16 ? std::fabs(want_b[i]) * std::ldexp(1.0, -11) : 0.0) + 1e-30;
      EXPECT_NEAR(gb[i], want_b[i], tol) << dtype_name(half) << " threads " << threads << " bias " << i;
    }
    if (half == DType::bf16)
      EXPECT_GT(wider_than_half, int64_t(gw.size()) / 2) << "threads " << threads << ": rounded to bf16";
    else
      EXPECT_EQ(wider_than_half, 0) << "threads " << threads << ": f16 weight gradients must be f16 values";
  }
  omp_set_num_threads(threads_before);
}

// The cached 16-bit copy of a parameter is re-made after an in-place write to the parameter
// (an optimizer step) inside the same autocast region.
TEST_P(AutocastBoth, WeightCastCacheSeesAnOptimizerStep) {
  const DType half = GetParam();
  Generator g(9);
  Model m = make_model(g);
  const Tensor x = Tensor::randn({3, 8}, g);
  amp::Autocast ac(half);
  const std::vector<float> before = ops::linear(x, m.w).to_vector();
  m.w.set_grad(Tensor::full(m.w.shape(), 1.0f));
  optim::SGD({m.w}, {.lr = 0.5, .momentum = 0.0}).step();
  const std::vector<float> after = ops::linear(x, m.w).to_vector();
  std::vector<float> want;
  {
    amp::Autocast fresh(half);  // nested: same cache, so compute the expectation without autocast
    amp::Autocast off(false);
    want = ops::linear(x.to(half), m.w.detach().to(half)).to_vector();
  }
  EXPECT_NE(after, before);
  EXPECT_EQ(after, want);
}

INSTANTIATE_TEST_SUITE_P(Amp, AutocastBoth, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

TEST(Autocast, OffByDefaultAndOutsideTheGuard) {
  Generator g(8);
  Model m = make_model(g);
  Tensor x = Tensor::randn({3, 8}, g);
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), DType::f32);
  {
    amp::Autocast ac;
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);  // the CPU default, as PyTorch
    EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), DType::bf16);
  }
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(ops::linear(x, m.w, m.b).dtype(), DType::f32);
  EXPECT_EQ(ops::softmax(x.to(DType::bf16)).dtype(), DType::bf16);  // no upcast without autocast
}

TEST(Autocast, RejectsANonHalfDtype) {
  EXPECT_THROW(amp::Autocast(DType::f32), Error);
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_NO_THROW(amp::Autocast(DType::f32, /*enabled=*/false));
}

TEST(Autocast, TraceListsOpsWithTheirRunDtypes) {
  Generator g(9);
  Model m = make_model(g);
  Tensor x = Tensor::randn({3, 8}, g);
  amp::start_trace();
  {
    amp::Autocast ac(DType::bf16);
    Tensor h = ops::relu(ops::linear(x, m.w, m.b));  // linear f32,f32,f32 -> bf16; relu bf16
    Tensor p = ops::softmax(h);                      // bf16 -> f32
    Tensor s = ops::add(h, p);                       // bf16,f32 -> f32
    ops::linear(x, m.w);                             // a second, distinct signature
    ops::relu(ops::linear(x, m.w, m.b));             // duplicates are listed once
  }
  const std::vector<amp::TraceEntry> t = amp::stop_trace();
  auto has = [&](const char* op, const char* in, const char* run) {
    return std::any_of(t.begin(), t.end(), [&](const amp::TraceEntry& e) {
      return e.op == op && e.input_dtypes == in && e.run_dtype == run;
    });
  };
  EXPECT_TRUE(has("linear", "f32,f32,f32", "bf16"));
  EXPECT_TRUE(has("linear", "f32,f32", "bf16"));
  EXPECT_TRUE(has("relu", "bf16", "bf16"));
  EXPECT_TRUE(has("softmax", "bf16", "f32"));
  EXPECT_TRUE(has("add", "bf16,f32", "f32"));
  EXPECT_EQ(t.size(), 5u);
  // Stopped: nothing more is recorded.
  {
    amp::Autocast ac(DType::bf16);
    ops::linear(x, m.w);
  }
  EXPECT_TRUE(amp::stop_trace().empty());
}

}  // namespace
}  // namespace mixprec
