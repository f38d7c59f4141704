// Max pooling's 2x2 kernels (src/kernels/cuda/pool_2x2.cuh) on the CPU: their per-output bodies
// over every output, against the reference kernels bit for bit, in f32, bf16 and f16: the forward
// (max and tap), the backward from the argmax and from the input. The inputs hold ties (a few
// levels), NaNs (one per window at most, and windows of two), infinities and signed zeros, so the
// scan's rule (a NaN propagates and the last NaN wins; ties keep the first tap) is what is
// checked. grad_x starts as NaN so a place the scatter does not write fails. Plus which
// geometries and pointers the kernels take. What this cannot show: the GPU's speed.
#include "cuda_shim.h"  // first: the CUDA keywords the kernel header uses

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/pool_2x2.cuh"
#include "kernels/cuda/pool_2x2_nhwc.cuh"
#include "kernels/shape.h"
#include "mixprec/random.h"
#include "tensor_bytes.h"  // tests/

namespace mixprec::testing {
namespace {

namespace p2 = kernels::cuda::pool2x2;
using kernels::PoolGeometry;
using testutil::bytes_of;

PoolGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w) {
  PoolGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.oh = h / 2, g.ow = w / 2;
  g.kh = g.kw = g.stride_h = g.stride_w = 2;
  return g;
}

// Values from a few levels (ties in most windows), with NaNs, infinities and signed zeros mixed in.
Tensor input(const Shape& s, DType t, Generator& gen) {
  const Tensor u = Tensor::uniform(s, gen, 0, 1, DType::f64);
  std::vector<double> v = u.to_vector_f64();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double& x : v) {
    const int level = int(x * 40);
    x = level < 2   ? nan
        : level < 3 ? inf
        : level < 4 ? -inf
        : level < 6 ? -0.0
        : level < 8 ? 0.0
                    : double(level % 5) - 2;
  }
  return Tensor::from_vector(v, s).to(t);
}

template <class T>
void check(const PoolGeometry& g, DType t) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(g.n) + "x" + std::to_string(g.c) + "x" +
               std::to_string(g.h) + "x" + std::to_string(g.w));
  Generator gen(0x2b2 + uint64_t(g.h * 31 + g.w) + uint64_t(t));
  const Tensor x = input({g.n, g.c, g.h, g.w}, t, gen);
  const Tensor gy = Tensor::uniform({g.n, g.c, g.oh, g.ow}, gen, -2, 2, DType::f64).to(t);
  ASSERT_TRUE(p2::takes(g, sizeof(T), x.data_ptr(), x.data_ptr()));
  const int64_t outputs = g.n * g.c * g.oh * g.ow;
  const auto nan_filled = [&](const Shape& s) {
    Tensor z = Tensor::empty(s, t);
    std::memset(z.data_ptr(), 0xff, z.nbytes());  // NaN in every float dtype
    return z;
  };

  const kernels::MaxPoolResult want = kernels::ref::max_pool2d_forward(x, g);
  ASSERT_EQ(want.argmax.dtype(), DType::u8);
  Tensor y = nan_filled({g.n, g.c, g.oh, g.ow}), arg = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::u8);
  const auto* xp = static_cast<const T*>(x.data_ptr());
  for (int32_t i = 0; i < int32_t(outputs); ++i)
    p2::forward_at(xp, int32_t(g.ow), i, static_cast<T*>(y.data_ptr()), static_cast<uint8_t*>(arg.data_ptr()));
  EXPECT_EQ(bytes_of(y), bytes_of(want.dst)) << "max";
  EXPECT_EQ(bytes_of(arg), bytes_of(want.argmax)) << "tap";

  const auto* gyp = static_cast<const T*>(gy.data_ptr());
  Tensor gx = nan_filled({g.n, g.c, g.h, g.w});
  for (int32_t i = 0; i < int32_t(outputs); ++i)
    p2::backward_at(gyp, static_cast<const uint8_t*>(want.argmax.data_ptr()), int32_t(g.ow), i,
                    static_cast<T*>(gx.data_ptr()));
  EXPECT_EQ(bytes_of(gx), bytes_of(kernels::ref::max_pool2d_backward(gy, want.argmax, g))) << "backward";

  Tensor gx2 = nan_filled({g.n, g.c, g.h, g.w});
  for (int32_t i = 0; i < int32_t(outputs); ++i)
    p2::backward_from_input_at(gyp, xp, int32_t(g.ow), i, static_cast<T*>(gx2.data_ptr()));
  EXPECT_EQ(bytes_of(gx2), bytes_of(kernels::ref::max_pool2d_backward_from_input(gy, x, g))) << "from input";
}

