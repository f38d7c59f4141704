// `mixprec train --model gpt`, `sample`, `eval` and `bench` on a tiny model and a small text
// written here: eval lines, exact resume, every preset, the fenced device, deterministic samples,
// and the one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "mixprec/checkpoint.h"
#include "mixprec/io.h"
#include "mixprec/precision.h"
#include "tensor_bytes.h"

namespace fs = std::filesystem;
using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::slurp;

namespace {

// A small book: a header, the START and END lines, and a few thousand characters between.
void write_book(const fs::path& p) {
  std::ofstream f(p, std::ios::binary);
  f << "\xEF\xBB\xBFThe Project Gutenberg EBook of a test\r\n*** START OF THIS BOOK ***\r\n";
  const char* lines[] = {"Call me Ishmael. Some years ago, never mind how long precisely,",
                         "having little or no money in my purse, and nothing particular",
                         "to interest me on shore, I thought I would sail about a little",
                         "and see the watery part of the world."};
  for (int i = 0; i < 12; ++i)
    for (const char* l : lines) f << l << "\r\n";
  f << "*** END OF THIS BOOK ***\r\nlicence text\r\n";
}

class CliGpt : public mixprec::clitest::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    text_ = dir_ / "book.txt";
    write_book(text_);
  }
  // A 1-layer, 16-wide model on 16-character contexts: milliseconds per step.
  std::string tiny() const {
    return "--model gpt --text " + text_.string() +
           " --layers 1 --heads 2 --d-model 16 --block-size 16 --batch-size 8 --eval-batches 2 --lr-warmup 2 "
           "--threads 2";
  }
  fs::path text_;
};

std::vector<nlohmann::ordered_json> events(const fs::path& p) {
  std::vector<nlohmann::ordered_json> out;
  std::istringstream in(slurp(p));
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

// The metrics lines without the summary (timings and peaks), as strings.
std::vector<std::string> without_summary(const fs::path& p) {
  std::vector<std::string> out;
  for (const auto& j : events(p))
    if (j.at("event") != "summary") out.push_back(j.dump());
  return out;
}

}  // namespace

