// scaled_dot_product_attention's kernels, deeper than the op cases: the fused CPU kernel (the tile
// kernel with AVX-512, the row kernel with AVX2 alone; and the CUDA one where a GPU exists) against the f64 reference
// on shapes that cut the 64-row blocks (T = 1, T not a multiple of 64, head dims 16/32/64/80, causal with Tq != Tk,
// full with Tk > Tq, dropout; on a GPU, bf16 and f16 at 16/32/64 without dropout are the tensor-core kernels), large
// logits, the saved bytes (linear in T for the fused kernel, quadratic for the reference), and the
// op's error lines.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "error_norms.h"
#include "error_text.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/kernels.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"
#include "op_cases.h"

namespace mixprec::testing {
namespace {

struct Shape4 {
  int64_t b, h, tq, tk, e, ev;
  bool causal;
  double dropout;
};
void PrintTo(const Shape4& s, std::ostream* os) {
  *os << s.b << "x" << s.h << " Tq " << s.tq << " Tk " << s.tk << " E " << s.e << "/" << s.ev
      << (s.causal ? " causal" : "") << " dropout " << s.dropout;
}

const std::vector<Shape4> kShapes = {
    {1, 2, 1, 1, 16, 16, false, 0.0},
    {2, 1, 65, 65, 32, 32, true, 0.0},
    {1, 2, 130, 70, 64, 64, true, 0.0},
    {1, 1, 70, 130, 80, 80, true, 0.0},
    {2, 2, 128, 128, 32, 32, true, 0.0},
    {1, 1, 33, 200, 16, 24, false, 0.2},
    {1, 2, 150, 150, 32, 32, true, 0.1},
    {1, 2, 47, 190, 64, 64, false, 0.0},
    // Past the transposed forward's 512-key blocks (its online rescaling between them): full with a
    // last block of 76 keys, causal with Tq != Tk.
    {1, 1, 40, 1100, 32, 48, false, 0.0},
    {1, 1, 530, 600, 64, 32, true, 0.0},
};

struct Result {
  std::vector<Tensor> t;  // output, dq, dk, dv
};

// inputs: q, k, v, grad_out (f64 values, the dtype's exactly). Runs on `device` with backend b.
Result run(const std::vector<Tensor>& in, DType t, const Shape4& s, kernels::Backend b, const Device& device) {
  const kernels::BackendGuard guard(b);
  std::vector<Tensor> x;
  for (int i = 0; i < 3; ++i) x.push_back(in[size_t(i)].to(t).to(device).detach().set_requires_grad());
  Generator gen(3);
  Tensor o =
      ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = s.causal, .dropout = s.dropout, .gen = &gen});
  o.backward(in[3].to(t).to(device));
  return {{o.detach().to(Device::cpu()), x[0].grad().to(Device::cpu()), x[1].grad().to(Device::cpu()),
           x[2].grad().to(Device::cpu())}};
}

double unit_roundoff(DType t) { return t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0x1p-24; }

// Whether a fused CPU attention runs on this host: the tile kernel (AVX-512) or the row kernel
// (AVX2 and FMA, cpu/attention_rows.cpp). Without either the "fast" backend is the reference.
bool fused_cpu_attention() { return mixprec::cpu::has_avx512f() || mixprec::cpu::has_avx2_fma(); }

// The bf16 tiles' products on AVX512-BF16 rather than AMX while it lives (an AMX host's other road).
struct VectorProducts {
  VectorProducts() { kernels::cpu::attn::set_amx_products(false); }
  ~VectorProducts() { kernels::cpu::attn::set_amx_products(true); }
  VectorProducts(const VectorProducts&) = delete;
  VectorProducts& operator=(const VectorProducts&) = delete;
};

using Param = std::tuple<Shape4, DType, Device>;
class AttentionKernels : public ::testing::TestWithParam<Param> {};