TEST(EmulatedPool2x2, MatchesTheReferenceBitForBit) {
  // Planes of several rows of windows, one row of one window, widths that are and are not a
  // multiple of a warp's outputs; the models' 28 -> 14 and 14 -> 7.
  for (const PoolGeometry& g : {geometry(2, 3, 8, 6), geometry(1, 1, 2, 2), geometry(3, 2, 4, 70),
                                geometry(2, 4, 28, 28), geometry(2, 5, 14, 14)}) {
    check<float>(g, DType::f32);
    check<bf16_t>(g, DType::bf16);
    check<f16_t>(g, DType::f16);
  }
}

TEST(EmulatedPool2x2, TakesOnlyExactTilingsAndAlignedPointers) {
  alignas(16) static float buf[8];
  const PoolGeometry ok = geometry(2, 3, 8, 6);
  EXPECT_TRUE(p2::takes(ok, sizeof(float), buf, buf));
  EXPECT_FALSE(p2::takes(ok, sizeof(float), buf + 1, buf)) << "x off 8 bytes";
  EXPECT_FALSE(p2::takes(ok, sizeof(float), buf, buf + 1)) << "grad_x off 8 bytes";
  EXPECT_TRUE(p2::takes(ok, 2, reinterpret_cast<unsigned char*>(buf) + 4, buf)) << "16-bit: 4 bytes suffice";
  EXPECT_FALSE(p2::takes(ok, 2, reinterpret_cast<unsigned char*>(buf) + 2, buf)) << "16-bit off 4 bytes";
  const auto with = [&](auto change) {
    PoolGeometry g = ok;
    change(g);
    return p2::takes(g, sizeof(float), buf, buf);
  };
  EXPECT_FALSE(with([](PoolGeometry& g) { g.h = 9; })) << "a row past the last window";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.w = 7; })) << "a column past the last window";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.stride_w = 1, g.ow = g.w - 1; })) << "overlapping windows";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.pad_h = 1; })) << "padding";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.dil_w = 2; })) << "dilation";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.kh = g.kw = 3; })) << "a 3x3 window";
  EXPECT_FALSE(with([](PoolGeometry& g) { g.adaptive = true; })) << "adaptive";
}

// The channels-last kernels (pool_2x2_nhwc.cuh): x, y, the argmax and the gradients NHWC; every
// lane count the launcher picks (8 down to 1 channels a thread), each against the reference on
// the NCHW tensors, compared in NHWC order bit for bit.
template <class T, int V>
void check_nhwc(const PoolGeometry& g, DType t) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " V=" + std::to_string(V) + " " + std::to_string(g.n) + "x" +
               std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w));
  namespace pn = kernels::cuda::pool2x2_nhwc;
  ASSERT_EQ(g.c % V, 0);
  Generator gen(0x2b3 + uint64_t(g.h * 31 + g.c) + uint64_t(t));
  const Tensor x = input({g.n, g.c, g.h, g.w}, t, gen);
  const Tensor gy = Tensor::uniform({g.n, g.c, g.oh, g.ow}, gen, -2, 2, DType::f64).to(t);
  const Tensor xl = kernels::channels_last(x), gyl = kernels::channels_last(gy);  // NHWC bytes
  ASSERT_TRUE(kernels::nhwc_dense(xl));
  const auto nan_filled = [&](const Shape& nchw) {
    Tensor z = kernels::empty_channels_last(nchw, t, Device::cpu());
    std::memset(z.data_ptr(), 0xff, z.nbytes());  // NaN in every float dtype
    return z;
  };
  const auto nhwc_bytes = [](const Tensor& v) { return bytes_of(kernels::nhwc_view(v)); };
  const int32_t vectors = int32_t(g.n * g.c * g.oh * g.ow / V), c = int32_t(g.c), ow = int32_t(g.ow);

  const kernels::MaxPoolResult want = kernels::ref::max_pool2d_forward(x, g);
  Tensor y = nan_filled({g.n, g.c, g.oh, g.ow});
  Tensor arg = kernels::empty_channels_last({g.n, g.c, g.oh, g.ow}, DType::u8, Device::cpu());
  const auto* xp = static_cast<const T*>(xl.data_ptr());
  for (int32_t j = 0; j < vectors; ++j)
    pn::forward_at<T, uint8_t, V, int32_t>(xp, c, ow, j, static_cast<T*>(y.data_ptr()),
                                           static_cast<uint8_t*>(arg.data_ptr()));
  EXPECT_EQ(nhwc_bytes(y), nhwc_bytes(want.dst)) << "max";
  EXPECT_EQ(nhwc_bytes(arg), nhwc_bytes(want.argmax)) << "tap";

  const auto* gyp = static_cast<const T*>(gyl.data_ptr());
  const Tensor argl = kernels::channels_last(want.argmax);
  Tensor gx = nan_filled({g.n, g.c, g.h, g.w});
  for (int32_t j = 0; j < vectors; ++j)
    pn::backward_at<T, uint8_t, V, int32_t>(gyp, static_cast<const uint8_t*>(argl.data_ptr()), c, ow, j,
                                            static_cast<T*>(gx.data_ptr()));
  EXPECT_EQ(nhwc_bytes(gx), nhwc_bytes(kernels::ref::max_pool2d_backward(gy, want.argmax, g))) << "backward";

  Tensor gx2 = nan_filled({g.n, g.c, g.h, g.w});
  for (int32_t j = 0; j < vectors; ++j)
    pn::backward_from_input_at<T, V, int32_t>(gyp, xp, c, ow, j, static_cast<T*>(gx2.data_ptr()));
  EXPECT_EQ(nhwc_bytes(gx2), nhwc_bytes(kernels::ref::max_pool2d_backward_from_input(gy, x, g))) << "from input";
}

