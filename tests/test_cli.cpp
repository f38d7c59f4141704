// End-to-end tests of the CLI binary: a short training run on a small idx data set made
// here, the metrics file, and the one-line errors for bad input.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "mixprec/data.h"

namespace fs = std::filesystem;

namespace {

using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::slurp;
using mixprec::clitest::write_dataset;

class Cli : public mixprec::clitest::TempDirTest {};

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

// The help text with each run of whitespace as one space: a description wraps where it likes.
std::string squeezed(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c)) || (!out.empty() && out.back() != ' '))
      out += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
  return out;
}

}  // namespace

// --channels-last changes the cnn's layout, not its arithmetic on the CPU (which computes in
// NCHW and copies): every logged loss and the test accuracy are the NCHW run's, to the last bit.
TEST_F(Cli, ChannelsLastTrainsTheCnnToTheSameLosses) {
  write_dataset(dir_, "train", 400, 1);
  write_dataset(dir_, "t10k", 100, 2);
  std::vector<std::string> runs;
  for (const char* layout : {"", " --channels-last"}) {
    const fs::path metrics = dir_ / (std::string(*layout ? "cl" : "nchw") + ".jsonl");
    RunResult r =
        run_cli("train --data " + dir_.string() +
                    " --model cnn --channels 8,16 --epochs 1 --batch-size 40 --precision amp-bf16 --metrics " +
                    metrics.string() + " --log-every 2" + layout,
                dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream f(metrics);
    std::string line, losses;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.at("event") == "step") losses += j.at("loss").dump() + " ";
      if (j.at("event") == "epoch") losses += j.at("test_accuracy").dump() + " " + j.at("test_loss").dump();
    }
    runs.push_back(losses);
  }
  EXPECT_FALSE(runs[0].empty());
  EXPECT_EQ(runs[1], runs[0]);
}

TEST_F(Cli, TrainsAndWritesMetrics) {
  write_dataset(dir_, "train", 1000, 1);
  write_dataset(dir_, "t10k", 300, 2);
  for (const char* precision : {"fp32", "amp-bf16"}) {
    const fs::path metrics = dir_ / (std::string(precision) + ".jsonl");
    RunResult r = run_cli("train --data " + dir_.string() + " --epochs 2 --hidden 32 --batch-size 50 --precision " +
                              precision + " --metrics " + metrics.string() + " --log-every 5",
                          dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream f(metrics);
    std::string line;
    int steps = 0, epochs = 0, summaries = 0;
    double acc = 0;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      const std::string ev = j.at("event");
      if (ev == "step") {
        ++steps;
        EXPECT_EQ(j.at("step").get<int>() % 5, 0);
        EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
      } else if (ev == "epoch") {
        ++epochs;
        acc = j.at("test_accuracy").get<double>();
        EXPECT_GT(j.at("seconds").get<double>(), 0.0);
      } else if (ev == "summary") {
        ++summaries;
        EXPECT_EQ(j.at("precision").get<std::string>(), precision);
        EXPECT_GT(j.at("peak_bytes").at("total").get<int64_t>(), 0);
        EXPECT_GT(j.at("peak_bytes").at("parameters").get<int64_t>(), 4 * (784 * 32 + 32 * 10));
        EXPECT_GT(j.at("samples_per_s").get<double>(), 0.0);
      }
    }
    EXPECT_EQ(steps, 2 * 20 / 5);  // 1000/50 = 20 steps per epoch, every 5th logged
    EXPECT_EQ(epochs, 2);
    EXPECT_EQ(summaries, 1);
    EXPECT_GT(acc, 0.9) << precision;  // the bands are easy: chance is 0.1
    EXPECT_NE(r.out.find("test accuracy"), std::string::npos);
  }
}

TEST_F(Cli, BenchPrintsOneJsonObject) {
  RunResult r = run_cli("bench --hidden 16 --batch-size 8 --steps 3 --warmup 1 --precision fp32", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("impl"), "mixprec");
  EXPECT_GT(j.at("steps_per_s").at("median").get<double>(), 0.0);
  EXPECT_GE(j.at("step_ms").at("median").get<double>(), j.at("step_ms").at("best").get<double>());
  EXPECT_GT(j.at("peak_bytes").at("total").get<int64_t>(), 0);
}

