// The public API's shape: mixprec/mixprec.h includes every public header, and no public header
// includes a private dependency (oneDNN, zlib, JSON) or anything under src/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "mixprec/mixprec.h"
#include "test_paths.h"

namespace mixprec {
namespace {

namespace fs = std::filesystem;
const fs::path kIncludeDir = fs::path(test::source_dir()) / "include" / "mixprec";

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> public_headers() {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(kIncludeDir))
    if (e.is_regular_file() && e.path().extension() == ".h") names.insert(e.path().filename().string());
  return names;
}

TEST(PublicApi, UmbrellaHeaderIncludesEveryPublicHeader) {
  const std::string umbrella = read_text(kIncludeDir / "mixprec.h");
  const std::set<std::string> names = public_headers();
  ASSERT_GT(names.size(), 10u);
  for (const std::string& h : names) {
    if (h == "mixprec.h") continue;
    EXPECT_NE(umbrella.find("#include \"mixprec/" + h + "\""), std::string::npos) << h;
  }
}

TEST(PublicApi, NoPublicHeaderIncludesAPrivateDependency) {
  for (const std::string& h : public_headers()) {
    std::istringstream lines(read_text(kIncludeDir / h));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("#include", 0) != 0) continue;
      const bool ours = line.find("\"mixprec/") != std::string::npos;
      const bool standard = line.find('<') != std::string::npos && line.find('/') == std::string::npos &&
                            line.find(".h") == std::string::npos;
      EXPECT_TRUE(ours || standard) << h << ": " << line;
    }
  }
}

}  // namespace
}  // namespace mixprec
