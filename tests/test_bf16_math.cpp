// Where bf16 matmuls and convolutions compute (kernels/cpu/dnnl_common.h, Bf16Math): on the host's
// bf16 unit, or widened to f32 and rounded once; on Intel's AVX512-BF16 without AMX, by each op's
// shape. Both roads must give the reference's values, and each op must take the road its host kind
// and shape say.
#include <gtest/gtest.h>

#include <omp.h>

#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using kernels::cpu::Bf16Math;
using kernels::cpu::Bf16Products;
using kernels::cpu::Bf16ProductsGuard;

// The implementations the profile names for one op's matrix kernels, forward and backward.
enum class Op { wide_linear, narrow_linear, wide_conv, narrow_conv };
struct OpRun {
  std::set<std::string> impls;
  Tensor y, gx, gw, gb;
};

OpRun run_op(Op op, kernels::Backend be, uint64_t seed = 7) {
  const kernels::BackendGuard backend(be);
  Generator g(seed);
  const DType t = DType::bf16;
  Tensor x, w, b;
  switch (op) {
    case Op::wide_linear:  // 2^26.2 flops a product, 183 an element: f32 on the by_size kind
      x = convtest::rand(g, {128, 512}, t), w = convtest::rand(g, {576, 512}, t, -0.5, 0.5);
      break;
    case Op::narrow_linear:  // 10 outputs: 19 flops an element, bf16 on every kind with a bf16 unit
      x = convtest::rand(g, {128, 512}, t), w = convtest::rand(g, {10, 512}, t, -0.5, 0.5);
      break;
    case Op::wide_conv:  // 128 -> 128 channels (from 2048 weights a tap): f32 on the by_size kind
      x = convtest::rand(g, {4, 128, 6, 6}, t), w = convtest::rand(g, {128, 128, 3, 3}, t, -0.5, 0.5);
      break;
    case Op::narrow_conv:  // 16 -> 32: bf16 on every kind with a bf16 unit
      x = convtest::rand(g, {4, 16, 6, 6}, t), w = convtest::rand(g, {32, 16, 3, 3}, t, -0.5, 0.5);
      break;
  }
  b = convtest::rand(g, {w.size(0)}, t);
  x.set_requires_grad(), w.set_requires_grad(), b.set_requires_grad();
  const bool conv = op == Op::wide_conv || op == Op::narrow_conv;
  OpRun r;
  profile::start();
  r.y = conv ? ops::conv2d(x, w, b, {.padding = 1}) : ops::linear(x, w, b);
  r.y.backward(convtest::rand(g, r.y.shape(), t));
  profile::stop();
  for (const auto& row : profile::rows())
    if (row.kernel == "matmul" || row.kernel.rfind("conv2d_", 0) == 0) r.impls.insert(row.impl);
  r.gx = x.grad(), r.gw = w.grad(), r.gb = b.grad();
  return r;
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : " | ") + x;
  return out;
}

// Whether the host's rule computes op in f32 (the wide ops are large by both ops' rules).
bool rule_says_f32(Op op) { return kernels::cpu::bf16_in_f32(op == Op::wide_linear || op == Op::wide_conv); }

// AMX and AMD's AVX512-BF16 compute bf16 natively, Intel's AVX512-BF16 without AMX by shape, a host
// without a bf16 unit in f32; the override forces either road where there is a unit.
TEST(Bf16Math, TheHostKindDecides) {
  const bool unit = kernels::cpu::bf16_unit();
  const Bf16Math m = kernels::cpu::bf16_math();
  if (!unit) {
    EXPECT_EQ(m, Bf16Math::f32);
  } else if (cpu::has_amx_bf16() || cpu::is_amd()) {
    EXPECT_EQ(m, Bf16Math::native) << cpu::describe_bf16_products();
  } else {
    EXPECT_EQ(m, Bf16Math::by_size) << cpu::describe_bf16_products();
  }
  const Bf16ProductsGuard f32(Bf16Products::f32);
  EXPECT_EQ(kernels::cpu::bf16_math(), Bf16Math::f32);
  kernels::cpu::set_bf16_products(Bf16Products::native);
  EXPECT_EQ(kernels::cpu::bf16_math(), unit ? Bf16Math::native : Bf16Math::f32);  // no unit: nothing to force
}