// Each result against the f64 reference on the same (dtype-exact) inputs, next to the error of the
// reference kernel in the dtype itself: the fast kernel may lose up to twice as much (it rounds P
// and dS to bf16 before their products, and its backward reads the rounded output), plus two units
// of roundoff of the largest true value (S) in the max norm (a bug shows as an O(S) error). In the
// rms, bf16's dQ and dK get three times the reference's: they sum Tk and Tq products of
// rounded dS, and on the small shapes below their rms ran at 1.5-1.9x the reference's on average
// and up to 2.5x (`bench/attention_error_probe 200`: 200 draws of each CpuBlocking shape and of a
// 65 x 65 causal one, AMD Zen 4, 2026-12-07; dV at most 1.8x), while dQ stored at 1.004 times its
// scale fails this bound on four bf16 shapes (at 1.02, the max norm on 26).
TEST_P(AttentionKernels, FastMatchesTheReference) {
  const auto [s, t, device] = GetParam();
  if (device.is_cpu() && !fused_cpu_attention())
    GTEST_SKIP() << "neither AVX-512 nor AVX2 on this host: the CPU's fast attention is the reference itself";
  Generator g(0xa77e + uint64_t(s.tq * 131 + s.tk) + uint64_t(t));
  std::vector<Tensor> in;
  for (const Shape& sh : {Shape{s.b, s.h, s.tq, s.e}, Shape{s.b, s.h, s.tk, s.e}, Shape{s.b, s.h, s.tk, s.ev},
                          Shape{s.b, s.h, s.tq, s.ev}})
    in.push_back(Tensor::uniform(sh, g, -2, 2, DType::f64).to(t).to(DType::f64));
  const Result truth = run(in, DType::f64, s, kernels::Backend::ref, Device::cpu());
  const Result ref = run(in, t, s, kernels::Backend::ref, Device::cpu());
  const Result fast = run(in, t, s, kernels::Backend::cpu, device);
  double scale = 0;
  for (const Tensor& x : truth.t)
    for (double v : x.to_vector_f64()) scale = std::max(scale, std::fabs(v));
  const char* names[] = {"output", "dq", "dk", "dv"};
  const DType dtype = t;  // clang 14 cannot capture a structured binding in a lambda
  auto expect_close = [&](const Result& r, const std::string& kind) {
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_EQ(r.t[i].dtype(), dtype);
      ASSERT_EQ(r.t[i].shape(), truth.t[i].shape());
      const Err ef = error_of(r.t[i], truth.t[i]), er = error_of(ref.t[i], truth.t[i]);
      EXPECT_LE(ef.max, 2 * er.max + 2 * unit_roundoff(dtype) * scale) << names[i] << kind;
      const double rms_factor = dtype == DType::bf16 && (i == 1 || i == 2) ? 3 : 2;  // dq, dk
      EXPECT_LE(ef.rms, rms_factor * er.rms + 4 * 0x1p-24 * scale) << names[i] << kind << " (rms)";
    }
  };
  expect_close(fast, "");
  if (t != DType::bf16 || !device.is_cpu() || !mixprec::cpu::has_avx512f()) return;
  // bf16 on the CPU once more on each road (kernels/cpu/dnnl_common.h: the host's rule picked one
  // above): f32 tiles, and the bf16 tiles where AVX512-BF16 is there; then on the bf16 tiles with
  // AVX512-BF16 emulated, a host without those instructions' only run of the bf16 tiles' code.
  {
    const kernels::cpu::Bf16ProductsGuard road(kernels::cpu::Bf16Products::f32);
    expect_close(run(in, t, s, kernels::Backend::cpu, device), " (f32 tiles)");
  }
  // Each bf16-tile road with the forward's scores in rows and transposed (cpu/attention.cpp,
  // forward_transposed: the default on AMX; dropout always takes the rows).
  const Shape4 shape = s;
  auto both_forwards = [&](const std::string& road) {
    for (bool transposed : {false, true}) {
      const kernels::cpu::TransposedScores scores(transposed);
      expect_close(run(in, dtype, shape, kernels::Backend::cpu, Device::cpu()),
                   " (" + road + (transposed ? ", scores transposed)" : ", scores in rows)"));
    }
  };
  if (mixprec::cpu::has_avx512_bf16()) {
    const kernels::cpu::Bf16ProductsGuard road(kernels::cpu::Bf16Products::native);
    both_forwards(mixprec::cpu::has_amx_bf16() ? "bf16 tiles on AMX" : "bf16 tiles");
    if (mixprec::cpu::has_amx_bf16()) {  // the runs above multiplied on AMX: now with AVX512-BF16
      const VectorProducts vector;
      both_forwards("bf16 tiles, AVX512-BF16 products");
    }
  }
  const kernels::cpu::EmulatedBf16Tiles emulate;
  both_forwards("emulated bf16 tiles");
}

