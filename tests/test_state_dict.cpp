// One StateDict shape for Module, Optimizer and GradScaler: layouts and dtypes (scalars as 0-d
// tensors), round trips that continue bit-exactly, one-line errors naming the bad key; and
// optimizer parameter groups (per-group lr and weight decay, the schedule applied to each).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "error_text.h"
#include "mixprec/error.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/schedule.h"
#include "mixprec/state_dict.h"
#include "tensor_bytes.h"

using namespace mixprec;
using testutil::bytes_of;

namespace {

using testutil::error_of;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  const std::string what = error_of(f);
  EXPECT_NE(what.find(needle), std::string::npos) << what;
}

StateDict replaced(StateDict sd, const std::string& key, const Tensor& t) {
  for (auto& [k, v] : sd)
    if (k == key) v = t;
  return sd;
}

StateDict without(StateDict sd, const std::string& key) {
  std::erase_if(sd, [&](const auto& e) { return e.first == key; });
  return sd;
}

// Sets a gradient on every parameter: a fixed function of (parameter, step).
void fake_grads(const std::vector<Tensor>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<double> g(size_t(params[i].numel()));
    for (size_t j = 0; j < g.size(); ++j) g[j] = std::sin(double(i * 31 + j * 7 + size_t(step) * 13));
    Tensor p = params[i];
    p.set_grad(Tensor::from_vector(g, p.shape(), p.dtype()));
  }
}

std::vector<Tensor> fresh_params(std::vector<Shape> shapes, double start) {
  std::vector<Tensor> out;
  for (const Shape& s : shapes) {
    std::vector<double> v(size_t(shape_numel(s)));
    for (size_t j = 0; j < v.size(); ++j) v[j] = start + 0.01 * double(j);
    out.push_back(Tensor::from_vector(v, s, DType::f32).set_requires_grad());
    start += 1;
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------ Module

TEST(StateDict, ModuleRoundTripAndDtypeChecks) {
  default_generator().manual_seed(1);
  auto a = nn::Sequential(nn::Linear(3, 4), nn::BatchNorm2d(4));
  auto b = nn::Sequential(nn::Linear(3, 4), nn::BatchNorm2d(4));
  const StateDict sd = a.state_dict();
  const Tensor* tracked = find_state(sd, "1.num_batches_tracked");
  ASSERT_NE(tracked, nullptr);
  EXPECT_EQ(tracked->dtype(), DType::i64);
  EXPECT_EQ(tracked->dim(), 0);
  b.load_state_dict(sd);
  const StateDict sb = b.state_dict();
  ASSERT_EQ(sb.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(bytes_of(sb[i].second), bytes_of(sd[i].second)) << sd[i].first;

  // A floating value loads into a floating tensor of another width (PyTorch's copy_ converts) ...
  auto half = nn::Sequential(nn::Linear(3, 4), nn::BatchNorm2d(4));
  half.to(DType::bf16);
  half.load_state_dict(sd);
  EXPECT_EQ(half.state_dict()[0].second.dtype(), DType::bf16);
  EXPECT_EQ(half.state_dict()[0].second.to_vector(), sd[0].second.to(DType::bf16).to_vector());
  // ... but an integer buffer needs an integer, and a float parameter a float.
  const std::vector<uint8_t> before = bytes_of(b.state_dict()[0].second);
  expect_error([&] { b.load_state_dict(replaced(sd, "1.num_batches_tracked", Tensor::scalar(3.0))); },
               "Module.load_state_dict: '1.num_batches_tracked' is f32 [], expected i64 []");
  expect_error(
      [&] {
        b.load_state_dict(replaced(sd, "0.weight", Tensor::zeros({4, 3}, DType::i64)));
      },
      "'0.weight' is i64 [4, 3], expected f32 [4, 3]");
  expect_error([&] { b.load_state_dict(replaced(sd, "0.bias", Tensor::zeros({3}))); },
               "'0.bias' is f32 [3], expected f32 [4]");
  expect_error([&] { b.load_state_dict(without(sd, "1.running_var")); }, "missing key '1.running_var'");
  StateDict extra = sd;
  extra.emplace_back("2.weight", Tensor::zeros({1}));
  expect_error([&] { b.load_state_dict(extra); }, "unexpected key '2.weight'");
  EXPECT_EQ(bytes_of(b.state_dict()[0].second), before);  // a refused state dict changes nothing
}

// ---------------------------------------------------------------------------------- Optimizer

TEST(StateDict, OptimizerLayoutWithGroups) {
  const auto decay = fresh_params({{2, 3}, {3}}, 0.5), no_decay = fresh_params({{4}}, -0.5);
  optim::AdamW opt({{decay, {.weight_decay = 0.1}}, {no_decay, {.lr = 0.5, .weight_decay = 0.0}}}, {.lr = 1e-3});
  fake_grads(opt.params(), 0);
  opt.step();
  const StateDict sd = opt.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, t] : sd) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"step", "param_groups.0.lr", "param_groups.0.weight_decay",
                                            "param_groups.0.params", "param_groups.1.lr", "param_groups.1.weight_decay",
                                            "param_groups.1.params", "state.0.exp_avg", "state.0.exp_avg_sq",
                                            "state.1.exp_avg", "state.1.exp_avg_sq", "state.2.exp_avg",
                                            "state.2.exp_avg_sq"}));
  EXPECT_EQ(sd[0].second.dtype(), DType::i64);
  EXPECT_EQ(sd[0].second.dim(), 0);
  EXPECT_EQ(state_to_i64(sd[0].second), 1);
  EXPECT_EQ(sd[1].second.dtype(), DType::f64);
  EXPECT_EQ(sd[1].second.dim(), 0);
  EXPECT_EQ(sd[1].second.item(), 1e-3);
  EXPECT_EQ(sd[2].second.item(), 0.1);
  EXPECT_EQ(sd[3].second.to_vector_i64(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sd[4].second.item(), 0.5);
  EXPECT_EQ(sd[5].second.item(), 0.0);
  EXPECT_EQ(sd[6].second.to_vector_i64(), (std::vector<int64_t>{2}));
}