// Each op runs the kernels of the road the host's rule picks for it: the same implementations as
// with that road forced, and (on a host with a bf16 unit) not those of the other road.
TEST(Bf16Math, EachOpTakesTheRoadItsHostKindAndShapeSay) {
  const bool unit = kernels::cpu::bf16_unit();
  for (Op op : {Op::wide_linear, Op::narrow_linear, Op::wide_conv, Op::narrow_conv}) {
    SCOPED_TRACE("op " + std::to_string(int(op)));
    std::set<std::string> native, f32;
    {
      const Bf16ProductsGuard g(Bf16Products::native);
      native = run_op(op, kernels::Backend::cpu).impls;
    }
    {
      const Bf16ProductsGuard g(Bf16Products::f32);
      f32 = run_op(op, kernels::Backend::cpu).impls;
    }
    const std::set<std::string> by_rule = run_op(op, kernels::Backend::cpu).impls;
    EXPECT_EQ(by_rule, rule_says_f32(op) ? f32 : native)
        << "rule: " << joined(by_rule) << "; native: " << joined(native) << "; f32: " << joined(f32);
    for (const auto& impl : f32) EXPECT_EQ(impl.find("bf16"), std::string::npos) << impl;
    if (unit) {
      EXPECT_NE(native, f32) << joined(native);
    }
  }
}

// Both roads agree with the reference kernels within one bf16 rounding of an f32 sum's bound.
TEST(Bf16Math, BothRoadsMatchTheReference) {
  const bool unit = kernels::cpu::bf16_unit();
  for (Op op : {Op::wide_linear, Op::narrow_linear, Op::wide_conv, Op::narrow_conv}) {
    const bool conv = op == Op::wide_conv || op == Op::narrow_conv;
    const OpRun ref = run_op(op, kernels::Backend::ref);
    for (Bf16Products road : {Bf16Products::native, Bf16Products::f32}) {
      if (road == Bf16Products::native && !unit) continue;
      SCOPED_TRACE("op " + std::to_string(int(op)) + (road == Bf16Products::native ? " native" : " f32"));
      const Bf16ProductsGuard g(road);
      const OpRun fast = run_op(op, kernels::Backend::cpu);
      // Terms of each sum: the contraction length (forward, input gradient) and the batch
      // positions (weight and bias gradients); the bound scales with the sum of |terms|, which
      // this test bounds by the terms' count (every input in [-1, 1)).
      const double k_fwd = conv ? double(ref.gw.size(1) * 9) : 512.0;
      const double k_gx = conv ? double(ref.gw.size(0) * 9) : double(ref.gw.size(0));
      const double k_gw = conv ? 4.0 * 36 : 128.0;
      auto bound = [](const Tensor& r, double terms) {
        const std::vector<double> v = r.to_vector_f64();
        return [v, terms, t = r.dtype()](size_t i) {
          return 2 * testutil::ulp_of(t, v[i]) + terms * convtest::kU32 * terms;
        };
      };
      EXPECT_TRUE(convtest::close(fast.y, ref.y, bound(ref.y, k_fwd), "forward"));
      EXPECT_TRUE(convtest::close(fast.gx, ref.gx, bound(ref.gx, k_gx), "input gradient"));
      EXPECT_TRUE(convtest::close(fast.gw, ref.gw, bound(ref.gw, k_gw), "weight gradient"));
      EXPECT_TRUE(convtest::close(fast.gb, ref.gb, bound(ref.gb, k_gw), "bias gradient"));
    }
  }
}