std::string name_of(const Param& p) {
  const Shape4& s = std::get<0>(p);
  std::ostringstream name;
  name << "T" << s.tq << "x" << s.tk << "_E" << s.e << (s.causal ? "_causal" : "") << (s.dropout > 0 ? "_dropout" : "")
       << "_" << dtype_name(std::get<1>(p)) << "_" << (std::get<2>(p).is_cuda() ? "cuda" : "cpu");
  return name.str();
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (cuda::device_count() > 0) d.push_back(Device::cuda(0));
  return d;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionKernels,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::ValuesIn(devices())),
                         [](const ::testing::TestParamInfo<Param>& p) { return name_of(p.param); });

// The CPU kernels' blocking edges (cpu/attention_rows.cpp on AVX2 hosts: blocks of 6 and 12 query
// rows, 4 keys, 16 lanes and an 8-lane tail): 23 keys, a last block of 3 keys, head dims 24 and 40
// (16 + 8, 32 + 8 lanes), 21 query rows (6 + 6 + 6 + 3, 12 + 9); causal 30 x 30 at E 8 (the
// 8-lane path alone, blocks ending at keys 12, 24, 30: a last block of 2 keys); head dims 20 and
// 12 (rows of 16 + 4 and 8 + 4 elements: the 16-bit rows' widening and rounding, 8 lanes at a time,
// end in a tail).
const std::vector<Shape4> kCpuBlockingShapes = {
    {1, 1, 21, 23, 24, 40, false, 0.0},
    {1, 2, 30, 30, 8, 8, true, 0.0},
    {2, 1, 23, 21, 40, 24, true, 0.0},
    {1, 2, 14, 17, 20, 12, true, 0.0},
};
INSTANTIATE_TEST_SUITE_P(CpuBlocking, AttentionKernels,
                         ::testing::Combine(::testing::ValuesIn(kCpuBlockingShapes),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(Device::cpu())),
                         [](const ::testing::TestParamInfo<Param>& p) { return name_of(p.param); });

Tensor values(const Shape& s, double lo, double hi, uint64_t seed, DType t = DType::f32) {
  Generator g(seed);
  return Tensor::uniform(s, g, lo, hi, t);
}

// Scores in the thousands: the online softmax subtracts the running max, so nothing overflows,
// and the result is the reference's.
TEST(Attention, LargeLogitsStayFinite) {
  const Tensor q = ops::affine(values({1, 2, 100, 32}, -1, 1, 1), 40.0), k = values({1, 2, 100, 32}, -1, 1, 2);
  const Tensor v = values({1, 2, 100, 16}, -1, 1, 3);
  const Tensor fast = ops::scaled_dot_product_attention(q, k, v, {.causal = true});
  Tensor ref;
  {
    const kernels::BackendGuard guard(kernels::Backend::ref);
    ref = ops::scaled_dot_product_attention(q, k, v, {.causal = true});
  }
  const std::vector<double> f = fast.to_vector_f64(), r = ref.to_vector_f64();
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_TRUE(std::isfinite(f[i])) << i;
    EXPECT_NEAR(f[i], r[i], 1e-5) << i;
  }
}

// Causal rows always see key 0 (Tq > Tk: query i sees keys <= i; Tk > Tq: <= i + Tk - Tq): the
// first query of a Tq > Tk attention sees key 0 alone, so its output is v's first row exactly.
TEST(Attention, CausalRowsAreNeverFullyMasked) {
  for (auto [tq, tk] : {std::pair<int64_t, int64_t>{90, 70}, {70, 90}, {5, 1}}) {
    const Tensor q = values({1, 1, tq, 16}, -1, 1, 4), k = values({1, 1, tk, 16}, -1, 1, 5);
    const Tensor v = values({1, 1, tk, 16}, -1, 1, 6);
    const std::vector<double> o = ops::scaled_dot_product_attention(q, k, v, {.causal = true}).to_vector_f64();
    for (double x : o) ASSERT_TRUE(std::isfinite(x));
    if (tq > tk) {
      const std::vector<double> v0 = v.to_vector_f64();
      for (int64_t e = 0; e < 16; ++e) EXPECT_EQ(o[size_t(e)], v0[size_t(e)]) << "tq " << tq << " e " << e;
    }
  }
}

// Bytes the forward leaves alive (the output and what the backward keeps), for inputs made before.
int64_t saved_bytes(int64_t t, DType dt, kernels::Backend b) {
  const kernels::BackendGuard guard(b);
  Tensor q, k, v;
  {
    const MemoryScope data(MemCategory::data);
    q = values({1, 2, t, 32}, -1, 1, 7, dt).set_requires_grad();
    k = values({1, 2, t, 32}, -1, 1, 8, dt).set_requires_grad();
    v = values({1, 2, t, 32}, -1, 1, 9, dt).set_requires_grad();
  }
  const MemoryScope act(MemCategory::activations);
  const int64_t before = allocator::stats().live_bytes[size_t(MemCategory::activations)];
  const Tensor o = ops::scaled_dot_product_attention(q, k, v, {.causal = true});
  return allocator::stats().live_bytes[size_t(MemCategory::activations)] - before;
}

