// Fast vs reference for every op of ops.def (the cases of op_cases.h), in f32, bf16 and f16,
// forward and backward: each case runs once on the reference backend and once on the backend
// under test with the same inputs and output gradient, and every output and input gradient must
// agree within a bound derived from the dtype and the case's reduction length k:
//   |fast - ref| <= 2 ulp_t(ref) + (k + 2) u32 S + rounds * ulp_t(S)
// with u32 = 2^-24 (both backends accumulate in f32 or wider), S the largest |ref| of that
// tensor (the scale of its terms), and `rounds` the values inside the op whose last bit may
// differ between backends (op_cases.h). The backend is a parameter: the CUDA backend of the next
// issue joins the list below.
#include <gtest/gtest.h>

#include <tuple>

#include "kernels/backend.h"
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
  const Outcome fast = run_case(c, inputs, 0x5eed + index, backend);
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
