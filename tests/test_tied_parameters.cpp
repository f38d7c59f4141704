// Tied parameters (a GPT's lm_head.weight = transformer.wte.weight): one tensor under two names is
// one parameter for named_parameters()/parameters()/num_parameters() and the optimizer (PyTorch's
// remove_duplicate), two keys in state_dict() and in a checkpoint file (as PyTorch's), loads from
// both keys, stays one tensor through Module::to, and gets the sum of both uses' gradients once.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "error_text.h"
#include "mixprec/checkpoint.h"
#include "mixprec/io.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using testutil::bytes_of;
using testutil::error_of;

// A tiny language model: token embedding, a non-linearity, the output head sharing the
// embedding's [V, D] weight (nanoGPT's tying, with its names' shape).
class TiedLm : public nn::Module {
 public:
  TiedLm(int64_t vocab, int64_t dim) {
    wte = std::make_shared<nn::Embedding>(vocab, dim);
    head = std::make_shared<nn::Linear>(dim, vocab, nn::LinearOptions{.bias = false});
    register_module("wte", wte);
    register_module("lm_head", head);
    set_parameter("lm_head.weight", wte->weight);
  }
  Tensor forward(const Tensor& idx) override { return (*head)(ops::gelu((*wte)(idx), true)); }
  std::string name() const override { return "TiedLm"; }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> head;
};

const Tensor& tokens() {
  static const Tensor t = Tensor::from_vector(std::vector<int64_t>{1, 4, 4, 0, 2, 6, 1, 1}, {2, 4});
  return t;
}
const Tensor& next_tokens() {
  static const Tensor t = Tensor::from_vector(std::vector<int64_t>{4, 4, 0, 2, 6, 1, 1, 3}, {2, 4});
  return t;
}

TEST(TiedParameters, OneParameterTwoStateDictKeys) {
  default_generator().manual_seed(1);
  TiedLm m(7, 5);
  EXPECT_EQ(m.head->weight.impl(), m.wte->weight.impl()) << "the layer's member follows set_parameter";
  const nn::NamedTensors p = m.named_parameters();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].first, "wte.weight");  // the first name, as PyTorch's named_parameters
  EXPECT_EQ(m.parameters().size(), 1u);
  EXPECT_EQ(m.num_parameters(), 7 * 5);
  const StateDict sd = m.state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd[0].first, "wte.weight");
  EXPECT_EQ(sd[1].first, "lm_head.weight");
  EXPECT_EQ(sd[0].second.impl(), sd[1].second.impl());
}

TEST(TiedParameters, SetParameterErrorsAreOneLine) {
  TiedLm m(7, 5);
  EXPECT_EQ(error_of([&] {
              m.set_parameter("lm_head.weight", Tensor::zeros({5, 7}));
            }),
            "Module.set_parameter: 'weight' is [7, 5], the new tensor [5, 7]");
  EXPECT_EQ(error_of([&] { m.set_parameter("lm_head.bias", Tensor::zeros({7})); }),
            "Module.set_parameter: Linear(in_features=5, out_features=7, bias=False) has no parameter 'bias'");
  EXPECT_EQ(error_of([&] {
              m.set_parameter("head.weight", Tensor::zeros({7, 5}));
            }),
            "Module.set_parameter: no submodule 'head' in TiedLm");
}

// The tied tensor's gradient is the sum of the embedding's and the head's, accumulated once:
// the same as one leaf used in both places by hand.
TEST(TiedParameters, GradientIsTheSumOfBothUses) {
  default_generator().manual_seed(2);
  TiedLm m(7, 5);
  ops::cross_entropy(m(tokens()), next_tokens()).backward();
  Tensor w = m.wte->weight.detach().clone().set_requires_grad();
  ops::cross_entropy(ops::linear(ops::gelu(ops::embedding(w, tokens()), true), w), next_tokens()).backward();
  EXPECT_EQ(bytes_of(m.wte->weight.grad()), bytes_of(w.grad()));
  // Neither use alone gives it.
  Tensor only_head = m.wte->weight.detach().clone().set_requires_grad();
  ops::cross_entropy(ops::linear(ops::gelu(ops::embedding(m.wte->weight.detach(), tokens()), true), only_head),
                     next_tokens())
      .backward();
  EXPECT_NE(bytes_of(only_head.grad()), bytes_of(w.grad()));
}

// A few AdamW steps on the module equal the same steps on one hand-tied leaf: the optimizer sees
// the tensor once (a duplicate would be stepped twice).
TEST(TiedParameters, AdamWStepsMatchOneLeafUsedTwice) {
  default_generator().manual_seed(3);
  TiedLm m(7, 5);
  Tensor w = m.wte->weight.detach().clone().set_requires_grad();
  optim::AdamW opt(m.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  optim::AdamW ref(std::vector<Tensor>{w}, {.lr = 1e-2, .weight_decay = 0.1});
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    ref.zero_grad();
    const Tensor a = ops::cross_entropy(m(tokens()), next_tokens());
    const Tensor b = ops::cross_entropy(ops::linear(ops::gelu(ops::embedding(w, tokens()), true), w), next_tokens());
    EXPECT_EQ(a.item(), b.item()) << "step " << step;
    a.backward();
    b.backward();
    opt.step();
    ref.step();
  }
  EXPECT_EQ(bytes_of(m.wte->weight), bytes_of(w));
  EXPECT_EQ(m.head->weight.impl(), m.wte->weight.impl());
}