TEST(Attention, FusedSavedBytesGrowLinearlyReferenceQuadratically) {
  if (!fused_cpu_attention()) GTEST_SKIP() << "neither AVX-512 nor AVX2 on this host: no fused CPU attention runs";
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t f128 = saved_bytes(128, dt, kernels::Backend::cpu),
                  f512 = saved_bytes(512, dt, kernels::Backend::cpu),
                  f2048 = saved_bytes(2048, dt, kernels::Backend::cpu);
    // Output [1, 2, T, 32] and log-sum-exp [1, 2, T] f32: nothing of size T^2.
    EXPECT_EQ(f512, 2 * 512 * (32 * int64_t(dtype_size(dt)) + 4)) << dtype_name(dt);
    EXPECT_EQ(f512, 4 * f128) << dtype_name(dt);
    EXPECT_EQ(f2048, 4 * f512) << dtype_name(dt);
    const int64_t r512 = saved_bytes(512, dt, kernels::Backend::ref),
                  r2048 = saved_bytes(2048, dt, kernels::Backend::ref);
    EXPECT_GT(r2048, 15 * r512) << dtype_name(dt);  // the [T, T] probabilities dominate
    EXPECT_GT(r2048, 50 * f2048) << dtype_name(dt);
  }
}

TEST(Attention, ErrorsNameTheOpAndTheShapes) {
  const Tensor q = values({2, 3, 5, 8}, -1, 1, 1), k = values({2, 3, 6, 8}, -1, 1, 2),
               v = values({2, 3, 6, 4}, -1, 1, 3);
  auto err = [](const std::function<void()>& f) { return testutil::error_of(f); };
  EXPECT_EQ(
      err([&] {
        ops::scaled_dot_product_attention(q.reshape({6, 5, 8}), k, v);
      }),
      "scaled_dot_product_attention: q, k, v must be [B, H, T, E], got q [6, 5, 8], k [2, 3, 6, 8], v [2, 3, 6, 4]");
  EXPECT_EQ(
      err([&] {
        ops::scaled_dot_product_attention(q, values({2, 2, 6, 8}, -1, 1, 4), v);
      }),
      "scaled_dot_product_attention: q, k, v must share batch and heads [B, H, ...], got q [2, 3, 5, 8], k [2, 2, "
      "6, 8], v [2, 3, 6, 4]");
  EXPECT_EQ(err([&] {
              ops::scaled_dot_product_attention(q, values({2, 3, 6, 7}, -1, 1, 4), v);
            }),
            "scaled_dot_product_attention: k's head dim must be q's, got q [2, 3, 5, 8], k [2, 3, 6, 7]");
  EXPECT_EQ(err([&] {
              ops::scaled_dot_product_attention(q, k, values({2, 3, 5, 4}, -1, 1, 4));
            }),
            "scaled_dot_product_attention: v must have k's sequence length, got k [2, 3, 6, 8], v [2, 3, 5, 4]");
  EXPECT_EQ(err([&] { ops::scaled_dot_product_attention(q, k.to(DType::bf16), v); }),
            "scaled_dot_product_attention: q, k, v must share a dtype, got f32, bf16, f32");
  EXPECT_EQ(err([&] {
              ops::scaled_dot_product_attention(q, k, Tensor::from_vector(std::vector<int64_t>(144, 1), {2, 3, 6, 4}));
            }),
            "scaled_dot_product_attention: v must be floating, got i64");
  EXPECT_EQ(err([&] { ops::scaled_dot_product_attention(q, k, v, {.dropout = 1.0}); }),
            "scaled_dot_product_attention: dropout must be in [0, 1), got 1");
}