// 16-bit convolutions on the f32 road fuse their casts with the layout changes around oneDNN's f32
// primitives (cpu/conv.cpp, fused_casts): bf16 inputs widened by the reorders, 16-bit outputs
// rounded by mixprec from the primitive's layout. The same f32 values reach the same f32
// primitives and are rounded once by the same rule, so every output has the casts' bits. bf16
// (the road forced) and f16 (always on it), on 1-3 threads: backward-weights split over one to
// three shares of the batch, the last shorter, each read from backward-data's reordered grad_y.
TEST(Bf16Math, ConvCastsFusedWithTheReordersGiveTheCastsBits) {
  if (!cpu::has_avx512f()) GTEST_SKIP() << "AVX-512 hosts only: without it the casts run as passes (cpu/conv.cpp)";
  const Bf16ProductsGuard road(Bf16Products::f32);
  struct Case {
    const char* name;
    Shape x, w;
    ops::Conv2dOptions o;
    bool bias;
  };
  const std::vector<Case> cases = {
      {"3x3 pad 1, bias", {5, 32, 7, 7}, {64, 32, 3, 3}, {.padding = 1}, true},
      {"stride 2, relu, 48 channels", {5, 64, 9, 9}, {48, 64, 3, 3}, {.stride = 2, .padding = 1, .relu = true}, true},
      {"two groups, no bias", {4, 64, 6, 6}, {64, 32, 3, 3}, {.padding = 1, .groups = 2}, false},
      {"1x1, 20 channels", {3, 64, 5, 5}, {20, 64, 1, 1}, {}, true}};
  const int threads_before = omp_get_max_threads();
  for (DType t : {DType::bf16, DType::f16})
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(dtype_name(t)) + ", " + c.name + ", threads " + std::to_string(threads));
        std::vector<std::vector<uint8_t>> runs[2];
        for (int fused = 0; fused < 2; ++fused) {
          kernels::cpu::set_conv_fused_casts(fused == 1);
          Generator g(3);
          Tensor x = convtest::rand(g, c.x, t).set_requires_grad();
          Tensor w = convtest::rand(g, c.w, t, -0.5, 0.5).set_requires_grad();
          Tensor b = c.bias ? convtest::rand(g, {c.w[0]}, t).set_requires_grad() : Tensor();
          profile::start();
          Tensor y = ops::conv2d(x, w, b, c.o);
          y.backward(convtest::rand(g, y.shape(), t));
          profile::stop();
          int marked = 0;  // forward and backward
          for (const auto& row : profile::rows())
            marked += row.kernel.rfind("conv2d_", 0) == 0 && row.impl.find("casts_in_reorders") != std::string::npos;
          EXPECT_EQ(marked, fused ? 2 : 0);
          runs[fused] = {testutil::bytes_of(y), testutil::bytes_of(x.grad()), testutil::bytes_of(w.grad()),
                         c.bias ? testutil::bytes_of(b.grad()) : std::vector<uint8_t>()};
        }
        kernels::cpu::set_conv_fused_casts(true);
        const char* what[] = {"forward", "input gradient", "weight gradient", "bias gradient"};
        for (size_t i = 0; i < 4; ++i) {
          ASSERT_EQ(runs[0][i].size(), runs[1][i].size()) << what[i];
          size_t differ = 0;
          for (size_t j = 0; j < runs[0][i].size(); ++j) differ += runs[0][i][j] != runs[1][i][j];
          EXPECT_EQ(differ, 0u) << what[i] << ": bytes that differ";
        }
      }
    }
  omp_set_num_threads(threads_before);
}

