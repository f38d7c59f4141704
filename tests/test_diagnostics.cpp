// Diagnostics: gradient statistics against the f16 limits, the scale trace, the autocast trace,
// optimizer-setting warnings, anomaly mode naming the op, and the CLI's --diagnose, metrics
// fields, presets and loss-scale flags on a small generated data set.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/diagnostics.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"

using namespace mixprec;
namespace fs = std::filesystem;

TEST(Diagnostics, GradientStatsClassifyAgainstF16Limits) {
  Tensor p = Tensor::zeros({8}).set_requires_grad();
  // Stored (scaled by 1024) values: 0, below 2^-25, subnormal, normal, 65520 (inf in f16), inf.
  p.set_grad(Tensor::from_vector(std::vector<float>{0.0f, 1e-8f, -1e-6f, 0.5f, 1.0f, -2.0f, 65520.0f, INFINITY}, {8}));
  const auto stats = amp::gradient_stats({{"w", p}}, 1024.0);
  ASSERT_EQ(stats.size(), 2u);
  const amp::GradStats& s = stats[0];
  EXPECT_EQ(s.name, "w");
  EXPECT_EQ(s.numel, 8);
  EXPECT_DOUBLE_EQ(s.zero, 1.0 / 8);
  EXPECT_DOUBLE_EQ(s.underflow, 2.0 / 8);           // 0 and 1e-8
  EXPECT_DOUBLE_EQ(s.subnormal, 1.0 / 8);           // 1e-6
  EXPECT_DOUBLE_EQ(s.overflow, 2.0 / 8);            // 65520 and inf
  EXPECT_DOUBLE_EQ(s.underflow_unscaled, 3.0 / 8);  // /1024: 1e-6 too
  EXPECT_DOUBLE_EQ(s.overflow_unscaled, 1.0 / 8);   // only inf
  EXPECT_DOUBLE_EQ(s.max_abs, 65520.0 / 1024);
  EXPECT_EQ(stats[1].name, "(all)");
  const std::string table = amp::format_gradient_stats(stats, 1024.0);
  EXPECT_NE(table.find("underflow"), std::string::npos);
  EXPECT_NE(table.find("(all)"), std::string::npos);
}

TEST(Diagnostics, ScaleTraceKeepsChangesAndSkips) {
  amp::ScaleTrace t;
  t.record(1, 65536, false);
  t.record(2, 65536, true);
  t.record(3, 32768, false);
  t.record(4, 32768, false);
  ASSERT_EQ(t.changes().size(), 2u);
  EXPECT_EQ(t.changes()[1], (std::pair<int64_t, double>{3, 32768}));
  EXPECT_EQ(t.skipped_steps(), std::vector<int64_t>{2});
  EXPECT_NE(t.summary().find("1 skipped step: 2"), std::string::npos) << t.summary();
}

TEST(Diagnostics, AutocastTraceListsOpsAndDtypes) {
  default_generator().manual_seed(0);
  nn::Sequential m(nn::Linear(4, 4), nn::ReLU());
  amp::start_trace();
  {
    amp::Autocast ac(DType::f16);
    ops::cross_entropy(m(Tensor::ones({2, 4})), Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}));
  }
  const auto trace = amp::stop_trace();
  const std::string table = amp::format_autocast_trace(trace);
  EXPECT_NE(table.find("linear"), std::string::npos) << table;
  EXPECT_NE(table.find("f32,f32,f32"), std::string::npos) << table;
  // cross_entropy reads the f16 logits and computes in f32 (class fp32), in one kernel of its own.
  bool linear_f16 = false, loss_f32 = false;
  for (const auto& e : trace) {
    linear_f16 = linear_f16 || (e.op == "linear" && e.run_dtype == "f16");
    loss_f32 = loss_f32 || (e.op == "cross_entropy" && e.input_dtypes == "f16" && e.run_dtype == "f32");
  }
  EXPECT_TRUE(linear_f16) << table;
  EXPECT_TRUE(loss_f32) << table;
}

TEST(Diagnostics, WarnsAboutSettingsA16BitParameterCannotHold) {
  auto warnings_for = [](const std::string& preset, optim::AdamWOptions o) {
    default_generator().manual_seed(0);
    nn::Sequential m(nn::Linear(4, 4));
    const amp::Precision p = amp::precision_preset(preset);
    amp::apply_precision(m, p);
    o.half = amp::half_param_options(p);
    optim::AdamW opt(m.parameters(), o);
    return amp::optimizer_warnings(opt);
  };
  // pure fp16 storage: eps 1e-8 is 0 in f16; a weight decay of 1e-5 per step is below half an ulp.
  const auto pure = warnings_for("pure-fp16", {.lr = 1e-3, .eps = 1e-8, .weight_decay = 1e-2});
  ASSERT_EQ(pure.size(), 2u);
  EXPECT_NE(pure[0].find("eps=1e-08 cannot be represented in f16"), std::string::npos) << pure[0];
  EXPECT_NE(pure[1].find("weight decay"), std::string::npos) << pure[1];
  // A master copy (or stochastic rounding) makes both harmless; f32 parameters too.
  EXPECT_TRUE(warnings_for("half-fp16", {.lr = 1e-3, .weight_decay = 1e-2}).empty());
  EXPECT_TRUE(warnings_for("fp32", {.lr = 1e-3, .weight_decay = 1e-2}).empty());
  EXPECT_TRUE(warnings_for("pure-bf16", {.lr = 1e-3, .weight_decay = 1e-2}).empty());
  // bf16 holds eps=1e-8 (f32's exponent range); a tiny lr makes Adam steps round away.
  const auto lr = warnings_for("pure-fp16", {.lr = 1e-6, .eps = 1e-4, .weight_decay = 0});
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_NE(lr[0].find("lr=1e-06"), std::string::npos) << lr[0];
}