TEST(TiedParameters, LoadStateDictWantsBothKeys) {
  default_generator().manual_seed(4);
  TiedLm a(7, 5), b(7, 5);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(bytes_of(b.wte->weight), bytes_of(a.wte->weight));
  EXPECT_EQ(b.head->weight.impl(), b.wte->weight.impl());
  StateDict one = a.state_dict();
  one.pop_back();
  EXPECT_EQ(error_of([&] { b.load_state_dict(one); }), "Module.load_state_dict: missing key 'lm_head.weight'");
}

// Converting the tied tensor meets it under both names: it converts once and stays one tensor.
TEST(TiedParameters, ToDtypeAndDeviceKeepOneTensor) {
  default_generator().manual_seed(5);
  TiedLm m(7, 5);
  const std::vector<uint8_t> f32_bytes = bytes_of(m.wte->weight);
  m.to(DType::bf16);
  EXPECT_EQ(m.wte->weight.dtype(), DType::bf16);
  EXPECT_EQ(m.head->weight.impl(), m.wte->weight.impl());
  for (const auto& [n, t] : m.state_dict()) EXPECT_EQ(t.dtype(), DType::bf16) << n;
  m.to(DType::f32);
  m.to(Device::fenced());
  EXPECT_EQ(m.wte->weight.device(), Device::fenced());
  EXPECT_EQ(m.head->weight.impl(), m.wte->weight.impl());
  m.to(Device::cpu());
  // f32 -> bf16 -> f32 rounds once; the tensor was not converted twice on the way (that would be
  // the same here), and it is one tensor, so the two names agree.
  const StateDict sd = m.state_dict();
  EXPECT_EQ(bytes_of(sd[0].second), bytes_of(sd[1].second));
  EXPECT_EQ(bytes_of(m.wte->weight), bytes_of(m.wte->weight.to(DType::bf16).to(DType::f32)));
  EXPECT_NE(bytes_of(m.wte->weight), f32_bytes) << "the bf16 rounding happened";
}

// A checkpoint stores both model names (two safetensors entries of the same bytes) and the
// optimizer state once, under the first name; it loads back into a fresh model and training
// continues with the same losses.
TEST(TiedParameters, CheckpointRoundTrip) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mixprec_tied_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  default_generator().manual_seed(6);
  TiedLm a(7, 5);
  optim::AdamW opt_a(a.parameters(), {.lr = 1e-2});
  auto step = [](TiedLm& m, optim::AdamW& opt) {
    opt.zero_grad();
    const Tensor loss = ops::cross_entropy(m(tokens()), next_tokens());
    loss.backward();
    opt.step();
    return loss.item();
  };
  step(a, opt_a);
  Checkpoint(a, &opt_a, nullptr, nullptr).save(path);
  const io::SafetensorsFile file = io::load_safetensors(path);
  std::vector<std::string> names;
  for (const auto& [n, t] : file.tensors) names.push_back(n);
  EXPECT_NE(std::find(names.begin(), names.end(), "wte.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "optimizer.wte.weight.exp_avg"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "optimizer.lm_head.weight.exp_avg"), names.end());

  default_generator().manual_seed(99);
  TiedLm b(7, 5);
  optim::AdamW opt_b(b.parameters(), {.lr = 1e-2});
  Checkpoint(b, &opt_b, nullptr, nullptr).load(path);
  EXPECT_EQ(bytes_of(b.wte->weight), bytes_of(a.wte->weight));
  EXPECT_EQ(b.head->weight.impl(), b.wte->weight.impl());
  EXPECT_EQ(step(b, opt_b), step(a, opt_a));
  EXPECT_EQ(bytes_of(b.wte->weight), bytes_of(a.wte->weight));
  std::filesystem::remove(path);
}

// save_safetensors of a state_dict whose two keys hold one tensor writes two entries, each with
// the tensor's bytes (PyTorch's load_state_dict reads such a file into a tied model).
TEST(TiedParameters, SafetensorsWritesBothEntries) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mixprec_tied_sd_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  default_generator().manual_seed(7);
  TiedLm m(7, 5);
  io::save_safetensors(path, m.state_dict());
  const io::SafetensorsFile file = io::load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 2u);
  for (const auto& [n, t] : file.tensors) EXPECT_EQ(bytes_of(t), bytes_of(m.wte->weight)) << n;
  TiedLm fresh(7, 5);
  fresh.load_state_dict(file.tensors);
  EXPECT_EQ(bytes_of(fresh.wte->weight), bytes_of(m.wte->weight));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace mixprec
