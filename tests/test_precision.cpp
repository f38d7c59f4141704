// Precision presets end to end on small models: fp16 gradients really flush below 2^-25, dynamic
// loss scaling rescues a model whose gradients sit near 1e-8, master weights keep the small
// updates that pure 16-bit storage swamps, and the optimizer/accumulation/clipping plumbing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "kernels/kernels.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/clip.h"
#include "mixprec/convert.h"
#include "mixprec/diagnostics.h"
#include "mixprec/error.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"
#include "optim/rounding.h"
#include "tensor_bytes.h"

using namespace mixprec;
using testutil::bytes_of;

namespace {

// 8 features -> 4 classes, 64 samples, learnable: the class is the argmax of 4 feature pairs.
struct Toy {
  Tensor x, y;
  Toy() {
    Generator g(3);
    x = Tensor::randn({64, 8}, g);
    const auto xv = x.to_vector();
    std::vector<int64_t> labels(64);
    for (int i = 0; i < 64; ++i) {
      int best = 0;
      for (int c = 1; c < 4; ++c)
        if (xv[size_t(i * 8 + 2 * c)] > xv[size_t(i * 8 + 2 * best)]) best = c;
      labels[size_t(i)] = best;
    }
    y = Tensor::from_vector(labels, {64});
  }
};

std::shared_ptr<nn::Sequential> toy_model(uint64_t seed) {
  default_generator().manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(8, 32), nn::ReLU(), nn::Linear(32, 4));
}

struct RunResult {
  double first_loss = 0, last_loss = 0;
  std::vector<amp::GradStats> stats;  // diagnostics of the first step
  int64_t skipped = 0;
};

// `steps` AdamW steps of the toy model under preset `name`, the loss multiplied by loss_weight
// (which scales every true gradient by it), with or without the preset's GradScaler.
RunResult train_toy(const std::string& name, double loss_weight, bool scaling, int steps) {
  const amp::Precision p = amp::precision_preset(name);
  Toy data;
  auto model = toy_model(11);
  amp::apply_precision(*model, p);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2, .weight_decay = 0.0, .half = amp::half_param_options(p)});
  amp::GradScalerOptions so = amp::grad_scaler_options(p);
  so.enabled = scaling;
  amp::GradScaler scaler(so);
  RunResult r;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(p.autocast_dtype, p.autocast);
      loss = ops::cross_entropy((*model)(data.x), data.y);
    }
    if (i == 0) r.first_loss = loss.item();
    r.last_loss = loss.item();
    scaler.scale(ops::affine(loss, loss_weight)).backward();
    if (i == 0) r.stats = amp::gradient_stats(model->named_parameters(), scaler.get_scale());
    scaler.step(opt);
    scaler.update();
  }
  r.skipped = scaler.num_skipped_steps();
  return r;
}

}  // namespace

TEST(Precision, PresetsAreTheDocumentedRecipes) {
  EXPECT_EQ(amp::precision_preset_names().size(), 7u);
  const amp::Precision h = amp::precision_preset("half-fp16");
  EXPECT_TRUE(h.autocast && h.master_weights && h.loss_scaling);
  EXPECT_EQ(h.param_dtype, DType::f16);
  const amp::Precision pb = amp::precision_preset("pure-bf16");
  EXPECT_TRUE(!pb.master_weights && pb.stochastic_rounding && !pb.loss_scaling);
  EXPECT_TRUE(amp::precision_preset("amp-fp16").loss_scaling);
  EXPECT_FALSE(amp::precision_preset("amp-bf16").loss_scaling);
  EXPECT_FALSE(amp::grad_scaler_options(amp::precision_preset("half-bf16")).enabled);
  try {
    amp::precision_preset("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("half-fp16"), std::string::npos) << e.what();
  }
}

TEST(Precision, ModuleToConvertsInPlaceAndKeepsNormsF32) {
  default_generator().manual_seed(1);
  auto lin = std::make_shared<nn::Linear>(4, 6);
  auto norm = std::make_shared<nn::LayerNorm>(Shape{6});
  nn::Sequential m;
  m.push_back(lin);
  m.push_back(norm);
  const Tensor w_handle = lin->weight;  // an outside handle must see the conversion
  const auto before = lin->weight.to_vector();
  const int64_t param_bytes = allocator::stats().live_bytes[size_t(MemCategory::parameters)];
  amp::apply_precision(m, amp::precision_preset("half-fp16"));
  EXPECT_TRUE(norm->is_normalization());
  EXPECT_FALSE(lin->is_normalization());
  EXPECT_EQ(w_handle.dtype(), DType::f16);
  EXPECT_EQ(m.parameters()[0].dtype(), DType::f16);
  EXPECT_EQ(lin->bias.dtype(), DType::f16);
  EXPECT_EQ(norm->weight.dtype(), DType::f32);
  EXPECT_EQ(w_handle.storage()->category(), MemCategory::parameters);
  EXPECT_LT(allocator::stats().live_bytes[size_t(MemCategory::parameters)], param_bytes);
  const auto after = w_handle.to_vector();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], f16_to_f32(f32_to_f16(before[i])));
  // The converted model runs under the preset's autocast (norm in f32, linear in f16).
  amp::Autocast ac(DType::f16);
  Tensor out = m(Tensor::ones({2, 4}));
  EXPECT_EQ(out.shape(), (Shape{2, 6}));
}