TEST(StateDict, OptimizerRoundTripContinuesBitExactly) {
  for (const bool sgd : {false, true}) {
    auto make = [&](const std::vector<Tensor>& p) -> std::unique_ptr<optim::Optimizer> {
      std::vector<optim::ParamGroup> groups{{{p[0], p[1]}, {.weight_decay = 0.05}}, {{p[2]}, {.lr = 0.02}}};
      if (sgd) return std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 0.01});
    };
    const auto pa = fresh_params({{2, 3}, {3}, {5}}, 0.25), pb = fresh_params({{2, 3}, {3}, {5}}, 0.25);
    auto oa = make(pa), ob = make(pb);
    for (int s = 0; s < 3; ++s) {
      fake_grads(oa->params(), s);
      oa->step();
    }
    oa->set_lr(1, 0.03);  // a group's own lr must survive the trip too
    for (size_t i = 0; i < pa.size(); ++i) pb[i].detach().copy_(pa[i].detach());
    ob->load_state_dict(oa->state_dict());
    EXPECT_EQ(ob->steps(), 3);
    EXPECT_EQ(ob->lr(1), 0.03);
    for (int s = 3; s < 5; ++s) {
      fake_grads(oa->params(), s);
      oa->step();
      fake_grads(ob->params(), s);
      ob->step();
    }
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(bytes_of(pa[i]), bytes_of(pb[i])) << (sgd ? "SGD " : "AdamW ") << i;
    const StateDict sa = oa->state_dict(), sb = ob->state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_EQ(bytes_of(sa[i].second), bytes_of(sb[i].second)) << sa[i].first;
    }
  }
}