TEST(Diagnostics, AnomalyModeNamesTheOpThatMadeNaN) {
  autograd::set_anomaly_enabled(true);
  Tensor x = Tensor::from_vector(std::vector<float>{1.0f, -1.0f}, {2}).set_requires_grad();
  try {
    ops::sum(ops::log(x));  // log(-1) = NaN in an fp32 forward pass
    ADD_FAILURE() << "expected an anomaly error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log produced NaN"), std::string::npos) << e.what();
  }
  autograd::set_anomaly_enabled(false);
}

// ---------------------------------------------------------------------------------------- CLI

namespace {

using clitest::run_cli;

class AmpCli : public clitest::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    clitest::write_dataset(dir_, "train", 400, 1);
    clitest::write_dataset(dir_, "t10k", 100, 2);
  }
  clitest::RunResult run(const std::string& args) { return run_cli(args, dir_); }
  std::vector<nlohmann::json> metrics() {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ / "m.jsonl");
    for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  std::string train(const std::string& extra) {
    return "train --data " + dir_.string() + " --epochs 1 --hidden 32 --batch-size 50 --threads 1 --metrics " +
           (dir_ / "m.jsonl").string() + " " + extra;
  }
};

}  // namespace

TEST_F(AmpCli, DiagnoseAndMetricsFields) {
  const clitest::RunResult r = run(train("--precision amp-fp16 --diagnose 4 --clip-grad-norm 10"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("loss scale dynamic (init 65536"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("autocast trace"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("diagnose step 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss scale 65536 (step 1)"), std::string::npos) << r.out;
  int steps = 0, diagnoses = 0;
  for (const auto& j : metrics()) {
    if (j.at("event") == "step") {
      ++steps;
      EXPECT_EQ(j.at("scale").get<double>(), 65536.0);
      EXPECT_FALSE(j.at("skipped").get<bool>());
      EXPECT_GT(j.at("grad_norm").get<double>(), 0.0);
    } else if (j.at("event") == "diagnose") {
      ++diagnoses;
      EXPECT_EQ(j.at("gradients").size(), 5u);  // 2 linears x (weight, bias) + (all)
    } else if (j.at("event") == "summary") {
      EXPECT_EQ(j.at("skipped_steps").get<int>(), 0);
    }
  }
  EXPECT_EQ(steps, 8);
  EXPECT_EQ(diagnoses, 3);  // steps 1, 4, 8
}

TEST_F(AmpCli, EveryPresetTrainsAndLossScaleFlagsWork) {
  for (const std::string p : {"fp32", "amp-bf16", "amp-fp16", "half-bf16", "half-fp16", "pure-bf16", "pure-fp16"}) {
    const clitest::RunResult r = run(train("--precision " + p + " --accumulate 2"));
    ASSERT_EQ(r.exit_code, 0) << p << ": " << r.err;
    const auto m = metrics();
    EXPECT_GT(m.back().at("test_accuracy").get<double>(), 0.5) << p;
    EXPECT_EQ(m.front().at("scale").get<double>(), p.find("fp16") != std::string::npos ? 65536.0 : 1.0) << p;
  }
  clitest::RunResult r = run(train("--precision amp-fp16 --loss-scale static:1024"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metrics().back().at("final_scale").get<double>(), 1024.0);
  r = run(train("--precision amp-bf16 --loss-scale dynamic --init-scale 8 --growth-interval 2 --hysteresis 2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metrics().back().at("final_scale").get<double>(), 8.0 * 16);  // 8 finite steps: 4 doublings
  for (const std::string bad : {"--loss-scale sometimes", "--loss-scale static:-1", "--precision fp32 --init-scale 4",
                                "--accumulate 0", "--precision half-fp16 --stochastic-rounding"}) {
    r = run(train(bad));
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
}

TEST_F(AmpCli, DetectAnomalyNamesTheForwardOp) {
  // A learning rate of 1e3 sends the weights to ~1e3 after one SGD step and to overflow soon
  // after: the first inf/NaN appears in a forward op, which anomaly mode names.
  const clitest::RunResult r = run(train("--precision fp32 --optimizer sgd --momentum 0 --lr 1000 --detect-anomaly"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("anomaly: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("produced NaN or inf"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(at step "), std::string::npos) << r.err;
}
