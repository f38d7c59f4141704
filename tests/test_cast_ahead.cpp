// Cast-ahead (src/autocast/autocast_state.h): autocast's 16-bit copy of an f32 parameter kept as
// its shadow and written by the optimizer's fused step. Training with it gives the bits of
// casting every step; the shadow is what the step wrote and what the next forward reads; a write
// to the parameter from anywhere else, or a step the scaler skips, leaves no stale copy in use.
// On by default for GPU parameters only: here forced on (and off) on the CPU.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autocast/autocast_state.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/device.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using testutil::bytes_of;

struct Mlp {
  Tensor w1, b1, w2, b2;  // f32 leaves
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
};
Mlp make_mlp(uint64_t seed, const Device& d = Device::cpu()) {
  Generator g(seed);
  const auto param = [&](const Shape& shape, double std) {
    return Tensor::randn(shape, g, DType::f32, std).to(d).set_requires_grad();
  };
  return {param({32, 16}, 0.3), param({32}, 0.1), param({6, 32}, 0.3), param({6}, 0.1)};
}
Tensor batch(uint64_t seed, const Device& d = Device::cpu()) {
  Generator g(seed);
  return Tensor::randn({24, 16}, g).to(d);
}
Tensor labels(const Device& d) {
  std::vector<int64_t> t(24);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int64_t(i % 6);
  return Tensor::from_vector(t, {24}).to(d);
}

// The loss of one forward in its own autocast region (as a training step makes one).
Tensor loss_of(const Mlp& m, const Tensor& x, DType half) {
  amp::Autocast ac(x.device().type, half);
  const Tensor h = ops::relu(ops::linear(x, m.w1, m.b1));
  return ops::cross_entropy(ops::linear(h, m.w2, m.b2), labels(x.device()));
}

// The shadow holds the parameter's current values as `half`, bit for bit.
::testing::AssertionResult shadow_is_current(const Tensor& p, DType half) {
  const detail::TensorImpl& impl = *p.impl();
  if (!impl.shadow) return ::testing::AssertionFailure() << "no shadow";
  if (impl.shadow_version != p.version()) return ::testing::AssertionFailure() << "shadow of an older version";
  if (bytes_of(Tensor(impl.shadow)) != bytes_of(p.detach().to(half)))
    return ::testing::AssertionFailure() << "shadow bytes differ from the parameter cast";
  return ::testing::AssertionSuccess();
}

struct Trained {
  std::vector<std::vector<uint8_t>> losses, params;
};