TEST(Precision, F16BackwardFlushesBelowHalfTheSmallestSubnormal) {
  // The cast node turns an f32 gradient into f16 on its way to an f16 activation.
  Tensor x = Tensor::ones({4}).set_requires_grad();
  Tensor h = x.to(DType::f16);
  const std::vector<float> w = {1e-8f, 2.9e-8f, 3.0e-8f, 1e-7f};  // 2^-25 = 2.98e-8
  ops::sum(ops::mul(h.to(DType::f32), Tensor::from_vector(w, {4}))).backward();
  const auto g = x.grad().to_vector();
  EXPECT_EQ(g[0], 0.0f);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_EQ(g[2], 0x1p-24f);      // just above 2^-25: the smallest subnormal
  EXPECT_EQ(g[3], 2 * 0x1p-24f);  // 1e-7 = 1.68 * 2^-24 rounds to 2 * 2^-24
  // Under autocast f16 the weight gradient of a linear layer is an f16 matmul result too.
  Tensor wt = Tensor::full({2, 3}, 0.5).set_requires_grad();
  Tensor loss;
  {
    amp::Autocast ac(DType::f16);
    loss = ops::sum(ops::linear(Tensor::ones({1, 3}), wt));
  }
  ops::affine(loss, 1e-8).backward();
  EXPECT_EQ(wt.grad().dtype(), DType::f32);
  for (float v : wt.grad().to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(Precision, DynamicScalingRescuesGradientsNear1e8) {
  // fp32 reference: the true gradients of this setup sit around 1e-8.
  const RunResult ref = train_toy("fp32", 1e-6, false, 1);
  const amp::GradStats& all_ref = ref.stats.back();
  EXPECT_GT(all_ref.rms, 3e-9);
  EXPECT_LT(all_ref.rms, 3e-8);
  EXPECT_GT(all_ref.underflow_unscaled, 0.8);  // fp16 would flush most of them
  const RunResult scaled = train_toy("amp-fp16", 1e-6, true, 40);
  const RunResult unscaled = train_toy("amp-fp16", 1e-6, false, 40);
  // With the scale (2^16) the f16 gradients survive and the model learns ...
  EXPECT_LT(scaled.last_loss, 0.6 * scaled.first_loss);
  EXPECT_EQ(scaled.skipped, 0);
  EXPECT_LT(scaled.stats.back().underflow, 0.1);
  EXPECT_GT(scaled.stats.back().underflow_unscaled, 0.8);
  // ... without it every gradient is flushed to zero and nothing moves.
  EXPECT_EQ(unscaled.last_loss, unscaled.first_loss);
  EXPECT_EQ(unscaled.stats.back().zero, 1.0);
  EXPECT_EQ(unscaled.stats.back().underflow, 1.0);
  // half-fp16 (f16 weights, f32 master) is rescued the same way.
  const RunResult half = train_toy("half-fp16", 1e-6, true, 40);
  EXPECT_LT(half.last_loss, 0.6 * half.first_loss);
}

TEST(Precision, MasterWeightsKeepUpdatesThatPureF16Swamps) {
  // Each SGD step moves a weight of 1.0 by 1e-4: below half an ulp of f16 at 1.0 (2^-11).
  optim::Optimizer::RoundingStats stats;
  auto run = [&stats](DType t, optim::HalfParamOptions half) {
    Tensor w = Tensor::ones({4096}, t).set_requires_grad();
    optim::SGD opt({w}, {.lr = 1e-4, .half = half});
    opt.set_track_rounding(true);
    for (int i = 0; i < 100; ++i) {
      w.set_grad(Tensor::ones({4096}, t));
      opt.step();
    }
    stats = opt.take_rounding_stats();
    const auto v = w.to_vector();
    return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  };
  const double pure = run(DType::f16, {.master_weights = false});
  EXPECT_EQ(stats.changed, 100 * 4096);
  EXPECT_EQ(stats.unchanged_16bit, 100 * 4096);  // the diagnostics see every update rounded away
  const double half = run(DType::f16, {.master_weights = true});
  EXPECT_EQ(stats.changed, 100 * 4096);
  EXPECT_LT(stats.unchanged_16bit, 100 * 4096);  // the master moves the 16-bit copy now and then
  const double pure_bf16 = run(DType::bf16, {.master_weights = false});
  const double sr_bf16 = run(DType::bf16, {.master_weights = false, .stochastic_rounding = true, .seed = 5});
  const double sr_f16 = run(DType::f16, {.master_weights = false, .stochastic_rounding = true, .seed = 5});
  EXPECT_EQ(pure, 1.0);  // every update rounded away
  EXPECT_EQ(pure_bf16, 1.0);
  EXPECT_EQ(half, double(f16_to_f32(f32_to_f16(0.99f))));  // the f32 master accumulated them
  EXPECT_NEAR(sr_bf16, 0.99, 5e-4);                        // unbiased on average
  EXPECT_NEAR(sr_f16, 0.99, 1e-4);
}

TEST(Precision, StochasticRoundingIsUnbiasedAndExactOnRepresentables) {
  const float x = 1.0f + 0x1p-9f;  // 1/4 of the way from 1 to the next bf16 (1 + 2^-7)
  double sum_bf16 = 0, sum_f16 = 0;
  const float y = 1.0f + 0x1p-12f;  // 1/4 of the way to the next f16 (1 + 2^-10)
  const int n = 200000;
  const Generator stream = optim::rounding_stream(1, 2, 3);
  for (int i = 0; i < n; ++i) {
    const uint32_t r = stream.block(uint64_t(i) / 4)[size_t(i % 4)];
    sum_bf16 += bf16_to_f32(optim::f32_to_bf16_stochastic(x, r));
    sum_f16 += f16_to_f32(optim::f32_to_f16_stochastic(-y, r));
    ASSERT_EQ(optim::f32_to_bf16_stochastic(1.5f, r), f32_to_bf16(1.5f));
    ASSERT_EQ(optim::f32_to_f16_stochastic(0x1p-24f, r), f32_to_f16(0x1p-24f));
  }
  EXPECT_NEAR(sum_bf16 / n, x, 2e-5);
  EXPECT_NEAR(sum_f16 / n, -y, 3e-6);
  EXPECT_EQ(optim::f32_to_f16_stochastic(70000.0f, 0), 0x7c00);  // overflow stays visible
  EXPECT_TRUE(std::isnan(bf16_to_f32(optim::f32_to_bf16_stochastic(NAN, 123))));
}

TEST(Precision, HalfParametersAreTheRoundedMaster) {
  Toy data;
  auto model = toy_model(2);
  const amp::Precision p = amp::precision_preset("half-bf16");
  amp::apply_precision(*model, p);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2, .half = amp::half_param_options(p)});
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    {
      amp::Autocast ac(p.autocast_dtype);
      ops::cross_entropy((*model)(data.x), data.y).backward();
    }
    opt.step();
  }
  for (size_t i = 0; i < opt.params().size(); ++i) {
    ASSERT_TRUE(opt.master(i).defined());
    EXPECT_EQ(opt.master(i).storage()->category(), MemCategory::optimizer_state);
    const Tensor rounded = opt.master(i).detach().to(DType::bf16);
    EXPECT_EQ(bytes_of(rounded), bytes_of(opt.params()[i]));
  }
}

