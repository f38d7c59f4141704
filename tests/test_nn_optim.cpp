// nn modules (PyTorch names, initialisation bounds, train/eval, state_dict) and the optimizer
// update rules against PyTorch's formulas written out independently here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/optim.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "tensor_bytes.h"

using namespace mixprec;
using mixprec::testutil::bytes_of;

TEST(Nn, SequentialNamesMatchPyTorch) {
  auto m = nn::Sequential(nn::Flatten(), nn::Linear(784, 32), nn::ReLU(), nn::Linear(32, 10));
  const auto sd = m.state_dict();
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd[0].first, "1.weight");
  EXPECT_EQ(sd[1].first, "1.bias");
  EXPECT_EQ(sd[2].first, "3.weight");
  EXPECT_EQ(sd[3].first, "3.bias");
  EXPECT_EQ(sd[0].second.shape(), Shape({32, 784}));  // [out, in], as PyTorch stores it
  EXPECT_EQ(m.num_parameters(), 784 * 32 + 32 + 32 * 10 + 10);
}

TEST(Nn, LinearInitWithinKaimingBound) {
  default_generator().manual_seed(3);
  nn::Linear l(400, 50);
  const double bound = 1.0 / std::sqrt(400.0);
  double mx = 0, sum = 0;
  for (float v : l.weight.to_vector()) {
    mx = std::max(mx, double(std::fabs(v)));
    sum += v;
  }
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.95 * bound);  // uniform over the whole range, not a narrower one
  EXPECT_NEAR(sum / 20000.0, 0.0, 0.01 * bound * 10);
  for (float v : l.bias.to_vector()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_TRUE(l.weight.requires_grad());
  EXPECT_EQ(l.weight.storage()->category(), MemCategory::parameters);
}

TEST(Nn, DropoutFollowsTrainEval) {
  auto m = nn::Sequential(nn::Dropout(0.5));
  Tensor x = Tensor::ones({1000});
  auto y = m(x).to_vector();
  int zeros = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.f || v == 2.f);
    zeros += v == 0.f;
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  m.eval();
  EXPECT_FALSE(m[0].is_training());
  for (float v : m(x).to_vector()) EXPECT_EQ(v, 1.f);
}

// Sequential runs Linear+ReLU as one matmul with a ReLU post-op. Values and gradients must be
// exactly those of linear then relu (rounding commutes with relu), whether the incoming gradient
// is the engine's own (masked in place) or one the caller still holds (left untouched).
TEST(Nn, SequentialLinearReluEqualsTheUnfusedPair) {
  for (DType t : {DType::f32, DType::bf16}) {
    default_generator().manual_seed(5);
    nn::Sequential m(nn::Linear(6, 8), nn::ReLU());
    auto& lin = dynamic_cast<nn::Linear&>(m[0]);
    Generator g(6);
    Tensor x = Tensor::randn({5, 6}, g).detach().set_requires_grad();
    const Tensor w2 = Tensor::randn({3, 8}, g);
    for (bool caller_holds_grad : {false, true}) {
      auto run = [&](bool fused) {
        lin.weight.set_grad(Tensor());
        lin.bias.set_grad(Tensor());
        x.set_grad(Tensor());
        Tensor y, gy;
        {
          amp::Autocast ac(DType::bf16, t == DType::bf16);
          y = fused ? m(x) : ops::relu(ops::linear(x, lin.weight, lin.bias));
        }
        if (caller_holds_grad) {
          gy = Tensor::randn(y.shape(), g).to(y.dtype());
          const std::vector<float> before = gy.to_vector();
          y.backward(gy);
          EXPECT_EQ(gy.to_vector(), before) << "the caller's gradient was written";
        } else {
          ops::sum(ops::linear(y.to(DType::f32), w2)).backward();  // a gradient only the engine holds
        }
        return std::vector<std::vector<float>>{y.to_vector(), x.grad().to_vector(), lin.weight.grad().to_vector(),
                                               lin.bias.grad().to_vector()};
      };
      Generator g_saved = g;
      const auto fused = run(true);
      g = g_saved;  // the same random gradient for the unfused run
      const auto plain = run(false);
      for (size_t i = 0; i < fused.size(); ++i)
        EXPECT_EQ(fused[i], plain[i]) << dtype_name(t) << " output " << i << " caller_holds_grad " << caller_holds_grad;
    }
  }
}

