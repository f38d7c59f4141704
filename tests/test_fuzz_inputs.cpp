// The fuzz targets' inputs replayed through the real readers: the seed corpus (tests/fuzz/corpus/,
// each with its expected outcome) and the regressions the fuzzer found (tests/fuzz/regressions/),
// which must load or fail with a one-line mixprec::Error (ASan and UBSan watch in the sanitizer build).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "error_text.h"
#include "mixprec/data.h"
#include "mixprec/io.h"

namespace mixprec {
namespace {

namespace fs = std::filesystem;
const fs::path kFuzzDir = fs::path(MIXPREC_SOURCE_DIR) / "tests" / "fuzz";

// The files of kFuzzDir/<sub>/<target>, by name.
std::map<std::string, std::string> inputs(const std::string& sub, const std::string& target) {
  std::map<std::string, std::string> files;
  const fs::path dir = kFuzzDir / sub / target;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) files.emplace(e.path().filename().string(), e.path().string());
  return files;
}

// What reading the file does: "" when it loads, else the error's message.
template <class Read>
std::string outcome(Read read, const std::string& path) {
  try {
    read(path);
    return "";
  } catch (const Error&) {
    return testutil::error_of([&] { read(path); });
  }
}

const auto read_safetensors = [](const std::string& p) { io::load_safetensors(p); };
const auto read_idx = [](const std::string& p) { data::read_idx(p); };

TEST(FuzzInputs, SafetensorsSeedsGiveTheirOutcome) {
  // name -> "" (loads) or a piece of the expected error.
  const std::map<std::string, std::string> expected = {
      {"two_f32", ""},
      {"every_dtype", ""},
      {"out_of_order_padded", ""},
      {"empty", ""},
      {"overlap", "data_offsets [4, 8] overlap tensor 'a' [0, 8]"},
      {"truncated", "run past the end of the data"},
      {"f8", "dtype F8_E4M3 is not supported yet"},
  };
  const auto files = inputs("corpus", "safetensors");
  ASSERT_EQ(files.size(), expected.size());
  for (const auto& [name, path] : files) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.count(name));
    const std::string what = outcome(read_safetensors, path);
    if (expected.at(name).empty())
      EXPECT_EQ(what, "");
    else
      EXPECT_NE(what.find(expected.at(name)), std::string::npos) << what;
  }
}

TEST(FuzzInputs, IdxSeedsGiveTheirOutcome) {
  const std::map<std::string, std::string> expected = {
      {"labels", ""},    {"images", ""},         {"labels.gz", ""},
      {"images.gz", ""}, {"two_members.gz", ""}, {"truncated", "truncated"},
  };
  const auto files = inputs("corpus", "idx");
  ASSERT_EQ(files.size(), expected.size());
  for (const auto& [name, path] : files) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.count(name));
    const std::string what = outcome(read_idx, path);
    if (expected.at(name).empty())
      EXPECT_EQ(what, "");
    else
      EXPECT_NE(what.find(expected.at(name)), std::string::npos) << what;
  }
}

TEST(FuzzInputs, RegressionsLoadOrFailInOneLine) {
  // The first one found: a number beyond a double made nlohmann throw out_of_range past our catch.
  const std::string overflow =
      outcome(read_safetensors, (kFuzzDir / "regressions" / "safetensors" / "number-overflow-1e999").string());
  EXPECT_NE(overflow.find("is not valid JSON: number overflow parsing '9999999999999e9999"), std::string::npos)
      << overflow;
  for (const auto& [name, path] : inputs("regressions", "safetensors")) {
    SCOPED_TRACE(path);
    (void)outcome(read_safetensors, path);  // error_of checks the message is one line
  }
  for (const auto& [name, path] : inputs("regressions", "idx")) {
    SCOPED_TRACE(path);
    (void)outcome(read_idx, path);
  }
}

}  // namespace
}  // namespace mixprec