TEST(Precision, OptimizerStateDictRoundTripIsBitExact) {
  for (bool adam : {false, true}) {
    Toy data;
    auto a = toy_model(4), b = toy_model(4);
    const amp::Precision p = amp::precision_preset("half-fp16");
    amp::apply_precision(*a, p);
    amp::apply_precision(*b, p);
    auto make = [&](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (adam) return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 1e-2, .half = {}});
      return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    };
    auto oa = make(*a), ob = make(*b);
    auto step = [&](nn::Module& m, optim::Optimizer& o) {
      o.zero_grad();
      {
        amp::Autocast ac(DType::f16);
        ops::cross_entropy(m(data.x), data.y).backward();
      }
      o.step();
    };
    for (int i = 0; i < 3; ++i) step(*a, *oa);
    b->load_state_dict(a->state_dict());
    ob->load_state_dict(oa->state_dict());
    for (int i = 0; i < 2; ++i) {
      step(*a, *oa);
      step(*b, *ob);
    }
    EXPECT_EQ(oa->steps(), ob->steps());
    const auto sa = oa->state_dict(), sb = ob->state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_EQ(bytes_of(sa[i].second), bytes_of(sb[i].second)) << sa[i].first;
    }
    EXPECT_THROW(ob->load_state_dict({{"step", Tensor::scalar(1)}, {"state.99.exp_avg", Tensor::zeros({1})}}), Error);
  }
}