TEST(StateDict, OptimizerErrorsNameTheKey) {
  const auto p = fresh_params({{2, 3}, {3}}, 0.5);
  optim::AdamW a({{{p[0]}, {}}, {{p[1]}, {.weight_decay = 0.0}}});
  fake_grads(a.params(), 0);
  a.step();
  const StateDict sd = a.state_dict();
  optim::AdamW b({{{p[0]}, {}}, {{p[1]}, {.weight_decay = 0.0}}});
  expect_error([&] { b.load_state_dict(replaced(sd, "step", Tensor::scalar(1.0))); },
               "AdamW.load_state_dict: 'step' is f32 [], expected i64 []");
  expect_error([&] { b.load_state_dict(replaced(sd, "param_groups.1.lr", Tensor::scalar(0.1))); },
               "'param_groups.1.lr' is f32 [], expected f64 []");
  expect_error([&] { b.load_state_dict(replaced(sd, "param_groups.0.params", state_i64(1).reshape({1}))); },
               "'param_groups.0.params' lists other parameters");
  expect_error(
      [&] {
        b.load_state_dict(replaced(sd, "state.1.exp_avg", Tensor::zeros({2, 3})));
      },
      "'state.1.exp_avg' is f32 [2, 3], expected f32 [3]");
  expect_error([&] { b.load_state_dict(without(sd, "param_groups.1.weight_decay")); },
               "missing key 'param_groups.1.weight_decay'");
  StateDict extra = sd;
  extra.emplace_back("state.0.momentum_buffer", Tensor::zeros({2, 3}));
  expect_error([&] { b.load_state_dict(extra); }, "unexpected key 'state.0.momentum_buffer'");
  extra = sd;
  extra.emplace_back("state.2.exp_avg", Tensor::zeros({1}));
  expect_error([&] { b.load_state_dict(extra); }, "unexpected key 'state.2.exp_avg'");
  // Two groups against one: the grouping is part of the state.
  optim::AdamW one(p);
  expect_error([&] { one.load_state_dict(sd); }, "'param_groups.0.params' is i64 [1], expected i64 [2]");
  expect_error([&] { one.load_state_dict(without(sd, "param_groups.0.params")); },
               "unexpected key 'param_groups.1.lr'");
  EXPECT_EQ(b.steps(), 0);  // nothing was loaded by the refused calls
  EXPECT_EQ(b.state_dict().size(), 7u);
  // One moment without the other loads, and the missing one starts at zero.
  b.load_state_dict(without(sd, "state.0.exp_avg_sq"));
  EXPECT_EQ(b.state_dict().size(), sd.size() - 1);
  fake_grads(b.params(), 1);
  b.step();
  EXPECT_EQ(b.state_dict().size(), sd.size());
}

// ------------------------------------------------------------------------------- GradScaler

TEST(StateDict, GradScalerScalarsAreZeroDimTensors) {
  amp::GradScaler s({.init_scale = 1024, .growth_interval = 7, .hysteresis = 2});
  const StateDict sd = s.state_dict();
  ASSERT_EQ(sd.size(), 14u);
  for (const auto& [k, t] : sd) EXPECT_EQ(t.dim(), 0) << k;
  EXPECT_EQ(sd[0].first, "scale");
  EXPECT_EQ(sd[0].second.dtype(), DType::f32);  // PyTorch's _scale is an f32 tensor
  EXPECT_EQ(sd[0].second.item(), 1024.0);
  EXPECT_EQ(find_state(sd, "growth_interval")->dtype(), DType::i64);
  EXPECT_EQ(state_to_i64(*find_state(sd, "growth_interval")), 7);
  EXPECT_EQ(find_state(sd, "dynamic")->dtype(), DType::u8);
  EXPECT_EQ(find_state(sd, "growth_factor")->dtype(), DType::f64);
  amp::GradScaler t;
  t.load_state_dict(sd);
  EXPECT_EQ(t.get_scale(), 1024.0);
  EXPECT_EQ(t.options().growth_interval, 7);
  expect_error([&] { t.load_state_dict(replaced(sd, "_growth_tracker", Tensor::scalar(0.0, DType::f64))); },
               "GradScaler.load_state_dict: '_growth_tracker' is f64 [], expected i64 []");
  expect_error([&] { t.load_state_dict(replaced(sd, "scale", Tensor::full({1}, 2.0))); },
               "'scale' is f32 [1], expected f32 []");
  expect_error([&] { t.load_state_dict(without(sd, "scale")); }, "missing key 'scale'");
  StateDict extra = sd;
  extra.emplace_back("bogus", Tensor::scalar(1.0));
  expect_error([&] { t.load_state_dict(extra); }, "unexpected key 'bogus'");
}

