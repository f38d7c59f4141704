// The op table reaches every test driver and every layer: an op in ops.def without a case in
// each table-driven driver (gradcheck, fast vs reference, autocast) fails here, and so does a
// family without its files, CUDA kernels included.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "op_cases.h"
#include "ops/op_table.h"
#include "test_paths.h"

namespace mixprec::testing {
namespace {

std::set<std::string> table_ops() {
  std::set<std::string> ops;
  for (std::string_view n : kOpName) ops.insert(std::string(n));
  return ops;
}

void expect_covers(const std::string& driver, const std::set<std::string>& covered) {
  for (const std::string& op : table_ops())
    EXPECT_TRUE(covered.count(op)) << "op '" << op << "' in ops.def has no case in the " << driver << " driver";
  for (const std::string& op : covered)
    EXPECT_TRUE(table_ops().count(op)) << "the " << driver << " driver names '" << op << "', not in ops.def";
}

TEST(OpCoverage, EveryOpHasAGradcheckCase) { expect_covers("gradcheck (test_gradcheck.cpp)", gradcheck_ops()); }
TEST(OpCoverage, EveryOpHasAFastVsReferenceCase) {
  expect_covers("fast-vs-reference (test_op_backends.cpp)", backend_driver_ops());
}
TEST(OpCoverage, EveryOpHasAnAutocastCase) { expect_covers("autocast (test_op_autocast.cpp)", autocast_driver_ops()); }

// The check itself: a table missing an op is reported.
std::set<std::string> all_but_silu() {
  std::set<std::string> ops = table_ops();
  ops.erase("silu");
  return ops;
}
TEST(OpCoverage, AMissingOpIsReported) {
  EXPECT_NONFATAL_FAILURE(expect_covers("partial", all_but_silu()),
                          "op 'silu' in ops.def has no case in the partial driver");
}

// Each family of ops.def's family column has its op file, its kernel interface and dispatch,
// and its reference kernels (fast kernels where a fast path pays: src/kernels/cpu/<family>.cpp).
TEST(OpCoverage, EveryFamilyHasItsFiles) {
  const std::filesystem::path root = test::source_dir();
  for (std::string_view fam : kOpFamily) {
    const std::string f(fam);
    for (const std::string& rel : {"src/ops/" + f + ".cpp", "src/kernels/" + f + ".h", "src/kernels/" + f + ".cpp",
                                   "src/kernels/ref/" + f + ".cpp"})
      EXPECT_TRUE(std::filesystem::exists(root / rel)) << "family '" << f << "' has no " << rel;
  }
}

// Ops that may refuse CUDA (their dispatch throws one line naming the op and the device) instead
// of having a CUDA kernel: allowed only for an op that no model of ours uses (issue 17, item 4),
// with the reason beside it. The one list of them; empty today.
const std::map<std::string, std::string> kCudaRefusals = {};

// The families of ops.def's family column whose ops run on no CUDA kernel: no
// src/kernels/cuda/<family>.cu (or <family>.cpp, for a family that calls a CUDA library: cuBLASLt,
// cuDNN), or a dispatch src/kernels/<family>.cpp that never branches to it,
// and not every op of the family in `refused`.
std::vector<std::string> families_without_cuda(const std::filesystem::path& root,
                                               const std::map<std::string, std::string>& refused) {
  std::map<std::string, bool> all_refused;  // family -> every op refused
  for (size_t i = 0; i < kOpFamily.size(); ++i) {
    const std::string fam(kOpFamily[i]);
    const bool r = refused.count(std::string(kOpName[i])) > 0;
    all_refused[fam] = all_refused.count(fam) ? all_refused[fam] && r : r;
  }
  std::vector<std::string> missing;
  for (const auto& [fam, refused_all] : all_refused) {
    if (refused_all) continue;
    std::ifstream dispatch(root / ("src/kernels/" + fam + ".cpp"));
    std::stringstream text;
    text << dispatch.rdbuf();
    const bool kernel_file = std::filesystem::exists(root / ("src/kernels/cuda/" + fam + ".cu")) ||
                             std::filesystem::exists(root / ("src/kernels/cuda/" + fam + ".cpp"));
    const bool routed = text.str().find("if (on.cuda())") != std::string::npos;
    if (!kernel_file || !routed)
      missing.push_back(fam + (kernel_file ? " (src/kernels/" + fam + ".cpp never branches to cuda::)"
                                           : " (no src/kernels/cuda/" + fam + ".cu)"));
  }
  return missing;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Every op has a CUDA kernel (issue 17, item 4) or an explicit refusal in kCudaRefusals.
TEST(OpCoverage, EveryFamilyHasACudaKernel) {
  for (const auto& [op, why] : kCudaRefusals) {
    EXPECT_TRUE(table_ops().count(op)) << "kCudaRefusals names '" << op << "', not in ops.def";
    EXPECT_FALSE(why.empty()) << "the CUDA refusal of '" << op << "' gives no reason";
  }
  const std::vector<std::string> missing = families_without_cuda(MIXPREC_SOURCE_DIR, kCudaRefusals);
  EXPECT_TRUE(missing.empty()) << missing.size()
                               << " op families of ops.def have neither CUDA kernels nor a refusal in "
                                  "kCudaRefusals (tests/test_op_coverage.cpp): "
                               << joined(missing);
}

// The check itself: refusing every op of a family excuses it; a family whose file is absent (an
// empty source tree has none) is listed.
TEST(OpCoverage, AMissingCudaKernelIsReported) {
  const std::filesystem::path empty = std::filesystem::temp_directory_path() / "mixprec_no_sources";
  const std::vector<std::string> none = families_without_cuda(empty, {});
  EXPECT_EQ(none.size(), std::set<std::string_view>(kOpFamily.begin(), kOpFamily.end()).size()) << joined(none);
  EXPECT_NE(joined(none).find("softmax (no src/kernels/cuda/softmax.cu)"), std::string::npos) << joined(none);
  const std::vector<std::string> excused = families_without_cuda(empty, {{"softmax", "test"}, {"log_softmax", "test"}});
  EXPECT_EQ(joined(excused).find("softmax"), std::string::npos) << joined(excused);
  EXPECT_EQ(excused.size(), none.size() - 1);
}

}  // namespace
}  // namespace mixprec::testing