TEST(Precision, AccumulatedMicroBatchesEqualTheFullBatch) {
  Toy data;
  auto full = toy_model(5), acc = toy_model(5);
  amp::GradScaler scaler({.init_scale = 1024});
  optim::SGD of(full->parameters(), {.lr = 0.1}), oa(acc->parameters(), {.lr = 0.1});
  ops::cross_entropy((*full)(data.x), data.y).backward();
  for (int k = 0; k < 4; ++k) {  // 4 micro-batches of 16, each loss weighted by 1/4, one scale
    Tensor loss =
        ops::cross_entropy((*acc)(data.x.slice(0, 16 * k, 16 * (k + 1))), data.y.slice(0, 16 * k, 16 * (k + 1)));
    scaler.scale(ops::affine(loss, 0.25)).backward();
  }
  scaler.unscale_(oa);
  for (size_t i = 0; i < of.params().size(); ++i) {
    const auto gf = of.params()[i].grad().to_vector(), ga = oa.params()[i].grad().to_vector();
    for (size_t j = 0; j < gf.size(); ++j) EXPECT_NEAR(ga[j], gf[j], 1e-6 + 1e-5 * std::fabs(gf[j]));
  }
  scaler.step(oa);
  EXPECT_TRUE(scaler.stepped(oa));
  scaler.update();
}

TEST(Precision, ClippingWorksOnUnscaledGradients) {
  Tensor a = Tensor::zeros({3}).set_requires_grad(), b = Tensor::zeros({2}, DType::f16).set_requires_grad();
  a.set_grad(Tensor::from_vector(std::vector<float>{3, 0, 0}, {3}));
  b.set_grad(Tensor::from_vector(std::vector<float>{0, 4}, {2}, DType::f16));
  EXPECT_DOUBLE_EQ(nn::grad_norm({a, b}).item(), 5.0);
  EXPECT_DOUBLE_EQ(nn::grad_norm({a, b}, INFINITY).item(), 4.0);
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a, b}, 1.0).item(), 5.0);
  EXPECT_NEAR(a.grad().to_vector()[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(b.grad().to_vector()[1], 0.8, 1e-3);
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a}, 100.0).item(), a.grad().to_vector()[0]);  // below the bound: untouched
  nn::clip_grad_value_({a, b}, 0.5);
  EXPECT_EQ(a.grad().to_vector()[0], 0.5f);
  EXPECT_EQ(b.grad().to_vector()[1], 0.5f);
  a.set_grad(Tensor::from_vector(std::vector<float>{INFINITY, 0, 0}, {3}));
  EXPECT_THROW(nn::clip_grad_norm_({a}, 1.0, {.error_if_nonfinite = true}), Error);
  // With a scaler: unscale first, then the threshold applies to the real gradient.
  Tensor w = Tensor::from_vector(std::vector<float>{1, 1}, {2}).set_requires_grad();
  optim::SGD opt({w}, {.lr = 1.0});
  amp::GradScaler s({.init_scale = 4096});
  s.scale(ops::sum(ops::affine(w, 3.0))).backward();  // true gradient (3, 3), norm 4.243
  s.unscale_(opt);
  EXPECT_NEAR(nn::clip_grad_norm_({w}, 1.0).item(), std::sqrt(18.0), 1e-5);
  s.step(opt);
  s.update();
  EXPECT_NEAR(w.to_vector()[0], 1.0 - 1.0 / std::sqrt(2.0), 1e-5);
}