// The packed form is the three views' attention: the same output and the same gradient of the
// packed input (values: the views' gradients were summed with zeros, which can turn a -0 into +0),
// with causal masking and dropout, on both backends, in f32 and bf16.
TEST(Attention, PackedQkvIsTheAttentionOfItsThreeViews) {
  // Each backend, dtype and (bf16 on the fused kernel) kind of tile: the packed op against the
  // three strided views, and against contiguous copies of them (which the fused kernel reads
  // through a buffer where the views are read in place): the same values.
  struct Case {
    kernels::Backend backend;
    DType t;
    bool emulated_bf16_tiles;
  };
  std::vector<Case> cases;
  for (kernels::Backend be : {kernels::Backend::cpu, kernels::Backend::ref})
    for (DType t : {DType::f32, DType::bf16}) cases.push_back({be, t, false});
  if (mixprec::cpu::has_avx512f()) cases.push_back({kernels::Backend::cpu, DType::bf16, true});
  for (const Case& k : cases) {
    const kernels::BackendGuard backend(k.backend);
    std::optional<kernels::cpu::EmulatedBf16Tiles> emulate;
    if (k.emulated_bf16_tiles) emulate.emplace();
    const DType t = k.t;
    const int64_t b = 2, tt = 37, h = 3, e = 16, c = h * e;
    const Tensor qkv = values({b, tt, 3 * c}, -1, 1, 9).to(t);
    const Tensor gy = values({b, h, tt, e}, -1, 1, 10).to(t);
    enum class Form { views, packed, copies };
    auto run = [&](Form form) {
      Tensor x = qkv.detach().set_requires_grad();
      Generator gen(3);
      const ops::AttentionOptions o{.causal = true, .dropout = 0.2, .gen = &gen};
      auto part = [&](int64_t i) {
        Tensor v = x.slice(2, i * c, (i + 1) * c).reshape({b, tt, h, e}).transpose(1, 2);
        return form == Form::copies ? v.contiguous() : v;
      };
      Tensor y = form == Form::packed ? ops::packed_qkv_attention(x, h, o)
                                      : ops::scaled_dot_product_attention(part(0), part(1), part(2), o);
      y.backward(gy);
      return std::make_pair(y.to_vector_f64(), x.grad().to_vector_f64());
    };
    const std::string what = std::string(dtype_name(t)) + (k.backend == kernels::Backend::ref ? ", reference" : "") +
                             (k.emulated_bf16_tiles ? ", emulated bf16 tiles" : "");
    const auto [y_views, g_views] = run(Form::views);
    const auto [y_packed, g_packed] = run(Form::packed);
    const auto [y_copies, g_copies] = run(Form::copies);
    EXPECT_EQ(y_packed, y_views) << what;
    EXPECT_EQ(g_packed, g_views) << what;
    EXPECT_EQ(y_copies, y_views) << what << ": contiguous copies";
    EXPECT_EQ(g_copies, g_views) << what << ": contiguous copies";
  }
  EXPECT_EQ(testutil::error_of([] {
              ops::packed_qkv_attention(values({2, 5, 3 * 8}, -1, 1, 1), 3);
            }),
            "scaled_dot_product_attention: packed qkv must be [B, T, 3 C] with C a multiple of the 3 heads, got [2, "
            "5, 24]");
}

// On a GPU, bf16 and f16 at head dims 16, 32 and 64 run the tensor-core kernels, which stage
// contiguous, 16-byte aligned rows 8 elements per load and any other view element by element
// (attention_mma.cuh, stage): q, k and v as rows of E + 1 from their second element (an odd row
// stride, addresses off 16 bytes) give the bits of their contiguous copies, forward and backward.
TEST(Attention, CudaViewsOfAnyStrideGiveTheBitsOfContiguousCopies) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int64_t b = 2, tt = 70, h = 3;
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t e : {16, 32, 64}) {
      std::vector<Tensor> bases;
      for (uint64_t i = 0; i < 3; ++i)
        bases.push_back(values({b, tt, h, e + 1}, -1, 1, 21 + 3 * uint64_t(e) + i, t).to(Device::cuda(0)));
      const Tensor gy = values({b, h, tt, e}, -1, 1, 22, t).to(Device::cuda(0));
      // The output and the three bases' gradients.
      auto run = [&](bool copies) {
        std::vector<Tensor> x, v;
        for (const Tensor& base : bases) {
          x.push_back(base.detach().set_requires_grad());
          v.push_back(x.back().slice(3, 1, e + 1).transpose(1, 2));
          if (copies) v.back() = v.back().contiguous();
        }
        Tensor y = ops::scaled_dot_product_attention(v[0], v[1], v[2], {.causal = true});
        y.backward(gy);
        std::vector<std::vector<double>> r{y.to_vector_f64()};
        for (const Tensor& xi : x) r.push_back(xi.grad().to_vector_f64());
        return r;
      };
      const auto views = run(false), copies = run(true);
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (size_t i = 0; i < 4; ++i) EXPECT_EQ(views[i], copies[i]) << names[i] << ", " << dtype_name(t) << " E " << e;
    }
}

