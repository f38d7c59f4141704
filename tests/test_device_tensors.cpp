// Tensors on a device other than the CPU (the fenced test device stands in for a GPU here):
// factories, values back on the host, the host-access fence, moves that carry gradients,
// Module::to, per-device memory, and the one-line errors for mixed devices and missing GPUs.
#include <gtest/gtest.h>

#include <string>

#include <functional>

#include "error_text.h"
#include "mixprec/allocator.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using testutil::error_of;

TEST(DeviceTensors, FactoriesLandOnTheDeviceAndValuesComeBack) {
  const Device f = Device::fenced();
  const Tensor z = Tensor::zeros({3, 4}, DType::bf16, f);
  EXPECT_TRUE(z.device() == f);
  EXPECT_EQ(z.to_vector(), std::vector<float>(12, 0.0f));
  const Tensor v = Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 3.25f}, {3}, DType::f16, f);
  EXPECT_EQ(v.to_vector(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(Tensor::full({}, 7.0, DType::f32, f).item(), 7.0);
  Generator a(42), b(42);
  EXPECT_EQ(testutil::bytes_of(Tensor::randn({5, 7}, a, DType::f32, 1.0, f)),
            testutil::bytes_of(Tensor::randn({5, 7}, b)));  // the same draws on every device
  const Tensor i = Tensor::from_vector(std::vector<int64_t>{4, 5, 6}, {3}, f);
  EXPECT_EQ(i.to_vector_i64(), (std::vector<int64_t>{4, 5, 6}));
  // Strided views come back in logical order.
  const Tensor m = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32, f);
  EXPECT_EQ(m.t().to_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(m.t().contiguous().device() == f);
}

TEST(DeviceTensors, HostCodeCannotReadDeviceMemory) {
  const Tensor t = Tensor::ones({4}, DType::f32, Device::fenced());
  const std::string msg = error_of([&] { (void)t.data<float>(); });
  EXPECT_NE(msg.find("host code read a tensor on fenced (f32 [4])"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".to(Device::cpu())"), std::string::npos) << msg;
  EXPECT_EQ(Tensor::ones({4}).data<float>()[3], 1.0f);  // the CPU's memory is the host's
}

TEST(DeviceTensorsDeathTest, TheFenceFaultsAHostLoop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor t = Tensor::ones({1024}, DType::f32, Device::fenced());
  const auto* p = static_cast<const volatile float*>(t.data_ptr());  // the raw pointer, as a stray loop would
  EXPECT_DEATH({ [[maybe_unused]] float x = p[0]; }, "");
}

TEST(DeviceTensors, MixedDevicesAreOneLineNamingTheOpAndDevices) {
  const Tensor a = Tensor::ones({2, 2});
  const Tensor b = Tensor::ones({2, 2}, DType::f32, Device::fenced());
  EXPECT_EQ(error_of([&] { ops::add(a, b); }),
            "add: inputs on different devices (cpu, fenced); move them to one device with .to(device)");
  EXPECT_EQ(error_of([&] { ops::matmul(b, a); }),
            "matmul: inputs on different devices (fenced, cpu); move them to one device with .to(device)");
  Tensor c = Tensor::zeros({2, 2});
  EXPECT_EQ(error_of([&] { c.copy_(b); }),
            "copy_: source on fenced, destination on cpu; move the source with .to(device) first");
}

TEST(DeviceTensors, MissingGpuIsOneLine) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const std::string msg = error_of([] { Tensor::zeros({2}, DType::f32, Device::cuda(0)); });
  EXPECT_EQ(msg.rfind("device cuda:0 asked for, but ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  nn::Linear lin(3, 2);
  EXPECT_EQ(error_of([&] { lin.to(Device::cuda(0)); }).rfind("device cuda:0 asked for, but ", 0), 0u);
  EXPECT_TRUE(lin.weight.device().is_cpu());  // nothing moved
}

TEST(DeviceTensors, ToDeviceCarriesTheGradientBack) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, -2, 3}, {3}).set_requires_grad();
  const Tensor y = ops::mul(x.to(Device::fenced()), Tensor::full({3}, 2.0, DType::f32, Device::fenced()));
  EXPECT_TRUE(y.device().is_fenced());
  ops::sum(y).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().device().is_cpu());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 2, 2}));
  EXPECT_TRUE(x.to(Device::cpu()).same(x));  // same device: the tensor itself
}

TEST(DeviceTensors, ModuleToMovesParametersInPlace) {
  nn::Linear lin(4, 3);
  const Tensor w = lin.weight;  // another handle: sees the move
  const std::vector<uint8_t> before = testutil::bytes_of(lin.weight);
  const Tensor x = Tensor::ones({2, 4});
  const std::vector<uint8_t> y_cpu = testutil::bytes_of(lin(x));
  lin.to(Device::fenced());
  EXPECT_TRUE(w.device().is_fenced());
  EXPECT_TRUE(lin.bias.device().is_fenced());
  EXPECT_EQ(testutil::bytes_of(w), before);
  const Tensor y = lin(x.to(Device::fenced()));
  EXPECT_TRUE(y.device().is_fenced());
  EXPECT_EQ(testutil::bytes_of(y), y_cpu);
  ops::sum(y).backward();
  EXPECT_TRUE(lin.weight.grad().device().is_fenced());
  lin.to(Device::cpu());
  EXPECT_TRUE(w.device().is_cpu());
  EXPECT_EQ(testutil::bytes_of(w), before);
}

TEST(DeviceTensors, MemoryIsCountedPerDevice) {
  const MemoryStats cpu0 = allocator::stats();
  const MemoryStats f0 = allocator::stats(Device::fenced());
  {
    const MemoryScope scope(MemCategory::parameters);
    const Tensor t = Tensor::empty({1000}, DType::f32, Device::fenced());
    const MemoryStats f1 = allocator::stats(Device::fenced());
    EXPECT_EQ(f1.live_bytes[size_t(MemCategory::parameters)] - f0.live_bytes[size_t(MemCategory::parameters)], 4032);
    EXPECT_EQ(allocator::stats().live_bytes[size_t(MemCategory::parameters)],
              cpu0.live_bytes[size_t(MemCategory::parameters)]);
  }
  EXPECT_EQ(allocator::stats(Device::fenced()).live_total, f0.live_total);
}

TEST(DeviceTensors, BudgetOnTheDeviceThrowsOutOfMemoryAndGoesOn) {
  allocator::set_budget(1 << 20, Device::fenced());
  EXPECT_THROW(Tensor::empty({1 << 20}, DType::f32, Device::fenced()), OutOfMemory);
  const Tensor small = Tensor::ones({16}, DType::f32, Device::fenced());
  allocator::set_budget(0, Device::fenced());
  EXPECT_EQ(small.to_vector()[15], 1.0f);
}

}  // namespace
}  // namespace mixprec