// Sequential runs ReLU then MaxPool2d as MaxPool2d then ReLU (src/nn/module.cpp): outputs and every
// gradient bit for bit those of the modules in their order, after a convolution (which then runs
// without its fused ReLU) and after a batch norm, in f32 and under bf16 autocast; the pools' windows
// hold only negatives in places (the ReLU's zeros tie), ties, -0 and NaN. And the step keeps less:
// the full-size activation before the pool is not held for the backward.
TEST(Nn, SequentialReluThenMaxPoolEqualsTheModulesInTheirOrder) {
  for (DType t : {DType::f32, DType::bf16})
    for (bool with_bn : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (with_bn ? " conv, bn" : " conv"));
      default_generator().manual_seed(7);
      nn::Sequential m;
      m.push_back(std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}));
      if (with_bn) m.push_back(std::make_shared<nn::BatchNorm2d>(4));
      m.push_back(std::make_shared<nn::ReLU>());
      m.push_back(std::make_shared<nn::MaxPool2d>(2));
      Generator g(8);
      std::vector<float> xv = Tensor::randn({3, 2, 8, 6}, g).to_vector();
      for (size_t i = 0; i < xv.size(); i += 37) xv[i] = i % 2 ? -0.f : 2.f;  // ties, -0
      xv[5] = NAN;
      Tensor x = Tensor::from_vector(xv, {3, 2, 8, 6}).detach().set_requires_grad();
      const Tensor gy = Tensor::randn({3, 4, 4, 3}, g);
      const auto run = [&](bool reordered) {
        for (Tensor& p : m.parameters()) p.set_grad(Tensor());
        x.set_grad(Tensor());
        Tensor y;
        int64_t kept = 0;
        {
          amp::Autocast ac(DType::bf16, t == DType::bf16);
          const int64_t before = allocator::stats().live_total;
          if (reordered) {
            y = m(x);
          } else {
            Tensor h = m[0](x);
            if (with_bn) h = m[1](h);
            y = ops::max_pool2d(ops::relu(h), 2);
          }
          kept = allocator::stats().live_total - before;
        }
        y.backward(gy.to(y.dtype()));
        std::vector<std::vector<uint8_t>> out{bytes_of(y), bytes_of(x.grad())};
        for (const Tensor& p : m.parameters()) out.push_back(bytes_of(p.grad()));
        return std::pair{out, kept};
      };
      (void)run(false);  // a warm-up: what the first call keeps for good (oneDNN's primitives) is not the step's
      const auto [reordered, kept_reordered] = run(true);
      const auto [plain, kept_plain] = run(false);
      ASSERT_EQ(reordered.size(), plain.size());
      for (size_t i = 0; i < reordered.size(); ++i) EXPECT_EQ(reordered[i], plain[i]) << "tensor " << i;
      // The 4 x 8 x 6 activation of each sample before the pool, in t: the plain order keeps it.
      EXPECT_LT(kept_reordered, kept_plain - 3 * 4 * 8 * 6 * int64_t(dtype_size(t)) / 2);
    }
}

TEST(Nn, LoadStateDictStrict) {
  auto a = nn::Sequential(nn::Linear(3, 2));
  auto b = nn::Sequential(nn::Linear(3, 2));
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(a.state_dict()[0].second.to_vector(), b.state_dict()[0].second.to_vector());
  auto c = nn::Sequential(nn::Linear(3, 4));
  EXPECT_THROW(c.load_state_dict(a.state_dict()), Error);
  nn::NamedTensors missing = {a.state_dict()[0]};
  EXPECT_THROW(b.load_state_dict(missing), Error);
  nn::NamedTensors extra = a.state_dict();
  extra.emplace_back("9.weight", Tensor::zeros({1}));
  EXPECT_THROW(b.load_state_dict(extra), Error);
}

namespace {
// One parameter with a fixed gradient per step.
struct Fixture {
  Tensor p = Tensor::from_vector(std::vector<float>{0.5f, -1.5f, 2.0f, 0.0f}, {4}).set_requires_grad();
  std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f, 0.0f}, {-0.4f, 0.5f, 0.1f, 1.0f}, {0.2f, 0.2f, -0.3f, -1.0f}};
  void set_grad(int step) { p.set_grad(Tensor::from_vector(grads[size_t(step)], {4})); }
};
}  // namespace

TEST(Optim, SgdMomentumNesterovWeightDecayMatchesPyTorchRule) {
  for (bool nesterov : {false, true}) {
    Fixture f;
    optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01, .nesterov = nesterov};
    optim::SGD opt({f.p}, o);
    std::vector<double> p = {0.5, -1.5, 2.0, 0.0}, buf(4, 0.0);
    for (int s = 0; s < 3; ++s) {
      f.set_grad(s);
      opt.step();
      for (size_t j = 0; j < 4; ++j) {
        double d = f.grads[size_t(s)][j] + 0.01 * p[j];
        buf[j] = s == 0 ? d : 0.9 * buf[j] + d;
        d = nesterov ? d + 0.9 * buf[j] : buf[j];
        p[j] -= 0.1 * d;
      }
      const auto got = f.p.to_vector();
      for (size_t j = 0; j < 4; ++j) EXPECT_NEAR(got[j], p[j], 1e-6) << "step " << s << " nesterov " << nesterov;
    }
  }
}