TEST(EmulatedPool2x2, ChannelsLastMatchesTheReferenceBitForBit) {
  // Channel counts that give each lane count (8, 4 and 2 for the 16-bit types, 4 and 2 for f32),
  // and an odd one; one row of one window; the wide cnn's 420 channels on a 14 x 14 plane.
  for (const PoolGeometry& g : {geometry(2, 8, 8, 6), geometry(1, 24, 2, 2), geometry(3, 6, 4, 10),
                                geometry(2, 5, 14, 14), geometry(1, 420, 14, 14)}) {
    if (g.c % 8 == 0) check_nhwc<bf16_t, 8>(g, DType::bf16), check_nhwc<f16_t, 8>(g, DType::f16);
    if (g.c % 4 == 0) check_nhwc<float, 4>(g, DType::f32), check_nhwc<bf16_t, 4>(g, DType::bf16);
    if (g.c % 2 == 0) check_nhwc<float, 2>(g, DType::f32), check_nhwc<f16_t, 2>(g, DType::f16);
    check_nhwc<float, 1>(g, DType::f32);
    check_nhwc<bf16_t, 1>(g, DType::bf16);
  }
}

TEST(EmulatedPool2x2, ChannelsLastLanesDivideTheChannelsAndAlign) {
  namespace pn = kernels::cuda::pool2x2_nhwc;
  alignas(16) static uint16_t buf[16];
  EXPECT_EQ(pn::lanes<bf16_t>(geometry(1, 1000, 14, 14), {buf}), 8) << "1000 channels: 16 bytes";
  EXPECT_EQ(pn::lanes<bf16_t>(geometry(1, 420, 28, 28), {buf}), 4) << "420 = 4 * 105";
  EXPECT_EQ(pn::lanes<float>(geometry(1, 1000, 14, 14), {buf}), 4) << "f32: 16 bytes are 4";
  EXPECT_EQ(pn::lanes<bf16_t>(geometry(1, 1000, 14, 14), {buf + 2}), 2) << "a pointer 4 bytes off 16";
  EXPECT_EQ(pn::lanes<bf16_t>(geometry(1, 1000, 14, 14), {buf, buf + 1}), 1) << "any pointer 2 bytes off";
  EXPECT_EQ(pn::lanes<bf16_t>(geometry(1, 7, 14, 14), {buf}), 1) << "odd channels";
  PoolGeometry overlapping = geometry(1, 8, 8, 8);
  overlapping.stride_w = 1, overlapping.ow = 7;
  EXPECT_EQ(pn::lanes<bf16_t>(overlapping, {buf}), 0) << "not an exact 2x2 tiling: not taken";
}

}  // namespace
}  // namespace mixprec::testing
