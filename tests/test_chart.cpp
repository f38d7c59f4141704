// The chart of `compare` and `plot` (apps/mixprec/chart.cpp): the data blocks and gnuplot script
// from metrics files written here, one-line errors for files that are not metrics files (and
// nothing written), and with gnuplot installed (scripts/dev.sh installs gnuplot-nox) a real PNG.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chart.h"
#include "cli_util.h"
#include "error_text.h"

namespace mixprec::cli {
namespace {

namespace fs = std::filesystem;
using clitest::slurp;
using testutil::error_of;

// An fp32 run and an amp-fp16 run as `train --metrics` writes them: steps 10, 20 in epoch 1 and
// 30, 40 in epoch 2, the fp16 scale backing off once, an epoch line per epoch, a summary.
const char* kFp32 =
    R"({"event":"step","step":10,"epoch":1,"loss":2.0,"lr":0.001,"scale":1.0,"skipped":false,"grad_norm":1.5}
{"event":"step","step":20,"epoch":1,"loss":1.5,"lr":0.001,"scale":1.0,"skipped":false,"grad_norm":1.2}
{"event":"epoch","epoch":1,"test_accuracy":0.8,"test_loss":0.6,"train_loss":1.7,"seconds":3.0}
{"event":"step","step":30,"epoch":2,"loss":1.0,"lr":0.001,"scale":1.0,"skipped":false,"grad_norm":1.0}
{"event":"step","step":40,"epoch":2,"loss":0.75,"lr":0.001,"scale":1.0,"skipped":false,"grad_norm":0.9}
{"event":"epoch","epoch":2,"test_accuracy":0.85,"test_loss":0.5,"train_loss":0.9,"seconds":3.0}
{"event":"summary","precision":"fp32","model":"cnn","device":"cpu","steps":40,"wall_seconds":6.0,"samples_per_s":100.0,"test_accuracy":0.85}
)";
const char* kFp16 =
    R"({"event":"step","step":10,"epoch":1,"loss":2.5,"lr":0.001,"scale":65536.0,"skipped":false,"grad_norm":1.5}
{"event":"step","step":20,"epoch":1,"loss":null,"lr":0.001,"scale":65536.0,"skipped":true,"grad_norm":null}
{"event":"epoch","epoch":1,"test_accuracy":0.75,"test_loss":0.7,"train_loss":1.9,"seconds":2.0}
{"event":"diagnose","step":30,"scale":32768.0,"gradients":[]}
{"event":"step","step":30,"epoch":2,"loss":1.25,"lr":0.001,"scale":32768.0,"skipped":false,"grad_norm":1.0}
{"event":"step","step":40,"epoch":2,"loss":0.5,"lr":0.001,"scale":32768.0,"skipped":false,"grad_norm":0.9}
{"event":"epoch","epoch":2,"test_accuracy":0.875,"test_loss":0.45,"train_loss":0.8,"seconds":2.0}
)";
// The gpt: steps without epochs, validation loss per eval.
const char* kGpt = R"({"event":"step","step":1,"loss":4.25,"lr":0.0003,"scale":1.0,"skipped":false,"grad_norm":2.0}
{"event":"step","step":2,"loss":4.0,"lr":0.0003,"scale":1.0,"skipped":false,"grad_norm":2.0}
{"event":"eval","step":2,"val_loss":3.5}
)";

// PATH for the scope of one test: an empty directory hides gnuplot.
class PathGuard {
 public:
  explicit PathGuard(const std::string& path) {
    const char* old = std::getenv("PATH");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("PATH", path.c_str(), 1);
  }
  ~PathGuard() {
    if (had_)
      setenv("PATH", old_.c_str(), 1);
    else
      unsetenv("PATH");
  }

 private:
  bool had_ = false;
  std::string old_;
};

class Chart : public clitest::TempDirTest {
 protected:
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(dir_)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  }
  // Charts the fp32 and fp16 runs into dir_/chart.png.
  ChartOutcome fp32_and_fp16() const {
    return write_chart({file("fp32.jsonl", kFp32), file("fp16.jsonl", kFp16)}, {"fp32", "amp-fp16"},
                       (dir_ / "chart.png").string());
  }
};

