// GradScaler against PyTorch's rules written out again here: scripted sequences of finite and
// inf/NaN steps, skipped steps that leave parameters and optimizer state bit-identical, the
// call-order errors, hysteresis/bounds, and state_dict round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "amp/scaler_detail.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "tensor_bytes.h"

using namespace mixprec;
using testutil::bytes_of;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// PyTorch's _amp_update_scale_ (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp), written
// independently of the library: the scale is an f32, the factors doubles.
struct RefScaler {
  float scale;
  int64_t tracker = 0;
  double growth, backoff;
  int64_t interval;
  void update(bool found_inf) {
    if (found_inf) {
      scale = static_cast<float>(scale * backoff);
      tracker = 0;
      return;
    }
    if (tracker + 1 == interval) {
      const float grown = static_cast<float>(scale * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    } else {
      ++tracker;
    }
  }
};

// A small regression whose loss and gradients are finite; an optional inf is injected into
// one gradient after backward (what an fp16 overflow looks like to the scaler).
struct Rig {
  Tensor w1 = Tensor::from_vector(std::vector<float>{0.5f, -0.25f, 0.125f, 1.0f}, {2, 2}).set_requires_grad();
  Tensor w2 = Tensor::from_vector(std::vector<float>{0.3f, -0.7f}, {2}).set_requires_grad();
  Tensor x = Tensor::from_vector(std::vector<float>{1.0f, 2.0f, -1.0f, 0.5f, 0.25f, -2.0f}, {3, 2});

  Tensor loss() const { return ops::mean(ops::mul(ops::matmul(x, w1), w2)); }
  // scale(loss).backward(), then poison w2's gradient when asked.
  void backward(amp::GradScaler& s, double poison = 0.0) const {
    s.scale(loss()).backward();
    if (poison != 0.0) {
      std::vector<float> g = w2.grad().to_vector();
      g[1] = float(poison);
      w2.grad().copy_(Tensor::from_vector(g, {2}));
    }
  }
  std::vector<Tensor> params() const { return {w1, w2}; }
};

// Every byte of every parameter and every optimizer state tensor.
std::vector<std::vector<uint8_t>> snapshot(const optim::Optimizer& opt) {
  std::vector<std::vector<uint8_t>> out;
  for (const Tensor& p : opt.params()) out.push_back(bytes_of(p));
  for (const auto& [k, t] : opt.state_dict()) out.push_back(bytes_of(t));
  return out;
}

void expect_throw_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(GradScaler, DefaultsArePyTorchs) {
  amp::GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().hysteresis, 1);
  EXPECT_TRUE(s.is_enabled());
}

TEST(GradScaler, ScriptedSequenceFollowsTheUpdateRule) {
  // Growth every 3 finite steps; 'x' = an inf step, 'n' = a NaN step, '.' = finite.
  const std::string script = "...x..x.....nx......x.x...xxx.........";
  amp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  amp::GradScaler s(o);
  RefScaler ref{1024.0f, 0, 2.0, 0.5, 3};
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.1, .momentum = 0.9});
  int64_t skipped = 0;
  for (size_t i = 0; i < script.size(); ++i) {
    opt.zero_grad();
    const char c = script[i];
    rig.backward(s, c == 'x' ? kInf : c == 'n' ? std::nan("") : 0.0);
    s.step(opt);
    EXPECT_EQ(s.stepped(opt), c == '.') << "step " << i;
    skipped += c != '.';
    s.update();
    ref.update(c != '.');
    ASSERT_EQ(float(s.get_scale()), ref.scale) << "after step " << i;
    ASSERT_EQ(s.growth_tracker(), ref.tracker) << "after step " << i;
  }
  EXPECT_EQ(s.num_skipped_steps(), skipped);
  EXPECT_EQ(s.num_overflows(), skipped);
  EXPECT_EQ(s.num_updates(), int64_t(script.size()));
  EXPECT_EQ(opt.steps(), int64_t(script.size()) - skipped);
}