TEST(Precision, F16AutocastRunsEveryOpFamilyLikeBf16) {
  // conv, batch norm, pooling, linear, layer norm, gelu, softmax/cross-entropy and mse: forward
  // and backward in f32 and under autocast f16 and bf16, every parameter's gradient against the
  // same model run in f64. Per element: within 16 roundings (u = 2^-24, 2^-11, 2^-8) of its f64
  // value, relative to the element's magnitude plus its tensor's RMS and the whole model's RMS
  // gradient. About 16 roundings lie on a gradient's path (each op of the forward and of the
  // backward rounds once; measured worst: 4.5u f32, 3.8u f16, 6.7u bf16). The model's RMS is the
  // scale of a cancelling sum: the conv bias before the batch norm has a gradient of zero in
  // exact arithmetic, and what any dtype computes is its rounding residue.
  // The max-pool reads the conv's output, 16-bit under autocast whatever follows it. (Behind the
  // batch norm, whose output is 16-bit too under autocast, a second rounding would make more pairs
  // of a window's values equal, and the pool routes the gradient to the first of equal values: a
  // discrete, data-dependent change of one gradient element per tie, of 16-bit activations in
  // general (PyTorch's too), which a tolerance relative to the largest gradient does not describe.
  // test_norm.cpp checks the 16-bit batch norm itself against the f32 path rounded once.)
  auto build = [] {
    default_generator().manual_seed(21);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Conv2d>(1, 4, 3, nn::Conv2dOptions{.padding = 1}));
    m->push_back(std::make_shared<nn::MaxPool2d>(2));
    m->push_back(std::make_shared<nn::BatchNorm2d>(4));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::AvgPool2d>(2));
    m->push_back(std::make_shared<nn::Flatten>());
    m->push_back(std::make_shared<nn::Linear>(4 * 2 * 2, 16));
    m->push_back(std::make_shared<nn::LayerNorm>(Shape{16}));
    m->push_back(std::make_shared<nn::GELU>());
    m->push_back(std::make_shared<nn::Linear>(16, 3));
    return m;
  };
  Generator g(8);
  const Tensor x = Tensor::randn({6, 1, 8, 8}, g);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2}, {6});
  // The gradients with autocast to t (none: no autocast), the model and input in param_t.
  auto grads = [&](std::optional<DType> t, DType param_t = DType::f32) {
    auto m = build();
    if (param_t != DType::f32) m->to(param_t);
    Tensor loss;
    {
      amp::Autocast ac(t.value_or(DType::bf16), t.has_value());
      Tensor out = (*m)(x.to(param_t));
      loss = ops::add(ops::cross_entropy(out, y),
                      ops::mse_loss(ops::softmax(out, 1), Tensor::full({6, 3}, 1.0 / 3).to(param_t)));
    }
    EXPECT_EQ(loss.dtype(), param_t);
    loss.backward();
    std::vector<std::vector<double>> out;
    for (const Tensor& p : m->parameters()) {
      EXPECT_EQ(p.grad().dtype(), param_t);  // cast back for the f32 parameters
      out.push_back(p.grad().to_vector_f64());
    }
    return out;
  };
  // The reference kernels: the fast paths are compared with them per dtype in test_kernels, and
  // oneDNN's primitive creation for every shape here would cost seconds.
  const kernels::Backend backend = kernels::backend();
  kernels::set_backend(kernels::Backend::ref);
  const auto ref = grads(std::nullopt, DType::f64);
  std::vector<double> rms(ref.size());
  double all = 0, count = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    for (double v : ref[i]) rms[i] += v * v;
    all += rms[i], count += double(ref[i].size());
    rms[i] = std::sqrt(rms[i] / double(ref[i].size()));
  }
  const double model_rms = std::sqrt(all / count);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const auto got = t == DType::f32 ? grads(std::nullopt) : grads(t);
    const double u = std::ldexp(1.0, t == DType::f32 ? -24 : t == DType::f16 ? -11 : -8);
    for (size_t i = 0; i < ref.size(); ++i)
      for (size_t j = 0; j < ref[i].size(); ++j)
        EXPECT_NEAR(got[i][j], ref[i][j], 16 * u * (std::fabs(ref[i][j]) + rms[i] + model_rms))
            << dtype_name(t) << " parameter " << i << " [" << j << "]";
  }
  kernels::set_backend(backend);
}
