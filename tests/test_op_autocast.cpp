// Every op of ops.def (the cases of op_cases.h) under a bf16 and an f16 autocast, with its
// inputs in mixed dtypes (each input in turn f32, bf16 and f16), on the CPU and on the fenced
// device (under that device type's autocast): the output has the dtype the op's autocast class
// says, and the backward gives every input a gradient in that input's own dtype, on the inputs'
// device. This is what proves each op honours its class on every device (ops apply it at entry;
// docs/design.md).
#include <gtest/gtest.h>

#include <array>
#include <tuple>

#include "mixprec/autocast.h"
#include "mixprec/error.h"
#include "op_cases.h"
#include "ops/op_table.h"

namespace mixprec::testing {
namespace {

OpId op_id(const std::string& name) {
  for (size_t i = 0; i < kNumOps; ++i)
    if (kOpName[i] == name) return static_cast<OpId>(i);
  throw Error("no op '" + name + "' in ops.def");
}

// The output dtype the class prescribes for these (floating) input dtypes.
DType expected_dtype(AutocastClass cls, DType autocast, const In& inputs) {
  std::vector<DType> in;
  for (const Tensor& t : inputs)
    if (is_floating(t.dtype())) in.push_back(t.dtype());
  switch (cls) {
    case AutocastClass::lower:
      return autocast;
    case AutocastClass::fp32:
      return DType::f32;
    case AutocastClass::promote: {
      DType d = in.at(0);
      for (DType t : in) d = promote_floating(d, t);
      return d;
    }
    case AutocastClass::keep:
    case AutocastClass::mixed:
      return in.at(0);
  }
  return DType::f64;
}

constexpr std::array<DType, 3> kCycle = {DType::f32, DType::bf16, DType::f16};

// case index, autocast dtype, dtype rotation, device
using Param = std::tuple<size_t, DType, size_t, Device>;
class OpAutocast : public ::testing::TestWithParam<Param> {};

TEST_P(OpAutocast, OutputHasItsClassDtypeAndGradientsTheirInputsDtype) {
  const auto [index, autocast, rotation, device] = GetParam();
  const OpCase& c = op_cases()[index];
  const AutocastClass cls = op_class(op_id(c.op));
  Generator g(0xac + index);
  In inputs = make_inputs(c, g, [r = rotation](size_t i) { return kCycle[(i + r) % kCycle.size()]; });
  for (Tensor& t : inputs) {  // leaves on the device
    Tensor l = t.detach().to(device);
    t = t.requires_grad() ? l.detach().set_requires_grad() : l;
  }
  Tensor y;
  {
    // The other device type's guard is on too, in the other dtype: an op follows its inputs' type.
    const DeviceType other = device.is_cpu() ? DeviceType::fenced : DeviceType::cpu;
    amp::Autocast off_device(other, autocast == DType::bf16 ? DType::f16 : DType::bf16);
    amp::Autocast ac(device.type, autocast);
    y = c.f(inputs);
  }
  ASSERT_TRUE(y.defined());
  EXPECT_EQ(y.device(), device);
  EXPECT_EQ(y.dtype(), expected_dtype(cls, autocast, inputs))
      << c.op << " (class " << int(cls) << ") returned " << dtype_name(y.dtype());
  y.backward(nonzero_values(y.shape(), y.dtype(), false, g).to(device));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    const Tensor gi = inputs[i].grad();
    ASSERT_TRUE(gi.defined()) << "input " << i << " received no gradient";
    EXPECT_EQ(gi.dtype(), inputs[i].dtype()) << "gradient of input " << i;
    EXPECT_EQ(gi.shape(), inputs[i].shape()) << "gradient of input " << i;
    EXPECT_EQ(gi.device(), device) << "gradient of input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpAutocast,
                         ::testing::Combine(::testing::Range(size_t(0), op_cases().size()),
                                            ::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Range(size_t(0), kCycle.size()),
                                            ::testing::Values(Device::cpu(), Device::fenced())),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           const OpCase& c = op_cases()[std::get<0>(p.param)];
                           return c.op + "_" + c.variant + "_autocast_" +
                                  std::string(dtype_name(std::get<1>(p.param))) + "_rotation" +
                                  std::to_string(std::get<2>(p.param)) + "_" + std::get<3>(p.param).str();
                         });

}  // namespace

std::set<std::string> autocast_driver_ops() {
  std::set<std::string> ops;
  for (const OpCase& c : op_cases()) ops.insert(c.op);
  return ops;
}

}  // namespace mixprec::testing