TEST_F(Chart, DataAndScriptWithoutGnuplot) {
  const fs::path empty = dir_ / "no-gnuplot";
  fs::create_directories(empty);
  ChartOutcome out;
  {
    PathGuard path(empty.string());
    out = fp32_and_fp16();
  }
  EXPECT_FALSE(out.drawn);
  EXPECT_NE(out.message.find("apt-get install gnuplot-nox"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("cd '" + dir_.string() + "' && gnuplot 'chart.gp'"), std::string::npos) << out.message;
  EXPECT_EQ(names(), (std::vector<std::string>{"chart.accuracy.dat", "chart.gp", "chart.loss.dat", "chart.scale.dat",
                                               "fp16.jsonl", "fp32.jsonl", "no-gnuplot"}));

  // One block per run; the fp16 run's null loss is gnuplot's NaN (a gap).
  const std::string loss = slurp(dir_ / "chart.loss.dat");
  EXPECT_NE(loss.find("# fp32\n# step loss\n10 2\n20 1.5\n30 1\n40 0.75\n\n\n# amp-fp16\n# step loss\n10 2.5\n20 NaN\n"
                      "30 1.25\n40 0.5\n"),
            std::string::npos)
      << loss;
  // Accuracy in percent per epoch.
  const std::string acc = slurp(dir_ / "chart.accuracy.dat");
  EXPECT_NE(acc.find("# fp32\n# epoch test accuracy (%)\n1 80\n2 85\n\n\n# amp-fp16\n# epoch test accuracy (%)\n1 75\n"
                     "2 87.5\n"),
            std::string::npos)
      << acc;
  // The scale of the run that used loss scaling only.
  const std::string scale = slurp(dir_ / "chart.scale.dat");
  EXPECT_EQ(scale.find("# fp32"), std::string::npos) << scale;
  EXPECT_NE(scale.find("# amp-fp16\n# step loss scale\n10 65536\n20 65536\n30 32768\n40 32768\n"), std::string::npos)
      << scale;

  const std::string gp = slurp(dir_ / "chart.gp");
  EXPECT_NE(gp.find("set multiplot layout 3,1"), std::string::npos) << gp;
  EXPECT_NE(gp.find("'chart.loss.dat' index 0 using 1:2 with lines linetype 1 title 'fp32'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("'chart.loss.dat' index 1 using 1:2 with lines linetype 2 title 'amp-fp16'"), std::string::npos)
      << gp;
  // The scale panel holds the fp16 run alone, in its own colour (linetype 2), on a log scale.
  EXPECT_NE(gp.find("'chart.scale.dat' index 0 using 1:2 with lines linetype 2 title 'amp-fp16'"), std::string::npos)
      << gp;
  EXPECT_NE(gp.find("set logscale y 2"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("val_loss"), std::string::npos) << gp;
}

// A gpt run has a validation-loss panel instead of accuracy; an fp16 summary marks loss scaling
// even where the scale stayed 1; labels default to the file names.
TEST_F(Chart, GptValidationLossAndDefaultLabels) {
  PathGuard path((dir_ / "none").string());
  const std::string gpt16 = std::string(kGpt) + R"({"event":"summary","precision":"amp-fp16","model":"gpt"})" + "\n";
  const ChartOutcome out =
      write_chart({file("gpt-a.jsonl", kGpt), file("gpt-b.jsonl", gpt16)}, {}, (dir_ / "g.png").string());
  EXPECT_FALSE(out.drawn);
  EXPECT_EQ(names(), (std::vector<std::string>{"g.gp", "g.loss.dat", "g.scale.dat", "g.val_loss.dat", "gpt-a.jsonl",
                                               "gpt-b.jsonl"}));
  EXPECT_NE(slurp(dir_ / "g.val_loss.dat").find("# gpt-a\n# step validation loss\n2 3.5\n\n\n# gpt-b\n"),
            std::string::npos);
  EXPECT_NE(slurp(dir_ / "g.scale.dat").find("# gpt-b\n# step loss scale\n1 1\n2 1\n"), std::string::npos);
  EXPECT_EQ(slurp(dir_ / "g.scale.dat").find("gpt-a"), std::string::npos);
  EXPECT_NE(slurp(dir_ / "g.gp").find("set multiplot layout 3,1"), std::string::npos);
}

// Not a metrics file: one line naming the file and line; nothing written (no data, no script).
TEST_F(Chart, MalformedInputWritesNothing) {
  const std::string png = (dir_ / "chart.png").string();
  const std::string good = file("good.jsonl", kFp32);
  const auto expect_error = [&](const std::string& name, const std::string& text, const std::string& expected) {
    const std::string bad = file(name, text);
    const std::string e = error_of([&] { write_chart({good, bad}, {"a", "b"}, png); });
    EXPECT_NE(e.find(expected), std::string::npos) << e;
    fs::remove(bad);
    EXPECT_EQ(names(), std::vector<std::string>{"good.jsonl"}) << name;
  };
  const std::string step = R"({"event":"step","step":1,"loss":1.0,"scale":1.0})";
  expect_error("cut.jsonl", step + "\n" + step + "\n{\"event\":\"st", "cut.jsonl:3: not a JSON object with an event");
  expect_error("text.jsonl", "epoch 1: loss 0.5\n", "text.jsonl:1: not a JSON object with an event");
  expect_error("noloss.jsonl", step + "\n" + R"({"event":"step","step":2,"scale":1.0})" + "\n",
               "noloss.jsonl:2: a step line needs an integer step, a loss and a scale");
  expect_error("acc.jsonl", step + "\n" + R"({"event":"epoch","epoch":1,"test_accuracy":"high"})" + "\n",
               "acc.jsonl:2: an epoch line needs an integer epoch and a test_accuracy");
  expect_error("eval.jsonl", R"({"event":"eval","step":1.5,"val_loss":2})", "eval.jsonl:1: an eval line needs");
  expect_error("empty.jsonl", "", "has no step, epoch or eval lines");
  expect_error("summary.jsonl", R"({"event":"summary","precision":"fp32"})", "has no step, epoch or eval lines");

  EXPECT_NE(error_of([&] {
              write_chart({good, (dir_ / "missing.jsonl").string()}, {"a", "b"}, png);
            }).find("cannot read metrics file " + (dir_ / "missing.jsonl").string()),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_chart({good}, {"a", "b"}, png);
            }).find("2 labels for 1 metrics files"),
            std::string::npos);
  const fs::path missing_dir = dir_ / "no-such-dir";
  EXPECT_NE(error_of([&] {
              write_chart({good}, {"a"}, (missing_dir / "c.png").string());
            }).find("chart: cannot write " + (missing_dir / "c.loss.dat").string()),
            std::string::npos);
  EXPECT_EQ(names(), std::vector<std::string>{"good.jsonl"});
}

// With gnuplot (dev.sh installs gnuplot-nox) the chart is a PNG of three 320-pixel panels; labels
// with quotes, gnuplot's markup characters and a line break do not break its script or data.
// Where gnuplot is missing on purpose, MIXPREC_TEST_NO_GNUPLOT=1 skips this test (visibly);
// otherwise its absence is a failure.
TEST_F(Chart, DrawsPngWithGnuplot) {
  const char* no_gnuplot = std::getenv("MIXPREC_TEST_NO_GNUPLOT");
  if (no_gnuplot && std::string(no_gnuplot) == "1") GTEST_SKIP() << "MIXPREC_TEST_NO_GNUPLOT=1";
  const std::string png = (dir_ / "chart.png").string();
  const ChartOutcome out =
      write_chart({file("a.jsonl", kFp32), file("b.jsonl", kFp16)}, {"fp32 \"base\"_1", "amp-fp16 it's ^2\nline"}, png);
  ASSERT_TRUE(out.drawn) << out.message << " (gnuplot missing: apt-get install gnuplot-nox, or set "
                         << "MIXPREC_TEST_NO_GNUPLOT=1)";
  EXPECT_NE(out.message.find(png), std::string::npos) << out.message;
  const std::string bytes = slurp(png);
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // IHDR: width and height, big-endian, at bytes 16 and 20.
  const auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  EXPECT_NE(slurp(dir_ / "chart.loss.dat").find("\n# amp-fp16 it's ^2 line\n"), std::string::npos);
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(16), 1000u);
  EXPECT_EQ(be32(20), 3 * 320u);
  // No temporary left beside it.
  EXPECT_EQ(names(), (std::vector<std::string>{"a.jsonl", "b.jsonl", "chart.accuracy.dat", "chart.gp", "chart.loss.dat",
                                               "chart.png", "chart.scale.dat"}));
}

// gnuplot failing half-way (a stand-in on PATH that writes part of its output, then exits 1): an
// error with gnuplot's message, the previous PNG untouched, no temporary left.
TEST_F(Chart, GnuplotFailureKeepsThePreviousPng) {
  const fs::path bin = dir_ / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "gnuplot") << "#!/bin/sh\n"
                                    "out=$(printf '%s' \"$2\" | sed \"s/^out='\\(.*\\)'$/\\1/\")\n"
                                    "printf '\\211PNG' > \"$out\"\n"
                                    "echo '\"chart.gp\" line 9: simulated failure' >&2\n"
                                    "exit 1\n";
  fs::permissions(bin / "gnuplot", fs::perms::owner_all);
  std::ofstream(dir_ / "chart.png") << "old";
  PathGuard path(bin.string() + ":/usr/bin:/bin");
  const std::string e = error_of([&] { fp32_and_fp16(); });
  EXPECT_NE(e.find("chart: gnuplot failed on " + (dir_ / "chart.gp").string() + " (exit status"), std::string::npos)
      << e;
  EXPECT_NE(e.find("line 9: simulated failure"), std::string::npos) << e;
  EXPECT_EQ(slurp(dir_ / "chart.png"), "old");
  EXPECT_EQ(names(), (std::vector<std::string>{"bin", "chart.accuracy.dat", "chart.gp", "chart.loss.dat", "chart.png",
                                               "chart.scale.dat", "fp16.jsonl", "fp32.jsonl"}));
}

}  // namespace
}  // namespace mixprec::cli