// round_nchw16c against convert() on the same values in NCHW: every bit, specials included (NaN,
// infinities, subnormals, -0, ties to even, values that round up to infinity), at channel counts
// that leave the last block part-filled (whose padding lanes hold NaN, and must not be written)
// and plane sizes that leave the last 16 positions part-filled.
TEST(Bf16Math, RoundingFromOneDnnsBlocksIsConvertsBits) {
  if (!cpu::has_avx512bw()) GTEST_SKIP() << "AVX-512BW hosts only (cpu/conv_round.cpp)";
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-39f,
                            -0.0f,
                            1.0f + 1.0f / 256,   // a bf16 tie, to even (down)
                            1.0f + 3.0f / 256,   // a bf16 tie, to even (up)
                            1.0f + 1.0f / 2048,  // an f16 tie
                            3.4e38f,
                            65519.0f};
  struct Size {
    int64_t n, c, hw;
  };
  for (const Size sz : {Size{2, 20, 196}, Size{3, 33, 5}, Size{1, 16, 16}, Size{2, 7, 49}})
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " c " + std::to_string(sz.c) + " hw " + std::to_string(sz.hw));
      const int64_t blocks = (sz.c + 15) / 16;
      std::vector<float> plain(size_t(sz.n * sz.c * sz.hw));
      std::vector<float> blocked(size_t(sz.n * blocks * 16 * sz.hw), std::numeric_limits<float>::quiet_NaN());
      Generator g(5);
      const std::vector<double> r = Tensor::randn({int64_t(plain.size())}, g).to_vector_f64();
      for (int64_t n = 0; n < sz.n; ++n)
        for (int64_t c = 0; c < sz.c; ++c)
          for (int64_t p = 0; p < sz.hw; ++p) {
            const size_t i = size_t((n * sz.c + c) * sz.hw + p);
            const float v = i % 7 == 3 ? specials[(i / 7) % std::size(specials)] : float(r[i] * 100);
            plain[i] = v;
            blocked[size_t(((n * blocks + c / 16) * sz.hw + p) * 16 + c % 16)] = v;
          }
      std::vector<uint16_t> want(plain.size()), got(plain.size() + 8, 0xabcd);
      convert(plain.data(), DType::f32, want.data(), t, plain.size());
      kernels::cpu::round_nchw16c(blocked.data(), sz.n, sz.c, sz.hw, t, got.data());
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
      EXPECT_EQ(differ, 0u) << "elements whose bits differ";
      for (size_t i = want.size(); i < got.size(); ++i) EXPECT_EQ(got[i], 0xabcd) << "written past the end";
    }
}

// The profile's implementation for a bf16 attention's forward and backward on the CPU.
std::set<std::string> attention_impls() {
  Generator g(11);
  std::vector<Tensor> x;
  for (int i = 0; i < 3; ++i) x.push_back(convtest::rand(g, {2, 2, 70, 32}, DType::bf16).set_requires_grad());
  profile::start();
  Tensor o = ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true});
  o.backward(convtest::rand(g, o.shape(), DType::bf16));
  profile::stop();
  std::set<std::string> impls;
  for (const auto& row : profile::rows())
    if (row.kernel.rfind("attention_", 0) == 0) impls.insert(row.impl);
  return impls;
}

// bf16 attention follows the same rule as the products (cpu/attention.cpp, tiles_for): bf16 tiles
// where bf16 computes natively, f32 tiles (bf16 widened on load) on the f32 road and on the by_size
// kind, whose bf16 tiles ran slower than its f32 ones (docs/hosts.md); on an AMX host the bf16
// tiles multiply on AMX (attention_amx.cpp); on both, the bf16 tiles' forward transposes its scores
// (forward_transposed).
TEST(Bf16Math, AttentionTakesTheTilesItsHostKindSays) {
  if (!cpu::has_avx512f())
    GTEST_SKIP() << "no AVX-512 on this host: attention runs the AVX2 row kernel, in f32 for every dtype";
  const std::set<std::string> f32_tiles{"mixprec:attention_tiles_f32"},
      bf16_tiles =
          cpu::has_amx_bf16()
              ? std::set<std::string>{"mixprec:attention_tiles_bf16_amx_transposed", "mixprec:attention_tiles_bf16_amx"}
              : std::set<std::string>{"mixprec:attention_tiles_bf16_transposed", "mixprec:attention_tiles_bf16"};
  {
    const Bf16ProductsGuard road(Bf16Products::f32);
    EXPECT_EQ(attention_impls(), f32_tiles);
  }
  {
    const Bf16ProductsGuard road(Bf16Products::native);
    EXPECT_EQ(attention_impls(), cpu::has_avx512_bf16() ? bf16_tiles : f32_tiles);
  }
  const bool bf16_by_rule = cpu::has_avx512_bf16() && kernels::cpu::bf16_math() == Bf16Math::native;
  EXPECT_EQ(attention_impls(), bf16_by_rule ? bf16_tiles : f32_tiles) << cpu::describe_bf16_products();
  if (kernels::cpu::by_size_kind()) {
    EXPECT_EQ(attention_impls(), f32_tiles);
  }
}

}  // namespace
}  // namespace mixprec