TEST(GradScaler, GrowthThatOverflowsF32KeepsTheScale) {
  amp::GradScalerOptions o;
  o.init_scale = 3.0e38;  // doubling gives inf in f32: PyTorch keeps the old scale
  o.growth_interval = 1;
  amp::GradScaler s(o);
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.0});
  rig.backward(s);
  s.step(opt);
  s.update();
  EXPECT_EQ(float(s.get_scale()), 3.0e38f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, InfStepLeavesEverythingBitIdenticalAndHalvesTheScale) {
  for (const std::string kind : {"sgd", "adamw", "adamw-f16-master", "sgd-bf16-sr"}) {
    SCOPED_TRACE(kind);
    Rig rig;
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == "adamw-f16-master" || kind == "sgd-bf16-sr") {
      // 16-bit parameters: the f32 master (or the stochastic-rounding stream) must not move either.
      const DType t = kind == "adamw-f16-master" ? DType::f16 : DType::bf16;
      rig.w1 = rig.w1.detach().to(t).set_requires_grad();
      rig.w2 = rig.w2.detach().to(t).set_requires_grad();
    }
    if (kind == "sgd")
      opt = std::make_unique<optim::SGD>(rig.params(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    else if (kind == "sgd-bf16-sr")
      opt = std::make_unique<optim::SGD>(
          rig.params(),
          optim::SGDOptions{
              .lr = 0.1, .momentum = 0.9, .half = {.master_weights = false, .stochastic_rounding = true, .seed = 7}});
    else
      opt = std::make_unique<optim::AdamW>(rig.params(), optim::AdamWOptions{.lr = 1e-2});
    amp::GradScaler s({.init_scale = 256});
    for (int i = 0; i < 3; ++i) {  // some real steps first, so every state tensor exists
      opt->zero_grad();
      rig.backward(s);
      s.step(*opt);
      ASSERT_TRUE(s.stepped(*opt));
      s.update();
    }
    const auto before = snapshot(*opt);
    const int64_t steps_before = opt->steps();
    const double scale_before = s.get_scale();
    opt->zero_grad();
    rig.backward(s, kInf);
    s.step(*opt);
    EXPECT_FALSE(s.stepped(*opt));
    EXPECT_TRUE(s.found_inf(*opt));
    s.update();
    EXPECT_EQ(snapshot(*opt), before);
    EXPECT_EQ(opt->steps(), steps_before);
    EXPECT_EQ(s.get_scale(), scale_before / 2);
    // The same through an explicit unscale (the clipping path).
    opt->zero_grad();
    rig.backward(s, -kInf);
    s.unscale_(*opt);
    s.step(*opt);
    EXPECT_FALSE(s.stepped(*opt));
    s.update();
    EXPECT_EQ(snapshot(*opt), before);
    EXPECT_EQ(s.get_scale(), scale_before / 4);
  }
}

TEST(GradScaler, UnscaleDividesGradientsAndFusedStepMatchesIt) {
  Rig a, b;
  optim::AdamW oa(a.params(), {.lr = 1e-2}), ob(b.params(), {.lr = 1e-2});
  amp::GradScaler sa({.init_scale = 1024}), sb({.init_scale = 1024});
  a.backward(sa);
  Tensor scaled = a.w1.grad().clone();
  sa.unscale_(oa);
  const auto unscaled = a.w1.grad().to_vector(), sv = scaled.to_vector();
  for (size_t i = 0; i < sv.size(); ++i) EXPECT_EQ(unscaled[i], sv[i] * (1.0f / 1024.0f));
  sa.step(oa);
  sa.update();
  b.backward(sb);
  sb.step(ob);  // fused: check, then unscale inside the optimizer's pass
  sb.update();
  EXPECT_EQ(bytes_of(a.w1), bytes_of(b.w1));
  EXPECT_EQ(bytes_of(a.w2), bytes_of(b.w2));
}

TEST(GradScaler, UnscaleOfF16GradientsGivesF32) {
  Tensor w = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2}, DType::f16).set_requires_grad();
  optim::AdamW opt({w});
  amp::GradScaler s({.init_scale = 65536});
  s.scale(ops::sum(ops::affine(w.to(DType::f32), 1e-6))).backward();  // true gradient 1e-6: f16 holds 1e-6 * 65536
  ASSERT_EQ(w.grad().dtype(), DType::f16);
  s.unscale_(opt);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_NEAR(w.grad().to_vector()[0], 1e-6, 1e-9);  // would be a subnormal with 1 bit left in f16
  s.step(opt);
  EXPECT_TRUE(s.stepped(opt));
  s.update();
}

