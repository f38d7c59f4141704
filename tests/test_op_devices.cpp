// Every op of ops.def (the cases of op_cases.h) on each device against the CPU, in f32, bf16 and
// f16, forward and backward. The fenced test device runs the CPU kernels on memory the host may
// not touch, so its results must be the CPU's bit for bit (a stray host loop crashes instead);
// a GPU is held to the bound of test_op_backends.cpp against the CPU reference kernels.
#include <gtest/gtest.h>

#include <tuple>

#include "op_cases.h"
#include "tensor_bytes.h"

namespace mixprec::testing {
namespace {

using Param = std::tuple<size_t, Device, DType>;  // case index, device, dtype

// The fenced device everywhere; the first GPU where there is one (so a CI machine lists no CUDA
// case, and a GPU machine runs every one: none is skipped).
std::vector<Device> devices_under_test() {
  std::vector<Device> d{Device::fenced()};
  if (cuda::device_count() > 0) d.push_back(Device::cuda(0));
  return d;
}
class OpDevices : public ::testing::TestWithParam<Param> {};

TEST_P(OpDevices, MatchTheCpu) {
  const auto [index, device, dtype] = GetParam();
  const OpCase& c = op_cases()[index];
  Generator g(0xde0 + index);
  const In inputs = make_inputs(c, g, [dt = dtype](size_t) { return dt; });
  const bool exact = device.is_fenced();
  const Outcome want = run_case(c, inputs, 0x5eed + index, exact ? kernels::Backend::cpu : kernels::Backend::ref);
  const Outcome got = run_case(c, inputs, 0x5eed + index, kernels::Backend::cpu, device);
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const std::string what = i == 0 ? "output" : "gradient of input " + std::to_string(i - 1);
    const Tensor& w = want.tensors[i];
    const Tensor& r = got.tensors[i];
    ASSERT_EQ(w.defined(), r.defined()) << what;
    if (!w.defined()) continue;
    EXPECT_TRUE(r.device() == device) << what << " is on " << r.device().str();
    if (exact)
      EXPECT_EQ(testutil::bytes_of(r), testutil::bytes_of(w)) << what << " differs from the CPU's";
    else
      EXPECT_TRUE(agree_within_bound(r, w, c.k, c.rounds, what));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpDevices,
                         ::testing::Combine(::testing::Range(size_t(0), op_cases().size()),
                                            ::testing::ValuesIn(devices_under_test()),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           const OpCase& c = op_cases()[std::get<0>(p.param)];
                           return c.op + "_" + c.variant + "_" + (std::get<1>(p.param).is_cuda() ? "cuda" : "fenced") +
                                  "_" + std::string(dtype_name(std::get<2>(p.param)));
                         });

}  // namespace
}  // namespace mixprec::testing
