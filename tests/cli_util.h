
// Helpers for tests that run the CLI binary (MIXPREC_CLI) on a small generated data set.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "mixprec/data.h"
#include "test_paths.h"

namespace mixprec::clitest {

namespace fs = std::filesystem;

// A fixture with a fresh directory per test (named after the test and the process), removed after.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterised test's name holds a '/' ("Name/param"): one directory level, not two, so
    // that TearDown removes all it made.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("mixprec_test_" + std::to_string(getpid()) + "_" + name);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// `mixprec ARGS`, its stdout and stderr captured through files in dir.
inline RunResult run_cli(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = mixprec::test::cli_path() + " " + args + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A small learnable data set in idx.gz files: the class is which of 10 image bands is bright.
inline void write_dataset(const fs::path& dir, const std::string& split, int n, uint32_t seed, int side = 28) {
  std::mt19937 rng(seed);
  data::IdxArray images, labels;
  images.dims = {n, side, side};
  labels.dims = {n};
  images.data.resize(size_t(n) * size_t(side) * size_t(side));
  labels.data.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int c = int(rng() % 10);
    labels.data[size_t(i)] = uint8_t(c);
    for (int r = 0; r < side; ++r)
      for (int col = 0; col < side; ++col) {
        const bool band = r * 28 / side / 3 == c;  // the class's band of rows, at any image size
        images.data[(size_t(i) * size_t(side) + size_t(r)) * size_t(side) + size_t(col)] =
            uint8_t(band ? 150 + rng() % 100 : rng() % 100);
      }
  }
  data::write_idx((dir / (split + "-images-idx3-ubyte.gz")).string(), images, true);
  data::write_idx((dir / (split + "-labels-idx1-ubyte.gz")).string(), labels, true);
}

}  // namespace mixprec::clitest
