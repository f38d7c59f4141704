// mixprec::Checkpoint: the names in the file (model names, optimizer state by parameter name,
// scaler, generator), a round trip through a file that continues training bit-exactly, and the
// one-line errors (another model's tensors listed by name, state of an unknown parameter, a
// disabled scaler, reserved names).
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "error_text.h"
#include "mixprec/checkpoint.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/precision.h"
#include "tensor_bytes.h"

using namespace mixprec;
using testutil::bytes_of;
namespace fs = std::filesystem;

namespace {

using testutil::error_of;

// A small model with every kind of state: a 16-bit Linear (master copies), a BatchNorm (running
// statistics, an i64 counter) and dropout (the generator).
struct TinyRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<amp::GradScaler> scaler;

  explicit TinyRun(uint64_t seed) {
    default_generator().manual_seed(seed);
    model = std::make_shared<nn::Sequential>(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(),
                                             nn::Flatten(), nn::Dropout(0.25), nn::Linear(4 * 6 * 6, 3));
    const amp::Precision p = amp::precision_preset("half-fp16");
    amp::apply_precision(*model, p);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.half = amp::half_param_options(p)});
    amp::GradScalerOptions so;
    so.init_scale = 1024;  // no overflow at the first step, so the optimizer state exists
    so.growth_interval = 2;
    scaler = std::make_unique<amp::GradScaler>(so);
  }
  Checkpoint checkpoint() { return Checkpoint(*model, opt.get(), scaler.get()); }

  // A training step on fixed data (the dropout mask comes from the default generator); its loss.
  double step(int k) {
    Generator g(100 + uint64_t(k));
    const Tensor x = Tensor::randn({8, 1, 6, 6}, g, DType::f16);
    const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8});
    opt->zero_grad();
    const Tensor loss = ops::cross_entropy((*model)(x), y);
    scaler->scale(loss).backward();
    scaler->step(*opt);
    scaler->update();
    return loss.item();
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mixprec_ckpt_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

}  // namespace

