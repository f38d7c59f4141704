// Exact resume through the CLI: a run of 3 epochs against the same run stopped in the middle of
// an epoch, resumed, stopped at an epoch end, resumed again: the metrics (every step's loss and
// scale, every epoch's accuracy) and the final checkpoint are bit-identical, for mlp and cnn-bn
// (BatchNorm statistics, dropout) in fp32, amp-bf16, amp-fp16 (the scaler's scale and growth
// tracker continue) and pure-bf16 (the stochastic-rounding stream continues).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_util.h"
#include "mixprec/io.h"
#include "tensor_bytes.h"

namespace fs = std::filesystem;
using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::slurp;
using mixprec::clitest::write_dataset;
using mixprec::testutil::bytes_of;

namespace {

// The metrics lines without their timings (and without the summary, which is all timings and
// peaks), one string per line.
std::vector<std::string> metrics_lines(const fs::path& p) {
  std::vector<std::string> out;
  std::istringstream in(slurp(p));
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
    if (j.at("event") == "summary") continue;
    j.erase("seconds");
    out.push_back(j.dump());
  }
  return out;
}

class Resume : public mixprec::clitest::TempDirTest,
               public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(Resume, StoppedAndResumedRunIsBitIdentical) {
  const auto& [model, precision] = GetParam();
  // 12x12 images: cnn-bn's two pooling stages still apply, at a ninth of the 28x28 work.
  write_dataset(dir_, "train", 240, 1, 12);
  write_dataset(dir_, "t10k", 100, 2, 12);
  // 6 steps per epoch, 18 in all; the scale grows every 3 finite steps, so it changes across
  // the stops (and overflows now and then).
  std::string flags = "--data " + dir_.string() + " --model " + model + " --precision " + precision +
                      " --epochs 3 --batch-size 40 --threads 2";
  if (model == "mlp") flags += " --hidden 32";
  if (precision == "amp-fp16") flags += " --growth-interval 3";
  const fs::path full_st = dir_ / "full.st", part_st = dir_ / "part.st";
  const fs::path full_m = dir_ / "full.jsonl", part_m = dir_ / "part.jsonl";

  RunResult r = run_cli("train " + flags + " --metrics " + full_m.string() + " --save " + full_st.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Stopped at step 8 (mid-epoch 2), resumed and stopped at 12 (the end of epoch 2), resumed to the end.
  r = run_cli(
      "train " + flags + " --metrics " + part_m.string() + " --save " + part_st.string() + " --stop-after-steps 8",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stopped after step 8"), std::string::npos) << r.out;
  for (const char* more : {" --stop-after-steps 12", ""}) {
    r = run_cli(
        "train --resume " + part_st.string() + " --metrics " + part_m.string() + " --save " + part_st.string() + more,
        dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_NE(r.out.find("resumed from " + part_st.string() + ": epoch 3, step 12"), std::string::npos) << r.out;

  const std::vector<std::string> full = metrics_lines(full_m), part = metrics_lines(part_m);
  ASSERT_EQ(full.size(), 18u + 3u);  // every step, every epoch
  EXPECT_EQ(part, full);
  if (precision == "amp-fp16") {
    std::set<double> scales;
    for (const std::string& line : full) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("event") == "step" && j.at("step").get<int>() > 8) scales.insert(j.at("scale").get<double>());
    }
    EXPECT_GE(scales.size(), 2u) << "the scale should change after the first stop";
  }

  // The final checkpoints hold the same bits (but the training time).
  const mixprec::io::SafetensorsFile a = mixprec::io::load_safetensors(full_st.string());
  const mixprec::io::SafetensorsFile b = mixprec::io::load_safetensors(part_st.string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].first, b.tensors[i].first);
    if (a.tensors[i].first == "run.train_seconds") continue;
    EXPECT_EQ(bytes_of(a.tensors[i].second), bytes_of(b.tensors[i].second)) << a.tensors[i].first;
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndPresets, Resume,
                         ::testing::Combine(::testing::Values("mlp", "cnn-bn"),
                                            ::testing::Values("fp32", "amp-bf16", "amp-fp16", "pure-bf16")),
                         [](const auto& p) {
                           std::string n = std::get<0>(p.param) + "_" + std::get<1>(p.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
