// Channels-last (kernels/shape.h; ops::MemoryFormat): which tensors have the layout, the copies
// between it and NCHW against the reference copy, the ops that keep it (their values and
// gradients are the op cases' business: op_cases.cpp, test_gradcheck.cpp), and the cnn with
// channels-last convolutions against the same cnn in NCHW: the same bits on the CPU, which
// computes in NCHW either way; on a GPU, where cuDNN's engines differ between the layouts, within
// the products' bound.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/ref/access.h"
#include "kernels/shape.h"
#include "mixprec/autocast.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"
#include "tensor_bytes.h"
#include "within_bound.h"

namespace mixprec::testing {
namespace {

using testutil::bytes_of;
const auto kCl = ops::MemoryFormat::channels_last;

Tensor randn(const Shape& s, uint64_t seed, DType t = DType::f32) {
  Generator g(seed);
  return Tensor::randn(s, g, DType::f64).to(t);
}

TEST(ChannelsLast, WhichTensorsHaveTheLayout) {
  const Tensor x = randn({2, 3, 4, 5}, 1);
  EXPECT_FALSE(kernels::is_channels_last(x));
  EXPECT_FALSE(kernels::nhwc_dense(x));
  const Tensor y = ops::contiguous(x, kCl);
  EXPECT_TRUE(kernels::is_channels_last(y));
  EXPECT_EQ(y.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_EQ(bytes_of(y), bytes_of(x)) << "the same values in logical order";
  EXPECT_TRUE(ops::contiguous(y, kCl).same(y)) << "already channels-last: no copy";
  // One channel (or a 1x1 plane): both layouts at once, so neither copied nor counted as channels-last.
  const Tensor one = randn({2, 1, 4, 5}, 2);
  EXPECT_TRUE(kernels::nhwc_dense(one));
  EXPECT_FALSE(kernels::is_channels_last(one));
  EXPECT_TRUE(ops::contiguous(one, kCl).same(one));
  EXPECT_TRUE(ops::contiguous(y, ops::MemoryFormat::contiguous).is_contiguous());
  try {
    ops::contiguous(randn({3, 4, 5}, 3), kCl);
    ADD_FAILURE() << "a 3-d tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a 4-d [N, C, H, W] tensor, got [3, 4, 5]"), std::string::npos)
        << e.what();
  }
}

TEST(ChannelsLast, CopiesBetweenTheLayoutsGiveTheReferenceBytes) {
  // The CPU's tiled copy across layouts against the reference's element loop, both ways, planes of
  // 7 x 7 (the wide cnn's last) to 28 x 28, channel counts below and above a tile.
  for (const DType t : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::u8}) {
    for (const Shape& s : {Shape{2, 420, 7, 7}, Shape{3, 5, 28, 28}, Shape{1, 33, 3, 9}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_str(s));
      const Tensor x = t == DType::u8 ? randn(s, 4).to(DType::f32).to(DType::u8) : randn(s, 4, t);
      Tensor fast = kernels::empty_channels_last(s, t, Device::cpu()),
             ref = kernels::empty_channels_last(s, t, Device::cpu());
      kernels::copy(x, fast);
      kernels::ref::copy(x, ref);
      EXPECT_EQ(bytes_of(kernels::nhwc_view(fast)), bytes_of(kernels::nhwc_view(ref))) << "to NHWC";
      EXPECT_EQ(bytes_of(fast), bytes_of(x));
      Tensor back = Tensor::empty(s, t), back_ref = Tensor::empty(s, t);
      kernels::copy(fast, back);
      kernels::ref::copy(fast, back_ref);
      EXPECT_EQ(bytes_of(back), bytes_of(back_ref)) << "to NCHW";
      EXPECT_EQ(bytes_of(back), bytes_of(x));
    }
  }
}

TEST(ChannelsLast, ConvPoolAndReluKeepTheLayoutThroughForwardAndBackward) {
  Tensor x = randn({2, 3, 8, 8}, 5).set_requires_grad();
  Tensor w = randn({8, 3, 3, 3}, 6).set_requires_grad();
  const Tensor b = randn({8}, 7).set_requires_grad();
  const Tensor y = ops::conv2d(x, w, b, {.padding = 1, .channels_last = true});
  EXPECT_TRUE(kernels::is_channels_last(y)) << "the option: channels-last whatever x's layout";
  const Tensor p = ops::max_pool2d(y, 2);
  EXPECT_TRUE(kernels::is_channels_last(p));
  const Tensor r = ops::relu(p);
  EXPECT_TRUE(kernels::is_channels_last(r));
  const Tensor y2 = ops::conv2d(r, randn({4, 8, 3, 3}, 8), Tensor(), {.padding = 1});
  EXPECT_TRUE(kernels::is_channels_last(y2)) << "a channels-last input gives a channels-last output";
  const Tensor r16 = ops::cast(r, DType::bf16);
  EXPECT_TRUE(kernels::is_channels_last(r16)) << "a cast keeps the layout";
  EXPECT_EQ(bytes_of(r16), bytes_of(ops::cast(ops::contiguous(r), DType::bf16)));
  {
    amp::Autocast ac(DType::bf16);
    EXPECT_TRUE(kernels::is_channels_last(ops::conv2d(r, randn({4, 8, 3, 3}, 8))))
        << "autocast's cast of a channels-last input keeps it";
  }
  // The flatten copies into NCHW order; the gradient comes back in it and is laid out again.
  const Tensor loss = ops::sum(ops::mul(ops::flatten(y2), randn({2, 64}, 9)));
  loss.backward();
  EXPECT_TRUE(w.grad().is_contiguous()) << "the weight's gradient in the weight's layout";
  EXPECT_EQ(x.grad().shape(), x.shape());
}