// One key: every probability is exactly 1 and O is V, so dS = P (dP - D) is exactly zero, and dq
// and dk with it, when D = rowsum(dO O) is summed in the order the dP product sums dO V^T: on
// every kind of tile (f32; bf16 native where the host has it, and emulated). On an AMX host a head
// of 64 (a multiple of 32) multiplies its first 32 of 37 rows on AMX and the last 5 with
// AVX512-BF16 (amx_shape), so D takes both orders; a head of 48 stays on AVX512-BF16.
TEST(Attention, OneKeyGivesExactlyZeroScoreGradients) {
  if (!fused_cpu_attention()) GTEST_SKIP() << "neither AVX-512 nor AVX2 on this host: no fused CPU attention runs";
  for (int64_t e : {48, 64})
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (bool emulated : {false, true}) {
        if (emulated && (t != DType::bf16 || !mixprec::cpu::has_avx512f())) continue;  // tiles: AVX-512 only
        std::optional<kernels::cpu::EmulatedBf16Tiles> emulate;
        if (emulated) emulate.emplace();
        Tensor q = values({1, 2, 37, e}, -2, 2, 11, t).set_requires_grad();
        Tensor k = values({1, 2, 1, e}, -2, 2, 12, t).set_requires_grad();
        Tensor v = values({1, 2, 1, e}, -2, 2, 13, t).set_requires_grad();
        ops::scaled_dot_product_attention(q, k, v).backward(values({1, 2, 37, e}, -1, 1, 14, t));
        for (const Tensor* g : {&q, &k})
          for (double x : g->grad().to_vector_f64())
            ASSERT_EQ(x, 0.0) << dtype_name(t) << " E " << e << (emulated ? ", emulated bf16 tiles" : "");
      }
}

// The tiles' transpose (through registers, f32 in 16 x 16 blocks and 16-bit in 32 x 32, masked at
// the edges) against its definition, on sizes around the blocks' edges, with row strides
// wider than the rows: every element lands in place and nothing past the rows is written.
TEST(AttentionTiles, TransposeMatchesItsDefinition) {
  if (!mixprec::cpu::has_avx512f()) GTEST_SKIP() << "no AVX-512 on this host: the fused CPU attention does not run";
  auto check = [](auto zero) {
    using E = decltype(zero);
    for (int64_t rows : {1, 15, 16, 17, 31, 32, 33, 64, 70})
      for (int64_t cols : {1, 8, 16, 31, 32, 33}) {
        const int64_t ld_src = cols + 3, ld_dst = rows + 5;
        std::vector<E> src(size_t(rows * ld_src)), dst(size_t(cols * ld_dst), E(-1));
        for (size_t i = 0; i < src.size(); ++i) src[i] = E(i % 4093);
        kernels::cpu::attn::transpose(src.data(), ld_src, rows, cols, dst.data(), ld_dst);
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t r = 0; r < ld_dst; ++r)
            ASSERT_EQ(dst[size_t(c * ld_dst + r)], r < rows ? src[size_t(r * ld_src + c)] : E(-1))
                << sizeof(E) * 8 << "-bit, " << rows << " x " << cols << ", row " << r << " col " << c;
      }
  };
  check(0.f);
  check(uint16_t(0));
}