// Six steps of the optimizer `kind` (AdamW, or SGD with momentum); f16 through a GradScaler.
// `ahead`: cast-ahead forced on or off, or the device's default.
Trained train(std::optional<bool> ahead, DType half, const std::string& kind, const Device& d = Device::cpu()) {
  std::optional<amp::ahead::Override> mode;
  if (ahead) mode.emplace(*ahead);
  const bool on = amp::ahead::enabled(d);
  Mlp m = make_mlp(3, d);
  std::unique_ptr<optim::Optimizer> opt;
  if (kind == "adamw")
    opt = std::make_unique<optim::AdamW>(m.params(), optim::AdamWOptions{.lr = 0.01});
  else
    opt = std::make_unique<optim::SGD>(m.params(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  amp::GradScaler scaler(amp::GradScalerOptions{.init_scale = 1024.0, .enabled = half == DType::f16});
  Trained r;
  for (uint64_t step = 0; step < 6; ++step) {
    opt->zero_grad();
    const Tensor loss = loss_of(m, batch(100 + step, d), half);
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
    r.losses.push_back(bytes_of(loss));
    for (const Tensor& p : {m.w1, m.w2})
      EXPECT_EQ(shadow_is_current(p, half), on) << "after step " << step << (on ? ": no current shadow" : ": a shadow");
  }
  for (const Tensor& p : m.params()) r.params.push_back(bytes_of(p));
  return r;
}

class CastAhead : public ::testing::TestWithParam<DType> {};

TEST_P(CastAhead, TrainingGivesTheBitsOfCastingEveryStep) {
  for (const std::string kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    const Trained cast = train(false, GetParam(), kind), kept = train(true, GetParam(), kind);
    EXPECT_EQ(kept.losses, cast.losses);
    EXPECT_EQ(kept.params, cast.params);
  }
}

// Off (the CPU's default): no shadow is kept.
TEST_P(CastAhead, OffKeepsNoShadow) {
  const amp::ahead::Override mode(false);
  const Mlp m = make_mlp(4);
  (void)loss_of(m, batch(1), GetParam());
  EXPECT_FALSE(m.w1.impl()->shadow);
}

// The next region reads the shadow the step wrote: no new storage for the weight's copy.
TEST_P(CastAhead, TheNextForwardReadsTheShadow) {
  const DType half = GetParam();
  const amp::ahead::Override mode(true);
  Mlp m = make_mlp(5);
  optim::SGD opt(m.params(), {.lr = 0.1});
  loss_of(m, batch(2), half).backward();
  ASSERT_TRUE(m.w1.impl()->shadow);
  const auto storage = m.w1.impl()->shadow->storage;
  opt.step();
  EXPECT_TRUE(shadow_is_current(m.w1, half));
  {
    amp::Autocast ac(half);
    (void)ops::linear(batch(3), m.w1);
  }
  ASSERT_TRUE(m.w1.impl()->shadow);
  EXPECT_EQ(m.w1.impl()->shadow->storage, storage) << "the shadow was replaced instead of read";
}

// A write to the parameter outside the optimizer (here copy_) moves its version: the next forward
// casts the new values instead of reading the old copy.
TEST_P(CastAhead, AWriteElsewhereIsSeen) {
  const DType half = GetParam();
  const amp::ahead::Override mode(true);
  Mlp m = make_mlp(6);
  optim::SGD opt(m.params(), {.lr = 0.1});
  loss_of(m, batch(4), half).backward();
  opt.step();
  ASSERT_TRUE(shadow_is_current(m.w1, half));
  {
    const autograd::NoGradGuard no_grad;
    Tensor w = m.w1;
    w.copy_(Tensor::full(m.w1.shape(), 0.25f));
  }
  EXPECT_FALSE(shadow_is_current(m.w1, half));
  const Tensor x = batch(5);
  std::vector<uint8_t> want;
  {
    const amp::ahead::Override off(false);
    amp::Autocast ac(half);
    want = bytes_of(ops::linear(x, m.w1));
  }
  amp::Autocast ac(half);
  EXPECT_EQ(bytes_of(ops::linear(x, m.w1)), want);
  EXPECT_TRUE(shadow_is_current(m.w1, half)) << "the new cast becomes the shadow";
}

// A module moved or converted in place (Module::to: new storage, same handle) drops its
// parameters' copies with the old storage, rather than holding them until the parameter dies.
TEST(CastAheadModule, ToDropsTheShadows) {
  const amp::ahead::Override mode(true);
  nn::Linear lin(16, 8);
  {
    amp::Autocast ac(DType::bf16);
    (void)lin(batch(8));
  }
  ASSERT_TRUE(lin.weight.impl()->shadow);
  lin.to(Device::fenced());
  EXPECT_FALSE(lin.weight.impl()->shadow);
  EXPECT_FALSE(lin.bias.impl()->shadow);
}

// A step the scaler skips (an inf gradient) writes neither the parameter nor its copy: the copy
// stays current and is read by the next forward.
TEST(CastAheadF16, ASkippedStepLeavesTheShadowCurrent) {
  const amp::ahead::Override mode(true);
  Mlp m = make_mlp(7);
  optim::SGD opt(m.params(), {.lr = 0.1});
  amp::GradScaler scaler(amp::GradScalerOptions{.init_scale = 1024.0});
  scaler.scale(loss_of(m, batch(6), DType::f16)).backward();
  Tensor g = m.w2.grad();
  g.fill_(std::numeric_limits<float>::infinity());
  const std::vector<uint8_t> before = bytes_of(m.w1);
  scaler.step(opt);
  scaler.update();
  ASSERT_TRUE(scaler.found_inf(opt));
  EXPECT_EQ(bytes_of(m.w1), before);
  EXPECT_TRUE(shadow_is_current(m.w1, DType::f16));
}

// On a GPU, where it is on by default: the bits of casting every step, shadows kept.
TEST(CastAheadGpu, OnByDefaultWithTheBitsOfCastingEveryStep) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU (" << cuda::unavailable_reason() << ")";
  const Device gpu = Device::cuda(0);
  ASSERT_TRUE(amp::ahead::enabled(gpu));
  for (DType half : {DType::bf16, DType::f16})
    for (const std::string kind : {"adamw", "sgd"}) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " " + kind);
      const Trained cast = train(false, half, kind, gpu), kept = train(std::nullopt, half, kind, gpu);
      EXPECT_EQ(kept.losses, cast.losses);
      EXPECT_EQ(kept.params, cast.params);
    }
}

INSTANTIATE_TEST_SUITE_P(Amp, CastAhead, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace mixprec
