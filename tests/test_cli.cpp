// End-to-end tests of the CLI binary: a short training run on a small idx data set made
// here, the metrics file, and the one-line errors for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace

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