TEST_F(CliGpt, TrainsWithEvalLines) {
  const fs::path m = dir_ / "m.jsonl";
  const RunResult r =
      run_cli("train " + tiny() + " --steps 12 --eval-every 5 --precision fp32 --metrics " + m.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int steps = 0;
  std::vector<int> evals;
  double val = 0;
  for (const auto& j : events(m)) {
    if (j.at("event") == "step") {
      EXPECT_EQ(j.at("step").get<int>(), ++steps);
      EXPECT_FALSE(j.contains("epoch"));  // a run of steps
      EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
    } else if (j.at("event") == "eval") {
      evals.push_back(j.at("step").get<int>());
      val = j.at("val_loss").get<double>();
      EXPECT_TRUE(std::isfinite(val));
    } else {
      EXPECT_EQ(j.at("event"), "summary");
      EXPECT_EQ(j.at("model"), "gpt");
      EXPECT_EQ(j.at("val_loss").get<double>(), val);
    }
  }
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(evals, (std::vector<int>{5, 10, 12}));  // every 5 steps and at the last
  EXPECT_NE(r.out.find("step 5: validation loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 12: validation loss"), std::string::npos) << r.out;
  // The preprocessed book: 48 lines of text, the header and licence gone.
  EXPECT_NE(r.out.find("(vocabulary "), std::string::npos) << r.out;
}

TEST_F(CliGpt, StoppedAndResumedRunIsBitIdentical) {
  for (const char* precision : {"amp-bf16", "amp-fp16"}) {
    // Dropout draws and the fp16 scale (growing every 3 steps) must continue across the stops.
    const std::string flags = "train " + tiny() + " --steps 12 --eval-every 4 --dropout 0.1 --precision " + precision +
                              (std::string(precision) == "amp-fp16" ? " --growth-interval 3" : "");
    const fs::path full_m = dir_ / "full.jsonl", part_m = dir_ / "part.jsonl";
    const fs::path full_st = dir_ / "full.st", part_st = dir_ / "part.st";
    RunResult r = run_cli(flags + " --metrics " + full_m.string() + " --save " + full_st.string(), dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Stopped at step 5 (between evaluations), resumed to 8 (an evaluation), resumed to the end.
    r = run_cli(flags + " --metrics " + part_m.string() + " --save " + part_st.string() + " --stop-after-steps 5",
                dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* more : {" --stop-after-steps 8", ""}) {
      r = run_cli(
          "train --resume " + part_st.string() + " --metrics " + part_m.string() + " --save " + part_st.string() + more,
          dir_);
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    EXPECT_NE(r.out.find("resumed from " + part_st.string() + ": step 8"), std::string::npos) << r.out;
    const std::vector<std::string> full = without_summary(full_m);
    EXPECT_EQ(full.size(), 12u + 3u) << precision;
    EXPECT_EQ(without_summary(part_m), full) << precision;
    const auto a = mixprec::io::load_safetensors(full_st.string()), b = mixprec::io::load_safetensors(part_st.string());
    const auto ma = mixprec::Checkpoint::model_tensors(a.tensors), mb = mixprec::Checkpoint::model_tensors(b.tensors);
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i)
      EXPECT_EQ(mixprec::testutil::bytes_of(ma[i].second), mixprec::testutil::bytes_of(mb[i].second)) << ma[i].first;
    // A resumed run keeps its settings.
    r = run_cli("train --resume " + part_st.string() + " --layers 2", dir_);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--layers 2 differs from the checkpoint's 1"), std::string::npos) << r.err;
  }
}

TEST_F(CliGpt, EveryPresetTrains) {
  for (const std::string& p : mixprec::amp::precision_preset_names()) {
    const fs::path m = dir_ / (p + ".jsonl");
    const RunResult r =
        run_cli("train " + tiny() + " --steps 3 --eval-every 3 --precision " + p + " --metrics " + m.string(), dir_);
    ASSERT_EQ(r.exit_code, 0) << p << ": " << r.err;
    const auto ev = events(m);
    ASSERT_GE(ev.size(), 2u);
    EXPECT_EQ(ev[ev.size() - 2].at("event"), "eval") << p;
    EXPECT_TRUE(std::isfinite(ev[ev.size() - 2].at("val_loss").get<double>())) << p;
  }
}

TEST_F(CliGpt, FencedDeviceGivesTheCpuLossesBitForBit) {
  for (const char* precision : {"fp32", "amp-bf16"}) {
    std::vector<std::vector<std::string>> runs;
    for (const char* device : {"cpu", "fenced"}) {
      const fs::path m = dir_ / (std::string(device) + ".jsonl");
      const RunResult r = run_cli("train " + tiny() + " --steps 3 --eval-every 3 --dropout 0.1 --precision " +
                                      precision + " --device " + device + " --metrics " + m.string(),
                                  dir_);
      ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
      runs.push_back(without_summary(m));
    }
    EXPECT_EQ(runs[0], runs[1]) << precision;
  }
}

TEST_F(CliGpt, DiagnosePrintsTheAutocastTrace) {
  const RunResult r = run_cli("train " + tiny() + " --steps 3 --eval-every 3 --precision amp-bf16 --diagnose 1", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("autocast trace (step 1, forward)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer_norm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("diagnose step 1"), std::string::npos) << r.out;
}

TEST_F(CliGpt, SampleIsDeterministicAndEvalGivesTheRunsLoss) {
  const fs::path st = dir_ / "ck.st", m = dir_ / "m.jsonl";
  RunResult r = run_cli("train " + tiny() + " --steps 6 --eval-every 6 --precision amp-bf16 --save " + st.string() +
                            " --metrics " + m.string(),
                        dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string sample = "sample --checkpoint " + st.string() + " --prompt 'Call me' --tokens 40 --top-k 5";
  const RunResult a = run_cli(sample + " --seed 7", dir_), b = run_cli(sample + " --seed 7", dir_);
  const RunResult c = run_cli(sample + " --seed 8 --temperature 2", dir_);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_EQ(a.out.rfind("Call me", 0), 0u) << a.out;
  EXPECT_EQ(a.out.size(), 7u + 40u + 1u);  // the prompt, 40 ASCII characters, a newline
  // A prompt longer than the block size is cropped to it.
  r = run_cli("sample --checkpoint " + st.string() + " --prompt 'Call me Ishmael. Some years ago' --tokens 3", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_cli("sample --checkpoint " + st.string() + " --prompt 'Call me X'", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("mixprec sample: error: --prompt: character 8, 'X' (U+0058), is not in the vocabulary of ", 0),
            0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // nanoGPT's two AdamW groups: weight decay 0.1 on the 6 matrices (wte, wpe and the block's four
  // Linear weights), none on the 10 biases and LayerNorm tensors.
  const auto ck = mixprec::io::load_safetensors(st.string());
  auto entry = [&](const std::string& name) {
    for (const auto& [n, t] : ck.tensors)
      if (n == name) return t;
    ADD_FAILURE() << "no " << name;
    return mixprec::Tensor();
  };
  EXPECT_EQ(entry("optimizer.param_groups.0.weight_decay").item(), 0.1);
  EXPECT_EQ(entry("optimizer.param_groups.1.weight_decay").item(), 0.0);
  EXPECT_EQ(entry("optimizer.param_groups.0.params").numel(), 6);
  EXPECT_EQ(entry("optimizer.param_groups.1.params").numel(), 10);
  // eval of the checkpoint: the validation loss of the run's last evaluation, bit for bit.
  r = run_cli("eval --checkpoint " + st.string() + " --json", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ev = events(m);
  EXPECT_EQ(nlohmann::json::parse(r.out).at("val_loss").get<double>(), ev[ev.size() - 2].at("val_loss").get<double>());
}

TEST_F(CliGpt, BenchPrintsOneJsonObject) {
  const RunResult r = run_cli(
      "bench --model gpt --layers 1 --heads 2 --d-model 16 --block-size 32 --batch-size 4 --steps 2 --warmup 1 "
      "--precision amp-bf16 --threads 2",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("model"), "gpt");
  EXPECT_EQ(j.at("block_size"), 32);
  EXPECT_EQ(j.at("vocab_size"), 81);
  EXPECT_GT(j.at("category_peak_bytes").at("activations").get<int64_t>(), 0);
  EXPECT_GT(j.at("tokens_per_s").at("median").get<double>(), 0.0);
}

TEST_F(CliGpt, BadTextIsOneLine) {
  const std::string missing = (dir_ / "none.txt").string();
  RunResult r = run_cli("train --model gpt --text " + missing + " --steps 1", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "mixprec train: error: " + missing +
                       ": cannot open the text file (missing? the default comes from scripts/dev.sh)\n");
  r = run_cli("train --model gpt --text " + text_.string() + " --block-size 1000 --steps 1", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(text_.string() + ": its validation split holds"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_cli("train --model gpt --layers 2 --epochs 3 --steps 1", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown flag --epochs"), std::string::npos) << r.err;
  r = run_cli("train --model mlp --layers 2", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown flag --layers"), std::string::npos) << r.err;
}
