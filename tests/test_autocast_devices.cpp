// Autocast per device type: each type keeps its own state and default dtype (CPU bf16, CUDA and
// the fenced stand-in fp16), an op follows the state of its inputs' device type, the weight-cast
// cache serves device tensors, and on the fenced device the results equal the CPU's bit for bit.
#include <gtest/gtest.h>

#include "autocast/autocast_state.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

struct Layer {
  Tensor w, b;  // f32 leaf parameters on one device
};
Layer make_layer(Generator& g, const Device& d) {
  Tensor w = Tensor::randn({6, 8}, g, DType::f32, 0.3), b = Tensor::randn({6}, g, DType::f32, 0.1);
  return {w.to(d).set_requires_grad(), b.to(d).set_requires_grad()};
}

TEST(AutocastDevices, EachDeviceTypeHasItsOwnDefaultAndState) {
  EXPECT_EQ(amp::autocast_dtype(DeviceType::cpu), DType::bf16);
  EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::f16);
  EXPECT_EQ(amp::autocast_dtype(DeviceType::fenced), DType::f16);
  EXPECT_EQ(amp::autocast_dtype(), DType::bf16);  // no argument: the CPU's
  {
    amp::Autocast cuda(DeviceType::cuda);  // no dtype: the type's own default
    EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::cuda));
    EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::f16);
    EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::cpu));
    EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::fenced));
    {
      amp::Autocast cpu(DType::f16);  // the CPU form leaves the CUDA state alone
      EXPECT_TRUE(amp::is_autocast_enabled());
      EXPECT_EQ(amp::autocast_dtype(DeviceType::cpu), DType::f16);
      EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::f16);
      amp::Autocast cuda_bf16(DeviceType::cuda, DType::bf16);
      EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::bf16);
      EXPECT_EQ(amp::autocast_dtype(DeviceType::cpu), DType::f16);
      amp::Autocast inherit(DeviceType::cuda);  // nested without a dtype: the current one, as PyTorch
      EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::bf16);
    }
    EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::cpu));
    EXPECT_EQ(amp::autocast_dtype(DeviceType::cuda), DType::f16);
    amp::Autocast off(DeviceType::cuda, std::nullopt, /*enabled=*/false);
    EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::cuda));
  }
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::cuda));
  EXPECT_THROW(amp::Autocast(DeviceType::fenced, DType::f32), Error);
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::fenced));
}

TEST(AutocastDevices, AnOpFollowsItsInputsDeviceType) {
  Generator g(1);
  const Layer cpu = make_layer(g, Device::cpu()), fenced = make_layer(g, Device::fenced());
  const Tensor x = Tensor::randn({4, 8}, g), xf = x.to(Device::fenced());
  {
    amp::Autocast ac(DeviceType::fenced);  // fp16 by default
    EXPECT_EQ(ops::linear(xf, fenced.w, fenced.b).dtype(), DType::f16);
    EXPECT_EQ(ops::linear(x, cpu.w, cpu.b).dtype(), DType::f32);  // the CPU's autocast is off
    EXPECT_EQ(ops::softmax(xf.to(DType::f16)).dtype(), DType::f32);
    EXPECT_EQ(ops::softmax(x.to(DType::f16)).dtype(), DType::f16);
  }
  {
    amp::Autocast ac(DType::bf16);  // the CPU's
    EXPECT_EQ(ops::linear(x, cpu.w, cpu.b).dtype(), DType::bf16);
    EXPECT_EQ(ops::linear(xf, fenced.w, fenced.b).dtype(), DType::f32);
  }
  {
    amp::Autocast on_cpu(DType::bf16), on_fenced(DeviceType::fenced, DType::f16);
    EXPECT_EQ(ops::linear(x, cpu.w, cpu.b).dtype(), DType::bf16);
    EXPECT_EQ(ops::linear(xf, fenced.w, fenced.b).dtype(), DType::f16);
    amp::Autocast fenced_off(DeviceType::fenced, std::nullopt, /*enabled=*/false);
    EXPECT_EQ(ops::linear(xf, fenced.w, fenced.b).dtype(), DType::f32);
    EXPECT_EQ(ops::linear(x, cpu.w, cpu.b).dtype(), DType::bf16);
  }
}

// The cache keeps one 16-bit copy of a device parameter per outermost region, on the device, and
// casts afresh after an in-place write to the parameter.
TEST(AutocastDevices, WeightCastCacheServesDeviceTensors) {
  Generator g(2);
  Layer l = make_layer(g, Device::fenced());
  const Tensor x = Tensor::randn({3, 8}, g).to(Device::fenced());
  ASSERT_EQ(amp::autocast_cache_size(), 0u);
  {
    amp::Autocast ac(DeviceType::fenced, DType::bf16);
    const Tensor y1 = ops::linear(x, l.w, l.b);
    EXPECT_EQ(amp::autocast_cache_size(), 2u);
    const Tensor y2 = ops::linear(ops::relu(x), l.w, l.b);
    EXPECT_EQ(amp::autocast_cache_size(), 2u);  // reused, not re-cast
    ASSERT_NE(y1.grad_fn(), nullptr);
    EXPECT_EQ(y1.grad_fn()->next[1], y2.grad_fn()->next[1]);  // one cast node for w
    EXPECT_EQ(y1.device(), Device::fenced());
    const std::vector<float> before = ops::linear(x, l.w).to_vector();
    {
      autograd::NoGradGuard no_grad;
      l.w.copy_(Tensor::full(l.w.shape(), 0.25).to(Device::fenced()));  // as an optimizer step writes
    }
    const std::vector<float> after = ops::linear(x, l.w).to_vector();
    std::vector<float> want;
    {
      amp::Autocast off(DeviceType::fenced, std::nullopt, /*enabled=*/false);
      want = ops::linear(x.to(DType::bf16), l.w.detach().to(DType::bf16)).to_vector();
    }
    EXPECT_NE(after, before);
    EXPECT_EQ(after, want);
  }
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
}

// A small forward and backward under each device type's autocast in the same dtype: the fenced
// device (the CPU kernels behind a fence) gives the CPU's bits, outputs and f32 gradients.
TEST(AutocastDevices, FencedEqualsCpuBitForBitInEachDtype) {
  for (const DType half : {DType::bf16, DType::f16}) {
    std::vector<std::vector<uint8_t>> bits[2];
    for (const Device& d : {Device::cpu(), Device::fenced()}) {
      Generator g(3);
      const Layer l1 = make_layer(g, d);
      const Tensor x = Tensor::randn({5, 8}, g).to(d);
      const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5}).to(d);
      Tensor loss;
      {
        amp::Autocast ac(d.type, half);
        loss = ops::cross_entropy(ops::relu(ops::linear(x, l1.w, l1.b)), y);
      }
      EXPECT_EQ(loss.dtype(), DType::f32);
      loss.backward();
      auto& out = bits[d.is_fenced()];
      for (const Tensor& t : {loss, l1.w.grad(), l1.b.grad()}) {
        EXPECT_EQ(t.device(), d);
        out.push_back(testutil::bytes_of(t));
      }
    }
    EXPECT_EQ(bits[0], bits[1]) << dtype_name(half);
  }
}

}  // namespace
}  // namespace mixprec