TEST(Optim, AdamWMatchesPyTorchRule) {
  Fixture f;
  optim::AdamW opt({f.p}, {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  std::vector<double> p = {0.5, -1.5, 2.0, 0.0}, m(4, 0.0), v(4, 0.0);
  for (int s = 0; s < 3; ++s) {
    f.set_grad(s);
    opt.step();
    const double t = s + 1;
    for (size_t j = 0; j < 4; ++j) {
      const double g = f.grads[size_t(s)][j];
      p[j] *= 1 - 0.01 * 0.1;
      m[j] = 0.9 * m[j] + 0.1 * g;
      v[j] = 0.999 * v[j] + 0.001 * g * g;
      const double mhat = m[j] / (1 - std::pow(0.9, t)), vhat = v[j] / (1 - std::pow(0.999, t));
      p[j] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    }
    const auto got = f.p.to_vector();
    for (size_t j = 0; j < 4; ++j) EXPECT_NEAR(got[j], p[j], 1e-6) << "step " << s;
  }
}

// The f32 update runs 16 lanes at a time (AVX-512) with a scalar tail, over blocks of the
// parameter; every element must get exactly what the scalar f32 rule gives it.
TEST(Optim, AdamWF32UpdateIsBitIdenticalToTheScalarRule) {
  const int64_t n = 2 * 2048 + 37;  // two full blocks and a partial one with a tail
  Generator gen(11);
  Tensor p = Tensor::uniform({n}, gen, -2, 2).set_requires_grad();
  std::vector<float> w = p.to_vector(), m(size_t(n), 0.f), v(size_t(n), 0.f);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
  optim::AdamW opt({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  for (int s = 1; s <= 3; ++s) {
    const Tensor g = Tensor::uniform({n}, gen, -1, 1);
    p.set_grad(g);
    opt.step();
    const std::vector<float> gv = g.to_vector();
    const float decay = float(1 - lr * wd), fb1 = float(b1), fb2 = float(b2), step = float(lr / (1 - std::pow(b1, s))),
                bc2 = float(1 / std::sqrt(1 - std::pow(b2, s))), feps = float(eps);
    for (size_t j = 0; j < size_t(n); ++j) {
      m[j] = fb1 * m[j] + (1.0f - fb1) * gv[j];
      v[j] = fb2 * v[j] + (1.0f - fb2) * gv[j] * gv[j];
      const float denom = std::sqrt(v[j]) * bc2 + feps;
      w[j] = w[j] * decay - step * m[j] / denom;
    }
    const std::vector<float> got = p.to_vector();
    int64_t differ = 0;
    for (size_t j = 0; j < size_t(n); ++j) differ += std::memcmp(&got[j], &w[j], 4) != 0;
    EXPECT_EQ(differ, 0) << "step " << s;
  }
}

// The same for SGD: with and without momentum, nesterov, the first step (which copies d into
// the momentum buffer) and later ones.
TEST(Optim, SgdF32UpdateIsBitIdenticalToTheScalarRule) {
  const int64_t n = 2 * 2048 + 37;
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true}) {
      if (nesterov && momentum == 0) continue;
      Generator gen(12);
      Tensor p = Tensor::uniform({n}, gen, -2, 2).set_requires_grad();
      std::vector<float> w = p.to_vector(), buf(size_t(n), 0.f);
      const double lr = 0.05, wd = 0.01, damp = 0.1;
      optim::SGD opt({p}, {.lr = lr,
                           .momentum = momentum,
                           .dampening = nesterov ? 0.0 : damp,
                           .weight_decay = wd,
                           .nesterov = nesterov});
      const float flr = float(lr), fwd = float(wd), fmom = float(momentum), fdamp = float(1 - (nesterov ? 0.0 : damp));
      for (int s = 0; s < 3; ++s) {
        const Tensor g = Tensor::uniform({n}, gen, -1, 1);
        p.set_grad(g);
        opt.step();
        const std::vector<float> gv = g.to_vector();
        for (size_t j = 0; j < size_t(n); ++j) {
          float d = gv[j] + fwd * w[j];
          if (momentum != 0) {
            buf[j] = s == 0 ? d : fmom * buf[j] + fdamp * d;
            d = nesterov ? d + fmom * buf[j] : buf[j];
          }
          w[j] -= flr * d;
        }
        const std::vector<float> got = p.to_vector();
        int64_t differ = 0;
        for (size_t j = 0; j < size_t(n); ++j) differ += std::memcmp(&got[j], &w[j], 4) != 0;
        EXPECT_EQ(differ, 0) << "momentum " << momentum << " nesterov " << nesterov << " step " << s;
      }
    }
}

TEST(Optim, SkipsParamsWithoutGradAndZeroGrad) {
  Fixture f;
  optim::SGD opt({f.p}, {.lr = 1.0});
  opt.step();  // no grad yet: nothing changes
  EXPECT_EQ(f.p.to_vector(), (std::vector<float>{0.5f, -1.5f, 2.0f, 0.0f}));
  f.set_grad(0);
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(f.p.grad().to_vector(), std::vector<float>(4, 0.f));
  opt.zero_grad();
  EXPECT_FALSE(f.p.grad().defined());
}

TEST(Optim, RejectsBadOptions) {
  Fixture f;
  EXPECT_THROW(optim::SGD({f.p}, {.lr = -1.0}), Error);
  EXPECT_THROW(optim::AdamW({f.p}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::SGD({f.p}, {.lr = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::SGD(std::vector<Tensor>{}, {}), Error);
  Tensor not_leaf = ops::affine(f.p, 2.0);
  EXPECT_THROW(optim::SGD({not_leaf}, {}), Error);
}

TEST(Optim, StateIsCountedAsOptimizerState) {
  Fixture f;
  const int64_t before = allocator::stats().live_bytes[size_t(MemCategory::optimizer_state)];
  optim::AdamW opt({f.p});
  f.set_grad(0);
  opt.step();
  const int64_t after = allocator::stats().live_bytes[size_t(MemCategory::optimizer_state)];
  EXPECT_GE(after - before, 2 * 4 * 4);  // exp_avg and exp_avg_sq, 4 floats each
}

// The CPU's gradient norm and clipping against the reference kernels: bit for bit in every
// floating dtype, norm 2 and inf, one block and many (the parallel path), a ragged last block,
// an inf and a NaN.
TEST(Optim, GradNormAndClipFastAreTheReferenceBitForBit) {
  Generator g(31);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<Tensor> grads;
    for (int64_t n : {int64_t(5), kernels::kNormBlock * 9 + 77, int64_t(3000)})
      grads.push_back(ops::affine(Tensor::randn({n}, g), 3.0).to(t));
    for (double p : {2.0, double(INFINITY)}) {
      Tensor fast;
      ASSERT_TRUE(kernels::cpu::grad_norm(grads, p, fast));
      const Tensor ref = kernels::ref::grad_norm(grads, p);
      EXPECT_EQ(bytes_of(fast), bytes_of(ref)) << "norm " << p << ": " << fast.item() << " vs " << ref.item();
    }
    // Clipping by a factor below 1 (and at 1: nothing written), both kernels on copies.
    for (double max_norm : {0.5, 1e9}) {
      std::vector<Tensor> a, b;
      for (const Tensor& x : grads) a.push_back(x.clone()), b.push_back(x.clone());
      const Tensor total = kernels::ref::grad_norm(grads, 2.0);
      ASSERT_TRUE(kernels::cpu::clip_by_norm(a, total, max_norm));
      kernels::ref::clip_by_norm(b, total, max_norm);
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(bytes_of(a[i]), bytes_of(b[i])) << "max_norm " << max_norm << ", grad " << i;
    }
  }
  // Non-finite values: NaN propagates through both norms, inf gives inf, identically.
  for (float bad : {float(INFINITY), float(NAN)}) {
    std::vector<float> v(size_t(kernels::kNormBlock) * 2, 0.5f);
    v[4097] = bad;
    const std::vector<Tensor> grads = {Tensor::from_vector(v, {int64_t(v.size())})};
    for (double p : {2.0, double(INFINITY)}) {
      Tensor fast;
      ASSERT_TRUE(kernels::cpu::grad_norm(grads, p, fast));
      const double f = fast.item(), r = kernels::ref::grad_norm(grads, p).item();
      EXPECT_TRUE((std::isnan(f) && std::isnan(r)) || f == r) << bad << " norm " << p << ": " << f << " vs " << r;
    }
  }
  // Not handled (a strided view): false, for the reference to take.
  const Tensor m = Tensor::randn({4, 6}, g);
  Tensor out;
  EXPECT_FALSE(kernels::cpu::grad_norm({m.transpose(0, 1)}, 2.0, out));
  EXPECT_FALSE(kernels::cpu::grad_norm({m}, 3.0, out));
}