// The product's B packing (pack_b from B's rows, pack_bt from B^T's; bf16 pairs of B's rows
// interleaved through 16-bit shuffles or a 32-bit-word transpose, with odd row strides element by
// element) against its definition [k_pad / P][n_pad][P]: every element in place, zeros past k and n.
TEST(AttentionTiles, PackingMatchesItsDefinition) {
  if (!mixprec::cpu::has_avx512f()) GTEST_SKIP() << "no AVX-512 on this host: the fused CPU attention does not run";
  auto check = [](auto zero) {
    using E = decltype(zero);
    constexpr int64_t P = kernels::cpu::attn::kPair<E>;
    for (int64_t k : {2, 16, 31, 64})
      for (int64_t n : {1, 16, 17, 40})
        for (int64_t extra : {0, 1, 2}) {
          const int64_t k_pad = (k + 15) / 16 * 16, n_pad = (n + 15) / 16 * 16;
          std::vector<E> dst(size_t(k_pad * n_pad), E(-1));
          // rows of dst's B: k_live of them hold B's, the rest zeros.
          auto expect = [&](const char* which, const auto& b_at, int64_t rows, int64_t k_live) {
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < n_pad; ++c)
                ASSERT_EQ(dst[size_t((r / P) * n_pad * P + c * P + r % P)], r < k_live && c < n ? b_at(r, c) : E(0))
                    << which << ", " << sizeof(E) * 8 << "-bit, k " << k << " n " << n << " ld +" << extra << ", row "
                    << r << " col " << c;
          };
          // pack_b: B's k rows of n, row stride n + extra.
          std::vector<E> b(size_t(k * (n + extra)));
          for (size_t i = 0; i < b.size(); ++i) b[i] = E(i % 4093 + 1);
          kernels::cpu::attn::pack_b(b.data(), n + extra, k, k_pad, n, n_pad, dst.data());
          expect(
              "pack_b", [&](int64_t r, int64_t c) { return b[size_t(r * (n + extra) + c)]; }, k_pad, k);
          // pack_bt: B^T's n rows of k (k a multiple of P), row stride k + extra.
          const int64_t kt = (k + P - 1) / P * P;
          std::vector<E> bt(size_t(n * (kt + extra)));
          for (size_t i = 0; i < bt.size(); ++i) bt[i] = E(i % 4093 + 1);
          std::fill(dst.begin(), dst.end(), E(-1));
          kernels::cpu::attn::pack_bt(bt.data(), kt + extra, kt, n, n_pad, dst.data());
          expect(
              "pack_bt", [&](int64_t r, int64_t c) { return bt[size_t(c * (kt + extra) + r)]; }, kt, kt);
        }
  };
  check(0.f);
  check(uint16_t(0));
}