TEST_F(CheckpointTest, NamesFollowPyTorchAndTheParameters) {
  TinyRun r(1);
  r.step(0);
  const StateDict sd = r.checkpoint().state_dict({{"run.epoch", state_i64(3)}});
  std::vector<std::string> names;
  for (const auto& [k, t] : sd) names.push_back(k);
  const std::vector<std::string> expected = {
      // the model, in its own dtypes
      "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
      "5.weight", "5.bias",
      // the optimizer: step count, group, then per parameter name
      "optimizer.step", "optimizer.param_groups.0.lr", "optimizer.param_groups.0.weight_decay",
      "optimizer.param_groups.0.params", "optimizer.0.weight.master", "optimizer.0.weight.exp_avg",
      "optimizer.0.weight.exp_avg_sq", "optimizer.0.bias.master", "optimizer.0.bias.exp_avg",
      "optimizer.0.bias.exp_avg_sq", "optimizer.1.weight.exp_avg", "optimizer.1.weight.exp_avg_sq",
      "optimizer.1.bias.exp_avg", "optimizer.1.bias.exp_avg_sq", "optimizer.5.weight.master",
      "optimizer.5.weight.exp_avg", "optimizer.5.weight.exp_avg_sq", "optimizer.5.bias.master",
      "optimizer.5.bias.exp_avg", "optimizer.5.bias.exp_avg_sq",
      // the scaler (PyTorch's keys first), the generator, the caller's
      "scaler.scale", "scaler.growth_factor", "scaler.backoff_factor", "scaler.growth_interval",
      "scaler._growth_tracker", "scaler.dynamic", "scaler.hysteresis", "scaler._hysteresis_left", "scaler.min_scale",
      "scaler.max_scale", "scaler.error_at_min_scale", "scaler._skipped_steps", "scaler._overflows", "scaler._updates",
      "rng.seed", "rng.stream", "rng.offset", "run.epoch"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(find_state(sd, "0.weight")->dtype(), DType::f16);  // stored as trained
  EXPECT_EQ(find_state(sd, "1.weight")->dtype(), DType::f32);  // norms stay f32
  EXPECT_EQ(find_state(sd, "optimizer.0.weight.master")->dtype(), DType::f32);
  EXPECT_EQ(Checkpoint::model_tensors(sd).size(), 9u);
}

TEST_F(CheckpointTest, RoundTripThroughAFileContinuesBitExactly) {
  // One run of 8 steps, saved after 3; then a run restored from the file takes steps 3..7.
  // (One after the other: both draw dropout masks from this thread's default generator.)
  TinyRun a(2);
  for (int k = 0; k < 3; ++k) a.step(k);
  a.checkpoint().save(path("a.st"), {{"note", "three steps"}}, {{"run.step", state_i64(3)}});
  std::vector<double> losses_a, losses_b;
  for (int k = 3; k < 8; ++k) losses_a.push_back(a.step(k));

  TinyRun b(99);  // another seed: every value must come from the file
  const io::SafetensorsFile f = b.checkpoint().load(path("a.st"));
  EXPECT_EQ(f.metadata.at("note"), "three steps");
  EXPECT_EQ(state_to_i64(*find_state(f.tensors, "run.step")), 3);
  for (int k = 3; k < 8; ++k) losses_b.push_back(b.step(k));
  EXPECT_EQ(losses_a, losses_b);
  EXPECT_EQ(a.scaler->get_scale(), b.scaler->get_scale());
  EXPECT_NE(a.scaler->get_scale(), 65536.0);  // grew (every 2 steps) or backed off: the state mattered
  const StateDict sa = a.checkpoint().state_dict(), sb = b.checkpoint().state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(bytes_of(sa[i].second), bytes_of(sb[i].second)) << sa[i].first;
}

TEST_F(CheckpointTest, AnotherModelIsRefusedListingTheNames) {
  TinyRun a(3);
  a.checkpoint().save(path("a.st"));
  default_generator().manual_seed(0);
  nn::Sequential other(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(), nn::Linear(4 * 6 * 6, 5));
  optim::AdamW opt(other.parameters());
  const std::string e = error_of([&] { Checkpoint(other, &opt, nullptr).load(path("a.st")); });
  EXPECT_NE(e.find(path("a.st") + " does not hold this model's tensors"), std::string::npos) << e;
  EXPECT_NE(e.find("missing 3.weight, 3.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected 1.weight, 1.bias, 1.running_mean, 1.running_var, 1.num_batches_tracked, 5.weight, "
                   "5.bias"),
            std::string::npos)
      << e;
  // Same names, other shapes.
  nn::Sequential wider(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(),
                       nn::Dropout(0.25), nn::Linear(4 * 6 * 6, 5));
  const std::string e2 = error_of([&] { Checkpoint(wider, nullptr, nullptr, nullptr).load(path("a.st")); });
  EXPECT_NE(e2.find("other shape 5.weight [3, 144] (model: [5, 144]), 5.bias [3] (model: [5])"), std::string::npos)
      << e2;
}

TEST_F(CheckpointTest, PartsMustMatchTheFile) {
  TinyRun a(4);
  a.step(0);
  StateDict sd = a.checkpoint().state_dict();
  TinyRun b(4);
  // Optimizer state of a parameter that the model does not have.
  StateDict bad = sd;
  for (auto& [k, t] : bad)
    if (k == "optimizer.5.bias.exp_avg") k = "optimizer.7.bias.exp_avg";
  EXPECT_NE(error_of([&] {
              b.checkpoint().load_state_dict(bad, "f.st");
            }).find("f.st: 'optimizer.7.bias.exp_avg' is the state of no parameter of this optimizer"),
            std::string::npos);
  // A file with scaler state into a disabled scaler, and the other way round.
  amp::GradScaler off(amp::GradScalerOptions{.enabled = false});
  EXPECT_NE(error_of([&] {
              Checkpoint(*b.model, b.opt.get(), &off).load_state_dict(sd, "f.st");
            }).find("f.st holds GradScaler state (scaler.*) but this GradScaler is disabled"),
            std::string::npos);
  std::erase_if(sd, [](const auto& e) { return e.first.rfind("scaler.", 0) == 0; });
  EXPECT_NE(error_of([&] {
              b.checkpoint().load_state_dict(sd, "f.st");
            }).find("f.st holds no GradScaler state (scaler.*) but this GradScaler is enabled"),
            std::string::npos);
  // The model alone loads from any of them (eval, export).
  Checkpoint(*b.model, nullptr, nullptr, nullptr).load_state_dict(sd);
  EXPECT_EQ(bytes_of(b.model->state_dict()[0].second), bytes_of(a.model->state_dict()[0].second));
}

TEST_F(CheckpointTest, ReservedNamesAreRefused) {
  struct Holder : nn::Module {
    Holder() { register_module("optimizer", std::make_shared<nn::Linear>(2, 2)); }
    Tensor forward(const Tensor& x) override { return x; }
    std::string name() const override { return "Holder"; }
  };
  Holder h;
  EXPECT_NE(error_of([&] { Checkpoint c(h); }).find("'optimizer.weight' starts with a prefix the checkpoint keeps"),
            std::string::npos);
  TinyRun a(5);
  EXPECT_NE(error_of([&] {
              a.checkpoint().state_dict({{"epoch", state_i64(1)}});
            }).find("the caller's entry 'epoch' must be named run.<key>"),
            std::string::npos);
  // An optimizer over a tensor that is not the model's.
  Tensor stray = Tensor::zeros({2}).set_requires_grad();
  optim::SGD sgd({stray});
  EXPECT_NE(error_of([&] { Checkpoint c(*a.model, &sgd); }).find("the optimizer's parameter 0 is not a parameter"),
            std::string::npos);
}
