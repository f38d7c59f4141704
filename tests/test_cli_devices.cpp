// The CLI's --device: training on the fenced device (a GPU stand-in whose memory the host may not
// touch) gives the CPU's per-step losses bit for bit, the deferred loss reads report the same
// lines, and a device that is not there is one line and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "mixprec/device.h"

namespace fs = std::filesystem;

namespace {

using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::write_dataset;

class CliDevices : public mixprec::clitest::TempDirTest {
 protected:
  // The "step" lines' loss fields as written (the text: bit-identical doubles print alike), keyed
  // by step, and the summary line.
  struct Metrics {
    std::vector<std::pair<int, std::string>> losses;
    nlohmann::json summary;
  };
  // `train` on the data set of SetUp (400 images): small models, so a fenced run (one mapping per
  // tensor) stays quick.
  Metrics train(const std::string& device, const std::string& model, const std::string& precision,
                const std::string& more) {
    const fs::path m = dir_ / (device + "-" + model + "-" + precision + ".jsonl");
    const RunResult r = run_cli("train --data " + dir_.string() + " --threads 1 " +
                                    (model == "mlp" ? "--hidden 32 " : "") + "--model " + model + " --precision " +
                                    precision + " --device " + device + " --metrics " + m.string() + " " + more,
                                dir_);
    EXPECT_EQ(r.exit_code, 0) << device << " " << model << " " << precision << ": " << r.err;
    Metrics out;
    std::ifstream f(m);
    std::string line;
    while (std::getline(f, line)) {
      const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
      if (j.at("event") == "step") out.losses.emplace_back(j.at("step").get<int>(), j.at("loss").dump());
      if (j.at("event") == "summary") out.summary = j;
    }
    return out;
  }
  void SetUp() override {
    TempDirTest::SetUp();
    write_dataset(dir_, "train", 400, 1, 12);  // 12x12 images: small models, quick fenced runs
    write_dataset(dir_, "t10k", 100, 2, 12);
  }
};

TEST_F(CliDevices, FencedTrainingGivesTheCpuLossesBitForBit) {
  for (const char* model : {"mlp", "cnn-bn"})
    for (const char* precision : {"fp32", "amp-fp16"}) {
      const std::string flags = "--epochs 1 --batch-size 50";  // 8 steps
      const Metrics cpu = train("cpu", model, precision, flags), fenced = train("fenced", model, precision, flags);
      ASSERT_EQ(cpu.losses.size(), 8u) << model << " " << precision;
      EXPECT_EQ(fenced.losses, cpu.losses) << model << " " << precision;
      ASSERT_FALSE(fenced.summary.is_null());
      EXPECT_EQ(fenced.summary.at("device"), "fenced");
      EXPECT_EQ(cpu.summary.at("device"), "cpu");
      EXPECT_EQ(fenced.summary.at("test_accuracy"), cpu.summary.at("test_accuracy")) << model << " " << precision;
    }
}

// --deterministic: two processes give the same losses bit for bit, on the CPU with two threads and
// on a GPU where there is one (where each convolution then runs cuDNN's first deterministic engine
// instead of the fastest timed one, which may differ from process to process).
TEST_F(CliDevices, DeterministicRunsRepeatBitForBit) {
  std::vector<std::string> devices = {"cpu"};
  if (mixprec::cuda::device_count() > 0) devices.emplace_back("cuda");
  for (const std::string& device : devices)
    for (const char* precision : {"fp32", "amp-bf16"}) {
      SCOPED_TRACE(device + " " + precision);
      auto run = [&](const std::string& name) {
        const fs::path m = dir_ / (name + ".jsonl");
        const RunResult r = run_cli("train --data " + dir_.string() + " --threads 2 --model cnn-bn --precision " +
                                        precision + " --device " + device + " --deterministic --epochs 1 " +
                                        "--batch-size 50 --log-every 1 --metrics " + m.string(),
                                    dir_);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        std::vector<std::string> lines;
        bool flagged = false;
        std::ifstream f(m);
        for (std::string line; std::getline(f, line);) {
          const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
          if (j.at("event") == "step") lines.push_back(j.at("loss").dump());
          if (j.at("event") == "summary") flagged = j.at("deterministic").get<bool>();
        }
        EXPECT_TRUE(flagged) << "the summary does not say the run was deterministic";
        return lines;
      };
      const std::vector<std::string> a = run(device + "-a"), b = run(device + "-b");
      ASSERT_EQ(a.size(), 8u);
      EXPECT_EQ(a, b);
    }
}

// Off the CPU the losses are read in runs (at metrics and progress lines, and at each epoch's end):
// every logged step still gets its own loss, in order.
TEST_F(CliDevices, DeferredLossReadsReportEveryLoggedStep) {
  // 16 steps an epoch: progress lines every 3rd step and at the 16th, metrics every 5th.
  const Metrics cpu = train("cpu", "mlp", "fp32", "--epochs 2 --batch-size 25 --log-every 1"),
                fenced = train("fenced", "mlp", "fp32", "--epochs 2 --batch-size 25 --log-every 5");
  std::vector<std::pair<int, std::string>> want;
  for (const auto& s : cpu.losses)
    if (s.first % 5 == 0) want.push_back(s);
  ASSERT_EQ(want.size(), 6u);  // steps 5, 10, ..., 30
  EXPECT_EQ(fenced.losses, want);
}

TEST_F(CliDevices, AMissingDeviceIsOneLine) {
  std::vector<std::pair<std::string, std::string>> cases = {{"train --device tpu", "--device"},
                                                            {"bench --device cuda:x", "--device"}};
  if (mixprec::cuda::device_count() == 0) {
    cases.emplace_back("train --device cuda", "cuda");
    cases.emplace_back("bench --device cuda:0 --steps 1", "cuda");
  } else {
    cases.emplace_back("train --device cuda:" + std::to_string(mixprec::cuda::device_count()), "cuda");
  }
  for (const auto& [args, expect] : cases) {
    const RunResult r = run_cli(args, dir_);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

// The seeds' experiment on a GPU (the wide cnn under a limit where fp32 fits a few hundred): every
// preset finds its batch. A convolution whose cuDNN engines all want more workspace than the limit
// leaves is out of memory, as any allocation past the limit: the search goes smaller. (It was an
// error that ended the search, first seen on the H100 on 2026-11-27 at 3, 4 and 6 GiB.) Without a
// GPU there is nothing to run: the CPU's search is CliCompare.MaxBatchFindsABatchPerPrecision.
TEST_F(CliDevices, MaxBatchOnTheGpuSearchesPastConvolutionsThatDoNotFit) {
  if (mixprec::cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << mixprec::cuda::unavailable_reason();
  const RunResult r = run_cli(
      "max-batch --device cuda --model cnn --channels 420,1000 --memory-limit 3GiB "
      "--max-batch 2048 --precisions fp32,amp-fp16 --json",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("precisions").size(), 2u);
  for (const nlohmann::json& p : j.at("precisions")) {
    EXPECT_GT(p.at("batch").get<int64_t>(), 0) << p;
    EXPECT_LE(p.at("peak_bytes").get<int64_t>(), int64_t(3) << 30) << p;
  }
  EXPECT_GT(j.at("precisions")[1].at("ratio").get<double>(), 1.0) << j.dump();
}

// A training step of ours never waits for its device: bench's timed steps on the fenced device
// (where every tensor copy to the host is counted) make no device-to-host copy, for each model kind
// and precision, the GradScaler's steps included (amp-fp16: scale, unscale and its inf check, the
// skip and the scale update on the device), the gpt's clipping and learning-rate schedule too.
TEST_F(CliDevices, BenchStepsMakeNoDeviceToHostCopy) {
  for (const char* model : {"--model mlp --hidden 16 --batch-size 8", "--model cnn --channels 4,8 --batch-size 4",
                            "--model gpt --layers 1 --d-model 32 --heads 2 --block-size 16 --batch-size 4"})
    for (const char* precision : {"fp32", "amp-bf16", "amp-fp16"}) {
      const RunResult r = run_cli(
          std::string("bench --device fenced --threads 1 --steps 2 --warmup 1 ") + model + " --precision " + precision,
          dir_);
      ASSERT_EQ(r.exit_code, 0) << model << " " << precision << ": " << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j.at("device_to_host_copies_per_step").get<double>(), 0.0) << model << " " << precision;
    }
}

TEST_F(CliDevices, AutoTakesTheGpuWhereThereIsOne) {
  const RunResult r = run_cli("bench --device auto --hidden 16 --batch-size 8 --steps 2 --warmup 1", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("device"), mixprec::cuda::device_count() > 0 ? "cuda:0" : "cpu");
  const RunResult d = run_cli("devices", dir_);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find(mixprec::cuda::device_count() > 0 ? "--device auto: cuda:0" : "--device auto: cpu"),
            std::string::npos)
      << d.out;
}

}  // namespace
