// The op table reaches every test driver and every layer: an op in ops.def without a case in
// each table-driven driver (gradcheck, fast vs reference, autocast) fails here, and so does a
// family without its files.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
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

}  // namespace
}  // namespace mixprec::testing