// The causal products (attn::Live) against the whole product on blocks the diagonal crosses at
// several offsets: equal on every live element, where the operands are zero outside the live part
// as the kernel's P and dS are (a product over fewer terms of a sum whose other terms are zeros).
template <class E>
void check_causal_products() {
  using kernels::cpu::attn::Live;
  auto to_e = [](float f) {
    if constexpr (std::is_same_v<E, float>)
      return f;
    else
      return E{f32_to_bf16(f)};
  };
  const int64_t m = 64, n = 64, k = 32;  // a query block against a key block; k: the head dim
  Generator gen(7);
  auto random = [&](int64_t count) {
    const std::vector<float> v = Tensor::uniform({count}, gen, -1, 1).to_vector();
    std::vector<E> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = to_e(v[i]);
    return out;
  };
  for (int64_t diag : {-40, -3, 0, 5, 17, 62}) {
    auto live = [&](int64_t i, int64_t j) { return j <= i + diag; };
    std::ostringstream where;
    where << sizeof(E) * 8 << "-bit tiles, diag " << diag;
    // scores: C [queries x keys] = Q K^T; only the live elements are compared (the rest is not written).
    {
      const std::vector<E> a = random(m * k), bt = random(n * k);
      std::vector<E> b(size_t(k * n));
      kernels::cpu::attn::pack_bt(bt.data(), k, k, n, n, b.data());
      std::vector<float> whole(size_t(m * n)), part(size_t(m * n), NAN);
      kernels::cpu::attn::gemm<E>(m, n, k, a.data(), k, b.data(), whole.data(), n, false);
      kernels::cpu::attn::gemm<E>(m, n, k, a.data(), k, b.data(), part.data(), n, false, {Live::scores, diag});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (live(i, j)) {
            ASSERT_EQ(part[size_t(i * n + j)], whole[size_t(i * n + j)]) << where.str() << ", scores " << i << "," << j;
          }
    }
    // k_end: C [queries x e] += P V, P zero outside the live part.
    {
      std::vector<E> a = random(m * n), vrows = random(n * k);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (!live(i, j)) a[size_t(i * n + j)] = E{};
      std::vector<E> b(size_t(n * k));
      kernels::cpu::attn::pack_b(vrows.data(), k, n, n, k, k, b.data());
      const std::vector<float> c0 = Tensor::uniform({m * k}, gen, -1, 1).to_vector();
      std::vector<float> whole = c0, part = c0;
      kernels::cpu::attn::gemm<E>(m, k, n, a.data(), n, b.data(), whole.data(), k, true);
      kernels::cpu::attn::gemm<E>(m, k, n, a.data(), n, b.data(), part.data(), k, true, {Live::k_end, diag});
      ASSERT_EQ(part, whole) << where.str() << ", k_end";
    }
    // k_begin: C [e x keys] += A B over queries, B (P or dS: [queries x keys]) zero outside the live part.
    {
      const std::vector<E> a = random(k * m);
      std::vector<E> brows = random(m * n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (!live(i, j)) brows[size_t(i * n + j)] = E{};
      std::vector<E> b(size_t(m * n));
      kernels::cpu::attn::pack_b(brows.data(), n, m, m, n, n, b.data());
      const std::vector<float> c0 = Tensor::uniform({k * n}, gen, -1, 1).to_vector();
      std::vector<float> whole = c0, part = c0;
      kernels::cpu::attn::gemm<E>(k, n, m, a.data(), m, b.data(), whole.data(), n, true);
      kernels::cpu::attn::gemm<E>(k, n, m, a.data(), m, b.data(), part.data(), n, true, {Live::k_begin, diag});
      ASSERT_EQ(part, whole) << where.str() << ", k_begin";
    }
  }
}

TEST(AttentionTiles, CausalProductsSkipOnlyZerosF32) {
  if (!mixprec::cpu::has_avx512f()) GTEST_SKIP() << "no AVX-512 on this host: the fused CPU attention does not run";
  check_causal_products<float>();
}

TEST(AttentionTiles, CausalProductsSkipOnlyZerosEmulatedBf16) {
  if (!mixprec::cpu::has_avx512f()) GTEST_SKIP() << "no AVX-512 on this host: the fused CPU attention does not run";
  check_causal_products<kernels::cpu::attn::EmulatedBf16>();
}

// On an AMX host the bf16 tiles' products run on AMX (a block's live part at 16 x 16 tiles and 32
// of the contraction), then once more with AVX512-BF16.
TEST(AttentionTiles, CausalProductsSkipOnlyZerosBf16) {
  if (!mixprec::cpu::has_avx512_bf16())
    GTEST_SKIP() << "no AVX512-BF16 on this host: its bf16 tiles run emulated (the test above)";
  check_causal_products<uint16_t>();
  if (mixprec::cpu::has_amx_bf16()) {
    const VectorProducts vector;
    check_causal_products<uint16_t>();
  }
}

// The bf16 tiles' product on AMX (attn::amx_gemm, through attn::gemm) against the exact sums of
// its bf16 products: rows around the 16-row tiles and 32-row blocks (the rows past the last whole
// tile run with AVX512-BF16), column counts of one to four tiles, contractions of one to three
// 32-element steps, written and accumulated; each element within f32 accumulation's bound.
TEST(AttentionTiles, AmxProductsMatchTheExactSums) {
  if (!mixprec::cpu::has_amx_bf16())
    GTEST_SKIP()
        << "no AMX-BF16 on this host: the bf16 tiles multiply with AVX512-BF16 (CausalProductsSkipOnlyZerosBf16)";
  ASSERT_TRUE(kernels::cpu::attn::amx_shape(16, 32));
  Generator gen(29);
  for (int64_t m : {16, 17, 31, 32, 48, 64, 70})
    for (int64_t n : {16, 48, 64})
      for (int64_t k : {32, 64, 96})
        for (bool accumulate : {false, true}) {
          const int64_t lda = k + 8;  // rows wider than the contraction, as the gpt's q in the packed qkv
          auto bf16_values = [&](int64_t count) {
            std::vector<uint16_t> out;
            for (double v : Tensor::uniform({count}, gen, -2, 2).to_vector_f64()) out.push_back(f32_to_bf16(float(v)));
            return out;
          };
          const std::vector<uint16_t> a = bf16_values(m * lda), brows = bf16_values(k * n);
          std::vector<uint16_t> b(size_t(k * n));
          kernels::cpu::attn::pack_b(brows.data(), n, k, k, n, n, b.data());
          const std::vector<float> c0 = Tensor::uniform({m * n}, gen, -1, 1).to_vector();
          std::vector<float> c = c0;
          kernels::cpu::attn::gemm<uint16_t>(m, n, k, a.data(), lda, b.data(), c.data(), n, accumulate);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double exact = accumulate ? double(c0[size_t(i * n + j)]) : 0.0, bound = std::fabs(exact);
              for (int64_t p = 0; p < k; ++p) {
                const double x = double(bf16_to_f32(a[size_t(i * lda + p)])) * bf16_to_f32(brows[size_t(p * n + j)]);
                exact += x, bound += std::fabs(x);
              }
              ASSERT_LE(std::fabs(double(c[size_t(i * n + j)]) - exact), double(k + 1) * 0x1p-24 * bound)
                  << "m " << m << " n " << n << " k " << k << (accumulate ? " accumulated" : "") << " at " << i << ","
                  << j;
            }
        }
}

}  // namespace
}  // namespace mixprec::testing