TEST(GradScaler, OutOfOrderCallsNameTheExpectedCall) {
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.1});
  amp::GradScaler s;
  expect_throw_with([&] { s.step(opt); }, "expected scale(loss).backward() first");
  expect_throw_with([&] { s.unscale_(opt); }, "expected scale(loss).backward() first");
  expect_throw_with([&] { s.update(); }, "expected unscale_(optimizer) or step(optimizer) before update()");
  rig.backward(s);
  s.unscale_(opt);
  expect_throw_with([&] { s.unscale_(opt); }, "expected step(optimizer) next");
  s.step(opt);
  expect_throw_with([&] { s.step(opt); }, "expected update() next");
  expect_throw_with([&] { s.unscale_(opt); }, "expected update() first");
  s.update();
  // A backward that reached none of the optimizer's parameters: no inf check was recorded.
  optim::SGD other({Tensor::zeros({2}).set_requires_grad()}, {.lr = 0.1});
  rig.backward(s);
  expect_throw_with([&] { s.step(other); }, "no inf checks were recorded for this optimizer");
}

TEST(GradScaler, DisabledPassesThrough) {
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.1});
  amp::GradScaler s({.enabled = false});
  Tensor loss = rig.loss();
  EXPECT_TRUE(s.scale(loss).same(loss));
  EXPECT_EQ(s.get_scale(), 1.0);
  s.scale(loss).backward();
  s.unscale_(opt);
  s.unscale_(opt);  // no state checks when disabled
  const auto w_before = rig.w1.to_vector();
  s.step(opt);
  EXPECT_TRUE(s.stepped(opt));
  s.update();
  EXPECT_NE(rig.w1.to_vector(), w_before);
  EXPECT_TRUE(s.state_dict().empty());
}

TEST(GradScaler, SeveralOptimizersShareOneScale) {
  Rig rig;
  optim::SGD o1({rig.w1}, {.lr = 0.1}), o2({rig.w2}, {.lr = 0.1});
  amp::GradScaler s({.init_scale = 64});
  rig.backward(s, kInf);  // only w2 (o2) overflows
  const auto w1_before = rig.w1.to_vector(), w2_before = rig.w2.to_vector();
  s.step(o1);
  s.step(o2);
  s.update();
  EXPECT_TRUE(s.stepped(o1));  // the answers outlive update()
  EXPECT_FALSE(s.stepped(o2));
  EXPECT_NE(rig.w1.to_vector(), w1_before);
  EXPECT_EQ(rig.w2.to_vector(), w2_before);
  EXPECT_EQ(s.get_scale(), 32.0);  // one inf anywhere backs the shared scale off
  // Two losses into one optimizer in one iteration.
  o1.zero_grad();
  o2.zero_grad();
  s.scale(rig.loss()).backward();
  s.scale(ops::sum(rig.w1)).backward();
  s.step(o1);
  s.step(o2);
  EXPECT_TRUE(s.stepped(o1));
  EXPECT_TRUE(s.stepped(o2));
  s.update();
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScaler, HysteresisWaitsForConsecutiveOverflows) {
  amp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 4;
  o.hysteresis = 3;
  // Reference: DeepSpeed's DynamicLossScaler with consecutive_hysteresis=True.
  float scale = 1024;
  int64_t left = 3, tracker = 0;
  auto ref = [&](bool inf) {
    if (inf) {
      tracker = 0;
      if (left > 1)
        --left;
      else
        scale *= 0.5f;
      return;
    }
    left = 3;
    if (++tracker == 4) scale *= 2, tracker = 0;
  };
  amp::GradScaler s(o);
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.01});
  const std::string script = "xx.xxx.xxxx....x..xxx";
  for (char c : script) {
    opt.zero_grad();
    rig.backward(s, c == 'x' ? kInf : 0.0);
    s.step(opt);
    EXPECT_EQ(s.stepped(opt), c == '.');  // every overflow is skipped, hysteresis or not
    s.update();
    ref(c == 'x');
    ASSERT_EQ(float(s.get_scale()), scale);
    ASSERT_EQ(s.hysteresis_left(), left);
  }
}

TEST(GradScaler, BoundsAndErrorAtMinScale) {
  amp::GradScalerOptions o;
  o.init_scale = 4;
  o.min_scale = 2;
  o.max_scale = 8;
  o.growth_interval = 1;
  o.error_at_min_scale = true;
  amp::GradScaler s(o);
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.01});
  auto iteration = [&](bool inf) {
    opt.zero_grad();
    rig.backward(s, inf ? kInf : 0.0);
    s.step(opt);
    s.update();
  };
  iteration(false);
  EXPECT_EQ(s.get_scale(), 8);
  iteration(false);
  EXPECT_EQ(s.get_scale(), 8);  // max_scale caps growth
  iteration(true);
  iteration(true);
  EXPECT_EQ(s.get_scale(), 2);
  expect_throw_with([&] { iteration(true); }, "already at min_scale");
  EXPECT_THROW(amp::GradScaler({.init_scale = 1, .min_scale = 2}), Error);
  EXPECT_THROW(amp::GradScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(amp::GradScaler({.backoff_factor = 1.0}), Error);
}