// --profile: the kernels of the step by phase, their rates, and the step's against the host's
// matmul; the table by default, the object with --json.
TEST_F(Cli, BenchProfileSumsTheStepsKernelsAgainstTheHostsMatmul) {
  const std::string bench = "bench --hidden 32,32 --batch-size 16 --steps 2 --warmup 1 --precision amp-bf16 --profile";
  RunResult r = run_cli(bench + " --json", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& p = j.at("profile");
  EXPECT_GT(p.at("reference_gflops").get<double>(), 0.0);
  EXPECT_EQ(p.at("reference_dtype"), "bf16");
  // The mlp's three linear layers (784 -> 32 -> 32 -> 10) at batch 16: forward, then both
  // gradients of the hidden layers' products and the first layer's weight gradient.
  const double forward = 2.0 * 16 * (784 * 32 + 32 * 32 + 32 * 10);
  const double backward = 2.0 * 16 * (784 * 32 + 2 * 32 * 32 + 2 * 32 * 10);
  EXPECT_NEAR(p.at("gflop_per_step").get<double>(), (forward + backward) / 1e9, 1e-12);
  // One row per implementation: on an AMX host oneDNN runs the 784 -> 32 and 32 -> 32 products on
  // AMX tiles and the 32 -> 10 one with AVX512-BF16, so the forward matmuls may be two rows.
  double forward_calls = 0.0, forward_gflop = 0.0, kernel_ms = 0.0;
  for (const auto& k : p.at("kernels")) {
    kernel_ms += k.at("ms").get<double>();
    if (k.at("phase") == "forward" && k.at("kernel") == "matmul") {
      EXPECT_EQ(k.at("dtype"), "bf16") << p.dump();
      forward_calls += k.at("calls").get<double>();
      forward_gflop += k.at("gflops").get<double>() * k.at("ms").get<double>() * 1e-3;
    }
  }
  EXPECT_EQ(forward_calls, 3.0) << p.dump();
  EXPECT_NEAR(forward_gflop, forward / 1e9, 1e-9) << p.dump();
  EXPECT_NEAR(kernel_ms, p.at("kernel_ms").get<double>(), 1e-9);
  for (const char* phase : {"forward", "backward", "optimizer"}) EXPECT_TRUE(p.at("phase_ms").contains(phase)) << phase;
  r = run_cli(bench, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("of the host's bf16 matmul"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("forward   matmul"), std::string::npos) << r.out;
}

TEST_F(Cli, RejectsBadFlagsBeforeWork) {
  const std::pair<std::string, std::string> cases[] = {
      {"train --batch-size 0", "--batch-size"},
      {"train --lr -0.1", "--lr"},
      {"train --lr abc", "--lr"},
      {"train --epochs 0", "--epochs"},
      {"train --bogus 3", "unknown flag --bogus"},
      {"train --precision fp8", "--precision"},
      {"train --hidden 10,,3", "--hidden"},
      {"bench --steps 0", "--steps"},
      {"bench --precision fp8", "--precision"},
      {"train --epochs 1 --epochs 2", "--epochs given twice"},
      {"train --memory-limit lots", "--memory-limit: 'lots' is no size"},
      {"train --memory-limit 1.5XB", "--memory-limit"},
      {"bench --memory-limit 0.2B", "--memory-limit: '0.2B' must be at least 1 byte"},
      {"train --model mlp --layers 2", "unknown flag --layers for --model mlp"},
      {"train --model cnn-bn --channels 8,16", "unknown flag --channels for --model cnn-bn"},
      {"bench --model mlp --channels-last", "unknown flag --channels-last for --model mlp"},
      {"bench --model gpt --hidden 8", "unknown flag --hidden for --model gpt"},
      {"train --stochastic-rounding maybe", "--stochastic-rounding"},
      {"train stray", "unexpected argument 'stray'"},
      {"sample --checkpoint x.st --top-k -1", "--top-k"},
      {"eval --json", "--checkpoint FILE is required"},
      {"bench --hidden 8 --cuda-graph", "--cuda-graph replays a step's GPU work: it needs --device cuda"},
      {"frobnicate", "unknown command"},
  };
  for (const auto& [args, expect] : cases) {
    RunResult r = run_cli(args, dir_);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST_F(Cli, BadDataGivesOneLineAndNoCrash) {
  // Missing directory.
  RunResult r = run_cli("train --data " + (dir_ / "nope").string(), dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;

  // Truncated image file.
  write_dataset(dir_, "train", 100, 1);
  write_dataset(dir_, "t10k", 50, 2);
  const fs::path img = dir_ / "train-images-idx3-ubyte.gz";
  const std::string bytes = slurp(img);
  std::ofstream(img, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size() / 2));
  r = run_cli("train --epochs 1 --data " + dir_.string(), dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.err;

  // Bad magic number in the labels.
  write_dataset(dir_, "train", 100, 1);
  const fs::path lab = dir_ / "t10k-labels-idx1-ubyte.gz";
  std::ofstream(lab, std::ios::binary | std::ios::trunc) << "this is not an idx file at all";
  r = run_cli("train --epochs 1 --data " + dir_.string(), dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("t10k-labels-idx1-ubyte.gz"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;
}

// Every command's --help comes from its flag declarations: each flag with its default, range or
// choices, the model-specific flags in a group per model.
TEST_F(Cli, HelpIsGeneratedPerCommand) {
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"train",
       {"--epochs N", "(default: 5)", "--precision auto|fp32|amp-bf16", "mlp model (--model mlp):", "--hidden N,N,...",
        "cnn model (--model cnn):", "--channels", "gpt model (--model gpt):", "--layers N", "--memory-limit SIZE",
        "model's recipe: mlp 512, cnn 64, cnn-bn 128, gpt 32", "--resume FILE", "1 to 100000"}},
      {"bench", {"--steps N", "(default: 30)", "--warmup N", "--vocab-size N", "--memory-limit SIZE", "--model"}},
      {"eval", {"--checkpoint FILE", "--json", "--precision", "(default: the checkpoint's)", "--hidden", "--text"}},
      {"export", {"--checkpoint FILE", "--out FILE", "--dtype as-stored|f32|bf16|f16"}},
      {"sample", {"--temperature X", "(default: 0.8)", "--top-k N", "--seed N", "(default: 1337)"}},
      {"devices", {"--help"}},
  };
  for (const auto& [command, parts] : cases) {
    const RunResult r = run_cli(command + " --help", dir_);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
    for (const std::string& p : parts)
      EXPECT_NE(squeezed(r.out).find(p), std::string::npos) << command << " lacks " << p;
  }
  RunResult r = run_cli("--help", dir_);
  EXPECT_EQ(r.exit_code, 0);
  for (const char* command : {"train", "eval", "export", "sample", "bench", "devices"})
    EXPECT_NE(r.out.find(std::string("\n  ") + command + " "), std::string::npos) << command << ": " << r.out;
  r = run_cli("", dir_);  // no command: the list, on stderr, and the usage error's exit code
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("train"), std::string::npos);
  r = run_cli("--version", dir_);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("mixprec 0.", 0), 0u) << r.out;
}

// --memory-limit takes bytes or a size with a unit and sets the allocator's budget: a step that
// needs more fails with one line.
TEST_F(Cli, MemoryLimitBoundsTheStep) {
  const std::string bench = "bench --hidden 16 --batch-size 8 --steps 1 --warmup 0 --precision fp32 --memory-limit ";
  for (const char* size : {"1GiB", "512MiB", "1.5GB", "100000000"}) {
    const RunResult r = run_cli(bench + size, dir_);
    EXPECT_EQ(r.exit_code, 0) << size << ": " << r.err;
  }
  const RunResult r = run_cli(bench + "100KiB", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("out of memory"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}
