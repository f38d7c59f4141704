// Fast vs reference for every op of ops.def (the cases of op_cases.h), in f32, bf16 and f16,
// forward and backward: each case runs once on the reference backend and once on the backend
// under test with the same inputs and output gradient, and every output and input gradient must
// agree within a bound derived from the dtype and the case's reduction length k:
//   |fast - ref| <= 2 ulp_t(ref) + (k + 2) u32 S + rounds * ulp_t(S)
// with u32 = 2^-24 (both backends accumulate in f32 or wider), S the largest |ref| of that
// tensor (the scale of its terms), and `rounds` the values inside the op whose last bit may
// differ between backends (op_cases.h). The backend is a parameter: the CUDA backend of the next
// issue joins the list below. Where a kernel's fast path declines the case and runs the reference,
// the test says so (a NOTE line and the test property reference_fallbacks).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <tuple>

#include "kernels/backend.h"
#include "mixprec/profile.h"
#include "op_cases.h"

namespace mixprec::testing {
namespace {

using Param = std::tuple<size_t, kernels::Backend, DType>;  // case index, backend, dtype
class OpBackends : public ::testing::TestWithParam<Param> {};

TEST_P(OpBackends, MatchReferenceForwardAndBackward) {
  const auto [index, backend, dtype] = GetParam();
  const OpCase& c = op_cases()[index];
  Generator g(0xbac0 + index);
  const In inputs = make_inputs(c, g, [dt = dtype](size_t) { return dt; });
  const Outcome ref = run_case(c, inputs, 0x5eed + index, kernels::Backend::ref);
  // The fast run under the profiler. A kernel with a fast path that ran the reference for this case
  // (on this host: f64 casts, strided copies, sums over leading dims, column broadcasts) is named:
  // that part of the comparison is the reference against itself (docs/hosts.md lists them).
  profile::start();
  const Outcome fast = run_case(c, inputs, 0x5eed + index, backend);
  profile::stop();
  std::set<std::string> declined;
  for (const profile::Row& r : profile::rows())
    if (r.impl.find("reference") != std::string::npos) declined.insert(r.phase + " " + r.kernel);
  if (!declined.empty()) {
    std::string names;
    for (const std::string& d : declined) names += (names.empty() ? "" : ", ") + d;
    RecordProperty("reference_fallbacks", names);
    std::printf("[ NOTE     ] %s_%s %s: ran the reference on the fast backend (compared with itself): %s\n",
                c.op.c_str(), c.variant.c_str(), std::string(dtype_name(dtype)).c_str(), names.c_str());
  }
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    const std::string what = i == 0 ? "output" : "gradient of input " + std::to_string(i - 1);
    EXPECT_TRUE(agree_within_bound(fast.tensors[i], ref.tensors[i], c.k, c.rounds, what));
  }
}

std::string backend_name(kernels::Backend b) { return b == kernels::Backend::cpu ? "cpu" : "ref"; }

INSTANTIATE_TEST_SUITE_P(Ops, OpBackends,
                         ::testing::Combine(::testing::Range(size_t(0), op_cases().size()),
                                            ::testing::Values(kernels::Backend::cpu),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           const OpCase& c = op_cases()[std::get<0>(p.param)];
                           return c.op + "_" + c.variant + "_" + backend_name(std::get<1>(p.param)) + "_" +
                                  std::string(dtype_name(std::get<2>(p.param)));
                         });

}  // namespace

std::set<std::string> backend_driver_ops() {
  std::set<std::string> ops;
  for (const OpCase& c : op_cases()) ops.insert(c.op);
  return ops;
}

}  // namespace mixprec::testing
