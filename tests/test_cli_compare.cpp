// The experiment commands of the CLI: compare (one run per precision, one table, --out's files)
// and plot (the chart of metrics files), on a small generated data set.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"

namespace fs = std::filesystem;

namespace {

using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::slurp;
using mixprec::clitest::write_dataset;

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

class CliCompare : public mixprec::clitest::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    write_dataset(dir_, "train", 400, 1);
    write_dataset(dir_, "t10k", 100, 2);
  }
  std::string tiny() const { return "--data " + dir_.string() + " --hidden 32 --epochs 1 --batch-size 50 --threads 1"; }
  // Whether the chart was drawn at `png`, or the message says how to get gnuplot.
  static void expect_chart(const fs::path& png, const std::string& message) {
    EXPECT_TRUE(fs::exists(png) || message.find("gnuplot") != std::string::npos) << message;
  }
};

}  // namespace

TEST_F(CliCompare, OneRowPerPrecisionAndTheFilesOfOut) {
  const fs::path out = dir_ / "out";
  RunResult r =
      run_cli("compare " + tiny() + " --precisions amp-bf16,fp32,amp-fp16 --json --out " + out.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json t = nlohmann::json::parse(r.out);
  EXPECT_EQ(t.at("model"), "mlp");
  EXPECT_EQ(t.at("epochs"), 1);
  EXPECT_EQ(t.at("baseline"), "fp32");  // fp32 where it ran, wherever it stands in the list
  ASSERT_EQ(t.at("runs").size(), 3u);
  const char* names[] = {"amp-bf16", "fp32", "amp-fp16"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& run = t.at("runs")[i];
    EXPECT_EQ(run.at("precision"), names[i]);
    EXPECT_GT(run.at("test_accuracy").get<double>(), 0.5) << names[i];  // chance: 0.1
    EXPECT_GT(run.at("test_loss").get<double>(), 0.0);
    EXPECT_GT(run.at("seconds_per_epoch").get<double>(), 0.0);
    EXPECT_GT(run.at("samples_per_s").get<double>(), 0.0);
    EXPECT_GT(run.at("peak_bytes").get<int64_t>(), 0);
    EXPECT_GT(run.at("peak_activation_bytes").get<int64_t>(), 0);
    EXPECT_GE(run.at("skipped_steps").get<int64_t>(), 0);
    EXPECT_TRUE(fs::exists(out / (std::string(names[i]) + ".jsonl"))) << names[i];
  }
  EXPECT_EQ(t.at("runs")[1].at("speedup").get<double>(), 1.0);
  EXPECT_EQ(t.at("runs")[2].at("final_scale").get<double>(), 65536.0);  // amp-fp16 scales its loss
  EXPECT_EQ(nlohmann::json::parse(slurp(out / "compare.json")), t);
  expect_chart(out / "chart.png", r.err);

  // The text table: a row per precision, the same seed and data as above.
  r = run_cli("compare " + tiny() + " --precisions fp32,amp-bf16", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("speed-up"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nfp32 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\namp-bf16 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1.00x"), std::string::npos) << r.out;
}

TEST_F(CliCompare, RejectsBadFlagsBeforeWork) {
  const std::pair<std::string, std::string> cases[] = {
      {"compare --precisions fp32,fp8", "--precisions: 'fp8' is not one of"},
      {"compare --precisions fp32,fp32", "names 'fp32' twice"},
      {"compare --precisions ''", "--precisions"},
      {"compare --precision fp32", "unknown flag --precision"},
      {"compare --metrics m.jsonl", "unknown flag --metrics"},
      {"compare --epochs 0", "--epochs"},
      {"compare --model gpt --epochs 2", "unknown flag --epochs for --model gpt"},
      {"compare --memory-limit 2 GiB", "unexpected argument 'GiB'"},
      {"plot", "metrics is required"},
      {"plot m.jsonl", "--out PNG is required"},
  };
  for (const auto& [args, expect] : cases) {
    const RunResult r = run_cli(args, dir_);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST_F(CliCompare, PlotDrawsMetricsFiles) {
  const fs::path m = dir_ / "m.jsonl";
  RunResult r = run_cli("train " + tiny() + " --precision amp-fp16 --metrics " + m.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path png = dir_ / "chart.png";
  r = run_cli("plot " + m.string() + " " + m.string() + " --labels a,b -o " + png.string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_chart(png, r.out);
  EXPECT_TRUE(fs::exists(dir_ / "chart.gp"));  // the script is written either way
  r = run_cli("plot " + m.string() + " --labels a,b -o " + png.string(), dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--labels names 2 runs for 1 metrics files"), std::string::npos) << r.err;
  r = run_cli("plot " + (dir_ / "none.jsonl").string() + " -o " + (dir_ / "x.png").string(), dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("none.jsonl"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.png"));
}

// max-batch: the largest batch per precision under --memory-limit, and its ratio to fp32's.
TEST_F(CliCompare, MaxBatchFindsABatchPerPrecision) {
  const RunResult r = run_cli(
      "max-batch --hidden 64 --threads 1 --memory-limit 8MiB --max-batch 4096 --precisions amp-bf16,fp32 --json", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("memory_limit_bytes"), 8 << 20);
  EXPECT_EQ(j.at("baseline"), "fp32");
  ASSERT_EQ(j.at("precisions").size(), 2u);
  EXPECT_EQ(j.at("precisions")[0].at("precision"), "amp-bf16");
  for (const nlohmann::json& p : j.at("precisions")) {
    EXPECT_GT(p.at("batch").get<int64_t>(), 0) << p;
    EXPECT_LE(p.at("batch").get<int64_t>(), 4096) << p;
    EXPECT_LE(p.at("peak_bytes").get<int64_t>(), 8 << 20) << p;
    EXPECT_GT(p.at("peak_by_category").at("activations").get<int64_t>(), 0) << p;
    // Every step run: as many as the attempts, the answer among those that fitted, and the smallest
    // refused batch (one past the answer: the search ends bisecting) with the allocator's refusal.
    const nlohmann::json& trials = p.at("trials");
    ASSERT_EQ(trials.size(), p.at("attempts").get<size_t>()) << p;
    const int64_t failed = p.at("smallest_failed").get<int64_t>();
    EXPECT_EQ(failed, p.at("batch").get<int64_t>() + 1) << p;
    bool answer = false, refused = false;
    for (const nlohmann::json& t : trials) {
      answer = answer ||
               (t.at("fitted") == true && t.at("batch") == p.at("batch") && t.at("peak_bytes") == p.at("peak_bytes"));
      if (t.at("fitted") == false && t.at("batch") == failed)
        refused = t.at("refusal").get<std::string>().find("out of memory") != std::string::npos;
    }
    EXPECT_TRUE(answer) << trials;
    EXPECT_TRUE(refused) << trials;
  }
  EXPECT_EQ(j.at("precisions")[1].at("ratio").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j.at("precisions")[0].at("ratio").get<double>(),
                   double(j.at("precisions")[0].at("batch").get<int64_t>()) /
                       double(j.at("precisions")[1].at("batch").get<int64_t>()));
  const RunResult text = run_cli("max-batch --hidden 64 --threads 1 --memory-limit 8MiB --max-batch 4096", dir_);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("\nhalf-bf16 "), std::string::npos) << text.out;  // the default list's last
  EXPECT_NE(text.out.find("activations"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nfp32 at batch "), std::string::npos) << text.out;  // why not one more
  EXPECT_NE(text.out.find(": out of memory"), std::string::npos) << text.out;
  for (const auto& bad :
       {std::pair<std::string, std::string>{"max-batch --precisions fp32", "--memory-limit SIZE is required"},
        {"max-batch --memory-limit 1GiB --batch-size 8", "--batch-size: max-batch searches the batch size"},
        {"max-batch --memory-limit 1GiB --max-batch 0", "--max-batch"},
        {"max-batch --memory-limit 12parsecs", "--memory-limit: '12parsecs' is no size"}}) {
    const RunResult e = run_cli(bad.first, dir_);
    EXPECT_EQ(e.exit_code, 1) << bad.first;
    EXPECT_EQ(count_lines(e.err), 1) << bad.first << ": " << e.err;
    EXPECT_NE(e.err.find(bad.second), std::string::npos) << bad.first << ": " << e.err;
  }
}
