// The checkpoint commands of the CLI: eval gives the accuracy train reported, export writes the
// model tensors alone (in another dtype if asked), and bad input (another model, a --resume
// whose preset differs, a missing file) is one line, a non-zero exit and no file changed.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "mixprec/checkpoint.h"
#include "mixprec/io.h"

namespace fs = std::filesystem;
using mixprec::clitest::run_cli;
using mixprec::clitest::RunResult;
using mixprec::clitest::slurp;
using mixprec::clitest::write_dataset;

namespace {

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

// One small trained checkpoint (mlp 32, amp-bf16) shared by the tests of a fixture.
class CheckpointCli : public mixprec::clitest::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    write_dataset(dir_, "train", 200, 1);
    write_dataset(dir_, "t10k", 100, 2);
    ck_ = (dir_ / "ck.st").string();
    const RunResult r =
        run_cli("train --data " + dir_.string() + " --hidden 32 --epochs 1 --batch-size 50 " +
                    "--precision amp-bf16 --threads 2 --metrics " + (dir_ / "m.jsonl").string() + " --save " + ck_,
                dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // The last epoch line of the metrics.
  nlohmann::json last_epoch() const {
    std::istringstream in(slurp(dir_ / "m.jsonl"));
    std::string line;
    nlohmann::json last;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.at("event") == "epoch") last = j;
    }
    return last;
  }
  // A failing command: one line on stderr naming each of `parts`, exit 1, nothing on stdout.
  void expect_refused(const std::string& args, std::initializer_list<std::string> parts) {
    const RunResult r = run_cli(args, dir_);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    for (const std::string& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  std::string ck_;
};

}  // namespace

TEST_F(CheckpointCli, EvalGivesTheAccuracyTrainReported) {
  const RunResult r = run_cli("eval --checkpoint " + ck_ + " --json --threads 2", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  // The same model, precision (the file's: amp-bf16), data (the file's) and normalisation: the same bits.
  EXPECT_EQ(j.at("precision"), "amp-bf16");
  EXPECT_EQ(j.at("test_samples"), 100);
  EXPECT_EQ(j.at("test_accuracy").get<double>(), last_epoch().at("test_accuracy").get<double>());
  EXPECT_EQ(j.at("test_loss").get<double>(), last_epoch().at("test_loss").get<double>());
  const RunResult text = run_cli("eval --checkpoint " + ck_ + " --precision fp32", dir_);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("test accuracy"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("precision fp32"), std::string::npos) << text.out;
}

TEST_F(CheckpointCli, ExportWritesTheModelAlone) {
  const std::string out = (dir_ / "model.st").string();
  RunResult r = run_cli("export --checkpoint " + ck_ + " --out " + out + " --dtype bf16", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const mixprec::io::SafetensorsFile f = mixprec::io::load_safetensors(out);
  ASSERT_EQ(f.tensors.size(), 4u);  // 784-32-10: 1.weight, 1.bias, 3.weight, 3.bias
  EXPECT_EQ(f.tensors[0].first, "1.weight");
  for (const auto& [name, t] : f.tensors) EXPECT_EQ(t.dtype(), mixprec::DType::bf16) << name;
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("model"), "mlp");
  EXPECT_EQ(f.metadata.count("mixprec"), 0u);  // not a training checkpoint: no --resume from it
  // In f32 the export evaluates exactly as the checkpoint (amp-bf16 casts the weights to bf16 either way).
  r = run_cli("export --checkpoint " + ck_ + " --out " + out, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RunResult a = run_cli("eval --checkpoint " + ck_ + " --json", dir_);
  const RunResult b = run_cli("eval --checkpoint " + out + " --json", dir_);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out).at("test_accuracy"), nlohmann::json::parse(b.out).at("test_accuracy"));
  expect_refused("train --resume " + out, {out, "not a mixprec training checkpoint"});
}

TEST_F(CheckpointCli, BadInputIsOneLineAndChangesNothing) {
  const std::string before = slurp(ck_);
  const std::string other = (dir_ / "other.st").string();
  // --resume with another preset than the checkpoint's.
  expect_refused("train --resume " + ck_ + " --precision amp-fp16 --save " + ck_,
                 {"--precision amp-fp16 differs from the checkpoint's amp-bf16", ck_});
  expect_refused("train --resume " + ck_ + " --hidden 64", {"--hidden 64 differs from the checkpoint's 32"});
  // Missing files.
  expect_refused("train --resume " + (dir_ / "nope.st").string(), {"nope.st"});
  expect_refused("eval --checkpoint " + (dir_ / "nope.st").string(), {"nope.st"});
  expect_refused("export --checkpoint " + ck_, {"--out FILE is required"});
  // Another model: the file names its model, and the flags contradict it ...
  expect_refused("eval --checkpoint " + ck_ + " --model cnn", {"--model cnn", "holds a model with model mlp"});
  // ... or the file does not name its model (a PyTorch state_dict): the names that differ are listed.
  const mixprec::io::SafetensorsFile f = mixprec::io::load_safetensors(ck_);
  mixprec::io::save_safetensors(other, mixprec::Checkpoint::model_tensors(f.tensors));
  expect_refused("eval --checkpoint " + other + " --model cnn",
                 {other + " does not hold this model's tensors", "missing 0.weight, 0.bias, 7.weight, 7.bias",
                  "unexpected 1.weight, 1.bias", "other shape 3.weight [10, 32] (model: [16, 8, 3, 3])"});
  expect_refused("eval --checkpoint " + other + " --hidden 64",
                 {"other shape 1.weight [32, 784] (model: [64, 784]), 1.bias [32] (model: [64])"});
  expect_refused("export --checkpoint " + other + " --out " + ck_ + " --dtype f8", {"--dtype"});
  EXPECT_EQ(slurp(ck_), before);
}