TEST(GradScaler, StaticScaleSkipsButNeverChanges) {
  amp::GradScaler s({.init_scale = 128, .growth_interval = 1, .dynamic = false});
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.01});
  for (bool inf : {false, true, false, false}) {
    opt.zero_grad();
    rig.backward(s, inf ? kInf : 0.0);
    s.step(opt);
    EXPECT_EQ(s.stepped(opt), !inf);
    s.update();
    EXPECT_EQ(s.get_scale(), 128);
  }
}

TEST(GradScaler, UpdateWithNewScale) {
  amp::GradScaler s;
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.01});
  rig.backward(s);
  s.step(opt);
  s.update(1024.0);
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_THROW(s.update(0.0), Error);
}

TEST(GradScaler, StateDictRoundTripContinuesTheSequence) {
  amp::GradScalerOptions o;
  o.init_scale = 512;
  o.growth_interval = 3;
  o.hysteresis = 2;
  const std::string first = "..x.xx..", second = ".x..xx.....x..";
  Rig rig;
  optim::SGD opt(rig.params(), {.lr = 0.0});
  auto run = [&](amp::GradScaler& s, const std::string& script) {
    std::vector<std::pair<double, int64_t>> trace;
    for (char c : script) {
      opt.zero_grad();
      rig.backward(s, c == 'x' ? kInf : 0.0);
      s.step(opt);
      s.update();
      trace.emplace_back(s.get_scale(), s.growth_tracker());
    }
    return trace;
  };
  amp::GradScaler a(o);
  run(a, first);
  const StateDict sd = a.state_dict();
  EXPECT_EQ(find_state(sd, "scale")->item(), a.get_scale());
  EXPECT_EQ(state_to_i64(*find_state(sd, "_growth_tracker")), a.growth_tracker());
  EXPECT_EQ(state_to_i64(*find_state(sd, "_hysteresis_left")), a.hysteresis_left());
  amp::GradScaler b;  // default options: everything comes from the state dict
  b.load_state_dict(sd);
  EXPECT_EQ(b.options().growth_interval, 3);
  EXPECT_EQ(b.options().hysteresis, 2);
  EXPECT_EQ(b.num_skipped_steps(), a.num_skipped_steps());
  EXPECT_EQ(run(a, second), run(b, second));
  EXPECT_THROW(b.load_state_dict({}), Error);
  EXPECT_THROW(b.load_state_dict(
                   {{"scale", Tensor::scalar(1.0)}, {"_growth_tracker", state_i64(0)}, {"bogus", Tensor::scalar(1.0)}}),
               Error);
}

TEST(GradScaler, UnscaleAndCheckFindsNaNAnywhere) {
  std::vector<Tensor> params;
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Tensor p = Tensor::zeros({10000}, t).set_requires_grad();
    p.set_grad(Tensor::ones({10000}, t));
    params.push_back(p);
  }
  auto check = [&](double scale, bool check_only) {
    Tensor found = Tensor::zeros({}, DType::f32);
    const int64_t n = amp::detail::unscale_and_check(params, Tensor::scalar(scale), found, check_only);
    EXPECT_EQ(n, 4);
    return found.item() != 0;
  };
  EXPECT_FALSE(check(1.0, true));
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor g = params[k].grad();
    std::vector<double> v(10000, 1.0);
    v[9999] = std::nan("");
    g.copy_(Tensor::from_vector(v, {10000}));
    EXPECT_TRUE(check(2.0, false)) << k;
    params[k].set_grad(Tensor::ones({10000}, params[k].dtype()));
  }
  for (Tensor& p : params) p.set_grad(Tensor::ones({10000}, p.dtype()));
  EXPECT_FALSE(check(2.0, false));  // an f16 gradient becomes f32:
  EXPECT_EQ(params[2].grad().dtype(), DType::f32);
  EXPECT_EQ(params[2].grad().to_vector()[5], 0.5f);
  EXPECT_EQ(params[1].grad().to_vector()[5], 0.5f);
}