// The cnn (two conv / ReLU / 2x2 max-pool stages and a linear classifier) in NCHW and with
// channels-last convolutions, from the same weights: its loss and every gradient, on `device`.
struct CnnRun {
  std::vector<uint8_t> loss;
  std::vector<Tensor> grads;
};
CnnRun run_cnn(bool channels_last, DType autocast_dtype, const Device& device) {
  default_generator().manual_seed(11);
  auto m = std::make_shared<nn::Sequential>();
  const nn::Conv2dOptions conv{.padding = 1, .channels_last = channels_last};
  m->push_back(std::make_shared<nn::Conv2d>(1, 16, 3, conv));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Conv2d>(16, 24, 3, conv));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(24 * 7 * 7, 10));
  m->to(device);
  const Tensor x = randn({6, 1, 28, 28}, 12).to(device);
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{1, 3, 5, 7, 9, 0}, {6}).to(device);
  Tensor loss;
  {
    const bool on = autocast_dtype != DType::f32;
    amp::Autocast ac(device.is_cuda() ? DeviceType::cuda : DeviceType::cpu, on ? autocast_dtype : DType::bf16, on);
    loss = ops::cross_entropy(m->forward(x), target);
  }
  loss.backward();
  CnnRun r{bytes_of(loss), {}};
  for (const Tensor& p : m->parameters()) r.grads.push_back(p.grad().to(Device::cpu()));
  return r;
}

TEST(ChannelsLast, TheCnnGivesTheNchwBitsOnTheCpu) {
  for (const DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(t == DType::f32 ? "f32" : "autocast bf16");
    const CnnRun nchw = run_cnn(false, t, Device::cpu()), cl = run_cnn(true, t, Device::cpu());
    EXPECT_EQ(cl.loss, nchw.loss);
    ASSERT_EQ(cl.grads.size(), nchw.grads.size());
    for (size_t i = 0; i < cl.grads.size(); ++i) EXPECT_EQ(bytes_of(cl.grads[i]), bytes_of(nchw.grads[i])) << i;
  }
}

TEST(ChannelsLastCuda, CopiesBetweenTheLayoutsGiveTheCpusBytes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU (" << cuda::unavailable_reason() << ")";
  // The GPU's tiled transpose (cuda/shape.cu), both ways, with and without a dtype change, on
  // planes and channel counts that are and are not multiples of its 32 x 32 tile, one image and
  // several, and a weight's [OC, C, KH, KW] <-> KRSC.
  const Device gpu = Device::cuda(0);
  for (const auto& [from, to] : {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
                                 std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::f16}}) {
    for (const Shape& s : {Shape{2, 420, 7, 7}, Shape{1, 33, 3, 9}, Shape{3, 64, 32, 32}, Shape{40, 12, 3, 3}}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)) + " " + shape_str(s));
      const Tensor x = randn(s, 13, from);
      Tensor cl = kernels::empty_channels_last(s, to, gpu), cl_cpu = kernels::empty_channels_last(s, to, Device::cpu());
      kernels::copy(x.to(gpu), cl);
      kernels::copy(x, cl_cpu);
      EXPECT_EQ(bytes_of(kernels::nhwc_view(cl)), bytes_of(kernels::nhwc_view(cl_cpu))) << "to NHWC";
      Tensor back = Tensor::empty(s, from, gpu), back_cpu = Tensor::empty(s, from, Device::cpu());
      kernels::copy(kernels::channels_last(x.to(to).to(gpu)), back);
      kernels::copy(kernels::channels_last(x.to(to)), back_cpu);
      EXPECT_EQ(bytes_of(back), bytes_of(back_cpu)) << "to NCHW";
    }
  }
}

TEST(ChannelsLastCuda, TheCnnAgreesWithItsNchwRunOnAGpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU (" << cuda::unavailable_reason() << ")";
  // cuDNN picks other engines for the other layout, so the gradients agree to the products'
  // bound (the deepest sum: the first conv's weight gradient, 6 x 28 x 28 terms), not bit for bit.
  for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    const CnnRun nchw = run_cnn(false, t, Device::cuda(0)), cl = run_cnn(true, t, Device::cuda(0));
    ASSERT_EQ(cl.grads.size(), nchw.grads.size());
    for (size_t i = 0; i < cl.grads.size(); ++i)
      EXPECT_TRUE(agree_within_bound(cl.grads[i], nchw.grads[i], 6 * 28 * 28, 2, "gradient " + std::to_string(i)));
  }
}

}  // namespace
}  // namespace mixprec::testing