// -------------------------------------------------------------------------- parameter groups

// Two groups behave exactly as two optimizers, each with its group's options.
TEST(ParamGroups, EqualSeparateOptimizers) {
  const auto p = fresh_params({{3, 2}, {2}, {4}}, 0.3), q = fresh_params({{3, 2}, {2}, {4}}, 0.3);
  optim::AdamW grouped({{{p[0], p[1]}, {.weight_decay = 0.1}}, {{p[2]}, {.lr = 0.05, .weight_decay = 0.0}}},
                       {.lr = 0.01});
  optim::AdamW first({q[0], q[1]}, {.lr = 0.01, .weight_decay = 0.1});
  optim::AdamW second({q[2]}, {.lr = 0.05, .weight_decay = 0.0});
  EXPECT_EQ(grouped.param_groups().size(), 2u);
  EXPECT_EQ(grouped.params().size(), 3u);
  EXPECT_EQ(grouped.group_of(2), 1u);
  EXPECT_EQ(grouped.lr(0), 0.01);
  EXPECT_EQ(grouped.lr(1), 0.05);
  EXPECT_EQ(grouped.weight_decay(0), 0.1);
  EXPECT_EQ(grouped.weight_decay(1), 0.0);
  for (int s = 0; s < 4; ++s) {
    fake_grads(p, s);
    fake_grads(q, s);
    grouped.step();
    first.step();
    second.step();
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(bytes_of(p[i]), bytes_of(q[i])) << i;
  // Weight decay only where the group asks for it: with zero gradients, group 0 shrinks, group 1 stays.
  const std::vector<float> w0 = p[0].to_vector(), w2 = p[2].to_vector();
  for (const Tensor& t : p) {
    Tensor h = t;
    h.set_grad(Tensor::zeros(t.shape()));
  }
  optim::SGD sgd({{{p[0]}, {.weight_decay = 0.5}}, {{p[2]}, {}}}, {.lr = 0.1});
  sgd.step();
  EXPECT_FLOAT_EQ(p[0].to_vector()[1], w0[1] * (1 - 0.1f * 0.5f));
  EXPECT_EQ(p[2].to_vector(), w2);
}

TEST(ParamGroups, ScheduleScalesEveryGroup) {
  const auto p = fresh_params({{2}, {2}}, 0.0);
  optim::SGD opt({{{p[0]}, {}}, {{p[1]}, {.lr = 0.1}}}, {.lr = 1.0});
  optim::LrSchedule s(opt, "cosine", 100, 10);
  EXPECT_EQ(s.base_lr(1), 0.1);
  EXPECT_DOUBLE_EQ(s.apply(4), 1.0 * 5 / 11);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.1 * 5 / 11);
  s.apply(55);
  EXPECT_NEAR(opt.lr(0), 0.5, 1e-12);
  EXPECT_NEAR(opt.lr(1), 0.05, 1e-12);
  opt.set_lr(0.3);  // every group
  EXPECT_EQ(opt.lr(1), 0.3);
}

TEST(ParamGroups, RejectsBadGroups) {
  const auto p = fresh_params({{2}, {2}}, 0.0);
  expect_error([&] { optim::AdamW({{{p[0], p[1]}, {}}, {{p[1]}, {}}}); }, "a parameter may appear in one group only");
  expect_error([&] { optim::SGD({{{p[0]}, {.lr = -1.0}}}); }, "learning rate must be a finite number >= 0");
  expect_error([&] { optim::SGD({{{p[0]}, {.weight_decay = -0.1}}}); }, "weight_decay of parameter group 0");
  expect_error([&] { optim::AdamW(std::vector<optim::ParamGroup>{{{}, {}}}); }, "empty parameter list");
  optim::SGD ok({{{p[0]}, {}}, {{}, {}}, {{p[1]}, {}}});  // an empty group is allowed, as in PyTorch
  EXPECT_EQ(ok.group_of(1), 2u);
  expect_error([&] { ok.set_lr(3, 0.1); }, "no parameter group 3");
}
