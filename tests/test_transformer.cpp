// The GPT modules: nanoGPT's state_dict names and shapes, weight tying, the parameter count,
// GPT-2's initialisation statistics, causality, 16-bit presets keeping LayerNorm in f32, and a few
// training steps lowering the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"
#include "mixprec/random.h"
#include "mixprec/transformer.h"

using namespace mixprec;

namespace {

nn::GPTConfig small_config() {
  return {.vocab_size = 11, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.0, .bias = true};
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return s / double(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (const double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

}  // namespace

TEST(Transformer, StateDictHasNanoGptsNamesAndShapes) {
  default_generator().manual_seed(0);
  const nn::GPT gpt(small_config());
  std::vector<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight"};
  std::vector<Shape> shapes = {{11, 16}, {16, 16}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const auto& [n, s] : std::vector<std::pair<std::string, Shape>>{{"ln_1.weight", {16}},
                                                                         {"ln_1.bias", {16}},
                                                                         {"attn.c_attn.weight", {48, 16}},
                                                                         {"attn.c_attn.bias", {48}},
                                                                         {"attn.c_proj.weight", {16, 16}},
                                                                         {"attn.c_proj.bias", {16}},
                                                                         {"ln_2.weight", {16}},
                                                                         {"ln_2.bias", {16}},
                                                                         {"mlp.c_fc.weight", {64, 16}},
                                                                         {"mlp.c_fc.bias", {64}},
                                                                         {"mlp.c_proj.weight", {16, 64}},
                                                                         {"mlp.c_proj.bias", {16}}}) {
      expected.push_back(h + n);
      shapes.push_back(s);
    }
  }
  for (const char* n : {"transformer.ln_f.weight", "transformer.ln_f.bias"}) {
    expected.push_back(n);
    shapes.push_back({16});
  }
  expected.push_back("lm_head.weight");
  shapes.push_back({11, 16});
  const StateDict sd = gpt.state_dict();
  ASSERT_EQ(sd.size(), expected.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(sd[i].first, expected[i]);
    EXPECT_EQ(sd[i].second.shape(), shapes[i]) << expected[i];
  }
  // lm_head.weight is the token embedding itself (tied), and a parameter only once.
  EXPECT_EQ(sd.back().second.impl(), sd.front().second.impl());
  const auto params = gpt.named_parameters();
  EXPECT_EQ(params.size(), expected.size() - 1);
  for (const auto& [n, t] : params) EXPECT_NE(n, "lm_head.weight");
}

TEST(Transformer, ParameterCountOfTheRecipeModel) {
  // 4 layers, 4 heads, 128 wide, context 128, Moby Dick's 81 characters: the 0.8M. Every
  // unique tensor counts (nanoGPT's get_num_params would leave wpe's 128 x 128 out: 803,712).
  default_generator().manual_seed(0);
  const nn::GPT gpt({.vocab_size = 81, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128});
  const int64_t block = 2 * 2 * 128 + (128 * 384 + 384) + (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128);
  EXPECT_EQ(gpt.num_parameters(), 81 * 128 + 128 * 128 + 4 * block + 2 * 128);
  EXPECT_EQ(gpt.num_parameters(), 820096);
}

TEST(Transformer, Gpt2Initialisation) {
  default_generator().manual_seed(1);
  const nn::GPT gpt({.vocab_size = 81, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128});
  const double proj_std = 0.02 / std::sqrt(8.0);
  for (const auto& [name, t] : gpt.named_parameters()) {
    const std::vector<double> v = t.to_vector_f64();
    const bool bias = name.ends_with(".bias"), norm = name.find(".ln_") != std::string::npos;
    if (norm || bias) {
      const double want = norm && !bias ? 1.0 : 0.0;
      for (const double x : v) ASSERT_EQ(x, want) << name;
      continue;
    }
    const double want = name.ends_with("c_proj.weight") ? proj_std : 0.02;
    // At least 10,000 draws per tensor: the sample std is within 2% of sigma (more than 2.8 standard errors).
    ASSERT_GE(v.size(), 10000u) << name;
    EXPECT_NEAR(std_of(v), want, 0.02 * want) << name;
    EXPECT_NEAR(mean_of(v), 0.0, 4 * want / std::sqrt(double(v.size()))) << name;
  }
}

TEST(Transformer, LaterTokensDoNotChangeEarlierLogits) {
  default_generator().manual_seed(2);
  nn::GPT gpt(small_config());
  gpt.eval();
  const autograd::NoGradGuard no_grad;
  std::vector<int64_t> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = a;
  b[5] = 9;
  const std::vector<float> la = gpt(Tensor::from_vector(a, {1, 8})).to_vector();
  const std::vector<float> lb = gpt(Tensor::from_vector(b, {1, 8})).to_vector();
  ASSERT_EQ(la.size(), 8u * 11u);
  for (size_t i = 0; i < 5 * 11; ++i) ASSERT_EQ(la[i], lb[i]) << "position " << i / 11;
  bool later_differ = false;
  for (size_t i = 5 * 11; i < la.size(); ++i) later_differ = later_differ || la[i] != lb[i];
  EXPECT_TRUE(later_differ);
}

TEST(Transformer, RejectsBadInputs) {
  default_generator().manual_seed(3);
  nn::GPT gpt(small_config());
  EXPECT_THROW(gpt(Tensor::zeros({1, 17}, DType::i64)), Error);  // longer than block_size
  EXPECT_THROW(gpt(Tensor::zeros({1, 4})), Error);               // f32, not token indices
  EXPECT_THROW(nn::GPT({.vocab_size = 11, .n_head = 3, .n_embd = 16}), Error);
}

TEST(Transformer, HalfPresetsKeepLayerNormInF32) {
  default_generator().manual_seed(4);
  nn::GPT gpt(small_config());
  amp::apply_precision(gpt, amp::precision_preset("half-bf16"));
  for (const auto& [name, t] : gpt.named_parameters())
    EXPECT_EQ(t.dtype(), name.find(".ln_") != std::string::npos ? DType::f32 : DType::bf16) << name;
  Tensor loss;
  {
    amp::Autocast ac(DType::bf16);  // as the preset runs it
    const Tensor logits = gpt(Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2}));
    EXPECT_EQ(logits.shape(), (Shape{2, 2, 11}));
    loss = ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{2, 3, 4, 5}, {2, 2}));
  }
  loss.backward();
  for (const Tensor& p : gpt.parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(Transformer, AFewStepsLowerTheLoss) {
  // A cyclic text: each character predicts the next, which a 2-layer model learns in a few steps.
  default_generator().manual_seed(5);
  nn::GPT gpt(small_config());
  optim::AdamW opt(gpt.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t t = 0; t < 16; ++t) {
      x.push_back((b + t) % 11);
      y.push_back((b + t + 1) % 11);
    }
  const Tensor xt = Tensor::from_vector(x, {4, 16}), yt = Tensor::from_vector(y, {4, 16});
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    opt.zero_grad();
    const Tensor loss = ops::cross_entropy(gpt(xt), yt);
    (step == 0 ? first : last) = loss.item();
    loss.backward();
    opt.step();
  }
  EXPECT_NEAR(first, std::log(11.0), 0.3);  // near uniform at the start: small init
  EXPECT_LT(last, 0.5 * first);
}
