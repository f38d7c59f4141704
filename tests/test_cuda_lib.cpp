// The GPU's matmul (cuBLASLt), conv (cuDNN), norm and pool kernels against the CPU reference
// kernels, deeper than the op cases: every transpose and epilogue, odd sizes, misaligned and
// strided views, conv geometries, pool windows; random non-zero inputs, GPU outputs poisoned with
// NaN first, bounds from the dtype's unit roundoff and the reduction length (agree_within_bound).
// Compiled everywhere; instantiated only where a GPU is present (nothing listed, nothing skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/conv.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/pool.h"
#include "kernels/shape.h"
#include "mixprec/allocator.h"
#include "op_cases.h"
#include "tensor_bytes.h"

namespace mixprec::testing {
namespace {

const Device kGpu = Device::cuda(0);
bool have_gpu() { return cuda::device_count() > 0; }
template <class T>
std::vector<T> if_gpu(std::vector<T> v) {
  return have_gpu() ? v : std::vector<T>{};
}

Tensor poisoned(const Shape& s, DType t) {
  Tensor d = Tensor::empty(s, t, kGpu);
  kernels::fill(d, std::numeric_limits<double>::quiet_NaN());
  return d;
}
Tensor host(const Tensor& t) { return t.defined() ? t.to(Device::cpu()) : t; }

// ------------------------------------------------------------------------------------- matmul

enum class View { contiguous, misaligned, transposed_storage };
enum class Epi { none, bias, bias_relu, relu, gelu_aux };
using MatmulParam = std::tuple<DType, bool, bool, Epi, View, bool>;  // dtype, trans a/b, epilogue, view, batched

// A [rows, cols] (or [3, rows, cols]) operand on both devices, viewed as `v`: misaligned is a
// slice one element in (odd offset and leading dimension); transposed_storage stores the
// transpose and views it back (column-major).
std::pair<Tensor, Tensor> operand(Shape s, DType t, View v, Generator& g) {
  const size_t r = s.size() - 2;
  Shape base = s;
  if (v == View::misaligned) base[r + 1] += 1;
  if (v == View::transposed_storage) std::swap(base[r], base[r + 1]);
  const Tensor cpu = nonzero_values(base, t, false, g), gpu = cpu.to(kGpu);
  auto view = [&](const Tensor& x) {
    if (v == View::misaligned) return x.slice(int64_t(r + 1), 1, base[r + 1]);
    if (v == View::transposed_storage) return x.transpose(int64_t(r), int64_t(r + 1));
    return x;
  };
  return {view(cpu).detach(), view(gpu).detach()};
}

class CudaMatmul : public ::testing::TestWithParam<MatmulParam> {};

TEST_P(CudaMatmul, MatchesTheReference) {
  const auto [t, ta, tb, epi, view, batched] = GetParam();
  const int64_t m = 37, k = 29, n = epi == Epi::gelu_aux ? 24 : 53;  // n % 8 == 0: cuBLASLt's aux path
  Generator g(0xa11 + int(t) * 7 + ta * 3 + tb * 5 + int(epi) * 11 + int(view) * 13 + batched);
  auto shape = [&](int64_t r, int64_t c) { return batched ? Shape{3, r, c} : Shape{r, c}; };
  const auto [a_cpu, a_gpu] = operand(ta ? shape(k, m) : shape(m, k), t, view, g);
  const auto [b_cpu, b_gpu] = operand(tb ? shape(n, k) : shape(k, n), t, view, g);
  const Tensor bias_cpu = nonzero_values({n}, t, false, g), bias_gpu = bias_cpu.to(kGpu);
  kernels::MatmulOpts o;
  o.trans_a = ta, o.trans_b = tb;
  o.relu = epi == Epi::relu || epi == Epi::bias_relu;
  o.gelu = epi == Epi::gelu_aux;
  const bool with_bias = epi == Epi::bias || epi == Epi::bias_relu || epi == Epi::gelu_aux;
  const Shape ds = shape(m, n);
  Tensor want = Tensor::empty(ds, t), want_aux = Tensor::empty(ds, t);
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    kernels::MatmulOpts r = o;
    r.bias = with_bias ? &bias_cpu : nullptr;
    r.gelu_input = o.gelu ? &want_aux : nullptr;
    kernels::matmul(a_cpu, b_cpu, want, r);
  }
  Tensor got = poisoned(ds, t), got_aux = poisoned(ds, t);
  o.bias = with_bias ? &bias_gpu : nullptr;
  o.gelu_input = o.gelu ? &got_aux : nullptr;
  kernels::matmul(a_gpu, b_gpu, got, o);
  // GELU: cuBLASLt's tanh may differ from libm's by an ulp of f32, inside the f32 term.
  EXPECT_TRUE(agree_within_bound(host(got), want, k + 1, o.gelu ? 1 : 0, "matmul"));
  if (o.gelu) {
    EXPECT_TRUE(agree_within_bound(host(got_aux), want_aux, k + 1, 0, "matmul gelu input"));
  }
}

// dst += op(a) op(b) (+ bias, relu): one sweep of the flags (contiguous operands, unbatched, no
// gelu aux) is enough for the accumulating path.
using AccumulateParam = std::tuple<DType, bool, bool, Epi>;  // dtype, trans a/b, epilogue
class CudaMatmulAccumulate : public ::testing::TestWithParam<AccumulateParam> {};

TEST_P(CudaMatmulAccumulate, AddsToTheDestination) {
  const auto [t, ta, tb, epi] = GetParam();
  const View view = View::contiguous;
  const int64_t m = 19, k = 33, n = 21;
  Generator g(0xacc + int(t) + ta * 2 + tb * 4 + int(epi) * 8);
  const auto [a_cpu, a_gpu] = operand(ta ? Shape{k, m} : Shape{m, k}, t, view, g);
  const auto [b_cpu, b_gpu] = operand(tb ? Shape{n, k} : Shape{k, n}, t, view, g);
  const Tensor bias_cpu = nonzero_values({n}, t, false, g), bias_gpu = bias_cpu.to(kGpu);
  const Tensor prev = nonzero_values({m, n}, t, false, g);
  kernels::MatmulOpts o;
  o.trans_a = ta, o.trans_b = tb, o.accumulate = true;
  o.relu = epi == Epi::relu || epi == Epi::bias_relu;
  const bool with_bias = epi == Epi::bias || epi == Epi::bias_relu;
  Tensor want = prev.clone();
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    kernels::MatmulOpts r = o;
    r.bias = with_bias ? &bias_cpu : nullptr;
    kernels::matmul(a_cpu, b_cpu, want, r);
  }
  Tensor got = prev.to(kGpu);
  o.bias = with_bias ? &bias_gpu : nullptr;
  kernels::matmul(a_gpu, b_gpu, got, o);
  EXPECT_TRUE(agree_within_bound(host(got), want, k + 2, 0, "matmul accumulate"));
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaMatmul, ::testing::ValuesIn(if_gpu([] {
                           std::vector<MatmulParam> p;
                           for (DType dt : {DType::f32, DType::bf16, DType::f16})
                             for (bool ta : {false, true})
                               for (bool tb : {false, true})
                                 for (Epi e : {Epi::none, Epi::bias, Epi::bias_relu, Epi::relu, Epi::gelu_aux})
                                   for (View v : {View::contiguous, View::misaligned, View::transposed_storage})
                                     for (bool batched : {false, true}) p.emplace_back(dt, ta, tb, e, v, batched);
                           return p;
                         }())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaMatmul);
INSTANTIATE_TEST_SUITE_P(Gpu, CudaMatmulAccumulate, ::testing::ValuesIn(if_gpu([] {
                           std::vector<AccumulateParam> p;
                           for (DType dt : {DType::f32, DType::bf16, DType::f16})
                             for (bool ta : {false, true})
                               for (bool tb : {false, true})
                                 for (Epi e : {Epi::none, Epi::bias, Epi::bias_relu, Epi::relu})
                                   p.emplace_back(dt, ta, tb, e);
                           return p;
                         }())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaMatmulAccumulate);

// A long reduction into a small output, the shape of the cnn's classifier, with every epilogue:
// cuBLASLt's split-K on the plain product in f32, the epilogue apart (kernels/cuda/matmul.cpp).
// Within the bound of the reference, and the same bits when run again (captured steps replay
// eager steps bit for bit only if it is).
using LongParam = std::tuple<DType, Epi>;
class CudaMatmulLongReduction : public ::testing::TestWithParam<LongParam> {};

TEST_P(CudaMatmulLongReduction, MatchesTheReference) {
  const auto [t, epi] = GetParam();
  const int64_t m = 64, k = 12288, n = 16;
  Generator g(0x5b1 + int(t) * 3 + int(epi) * 17);
  const auto [a_cpu, a_gpu] = operand({m, k}, t, View::contiguous, g);
  const auto [b_cpu, b_gpu] = operand({k, n}, t, View::contiguous, g);
  const Tensor bias_cpu = nonzero_values({n}, t, false, g), bias_gpu = bias_cpu.to(kGpu);
  kernels::MatmulOpts o;
  o.relu = epi == Epi::relu || epi == Epi::bias_relu;
  o.gelu = epi == Epi::gelu_aux;
  const bool with_bias = epi == Epi::bias || epi == Epi::bias_relu || epi == Epi::gelu_aux;
  Tensor want = Tensor::empty({m, n}, t), want_aux = Tensor::empty({m, n}, t);
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    kernels::MatmulOpts r = o;
    r.bias = with_bias ? &bias_cpu : nullptr;
    r.gelu_input = o.gelu ? &want_aux : nullptr;
    kernels::matmul(a_cpu, b_cpu, want, r);
  }
  Tensor got = poisoned({m, n}, t), got_aux = poisoned({m, n}, t);
  o.bias = with_bias ? &bias_gpu : nullptr;
  o.gelu_input = o.gelu ? &got_aux : nullptr;
  kernels::matmul(a_gpu, b_gpu, got, o);
  EXPECT_TRUE(agree_within_bound(host(got), want, k + 1, o.gelu ? 1 : 0, "long matmul"));
  if (o.gelu) {
    EXPECT_TRUE(agree_within_bound(host(got_aux), want_aux, k + 1, 0, "long matmul gelu input"));
  }
  Tensor again = poisoned({m, n}, t), again_aux = poisoned({m, n}, t);
  o.gelu_input = o.gelu ? &again_aux : nullptr;
  kernels::matmul(a_gpu, b_gpu, again, o);
  EXPECT_EQ(testutil::bytes_of(again), testutil::bytes_of(got));
  if (o.gelu) {
    EXPECT_EQ(testutil::bytes_of(again_aux), testutil::bytes_of(got_aux));
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaMatmulLongReduction, ::testing::ValuesIn(if_gpu([] {
                           std::vector<LongParam> p;
                           for (DType dt : {DType::f32, DType::bf16, DType::f16})
                             for (Epi e : {Epi::none, Epi::bias, Epi::bias_relu, Epi::relu, Epi::gelu_aux})
                               p.emplace_back(dt, e);
                           return p;
                         }())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaMatmulLongReduction);

// --------------------------------------------------------------------------------------- conv

struct ConvCase {
  int64_t n, c, h, w, oc, k, stride, pad, dil, groups;
  bool bias, relu;
};
using ConvParam = std::tuple<size_t, DType>;
const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> c{
      {2, 3, 7, 5, 4, 3, 1, 1, 1, 1, true, false},     // odd plane, pad 1, bias
      {3, 4, 9, 9, 6, 3, 2, 1, 1, 1, true, true},      // stride 2, bias + ReLU
      {2, 8, 8, 8, 16, 1, 1, 0, 1, 1, false, false},   // 1x1, channels multiple of 8
      {2, 4, 10, 11, 4, 3, 1, 2, 2, 1, false, true},   // dilation 2, ReLU only
      {2, 4, 6, 6, 6, 3, 1, 1, 1, 2, true, false},     // groups 2
      {1, 16, 12, 12, 32, 5, 2, 2, 1, 1, true, true},  // 5x5 stride 2, tensor-core friendly channels
  };
  return c;
}
kernels::ConvGeometry geometry(const ConvCase& c) {
  kernels::ConvGeometry g;
  g.n = c.n, g.c = c.c, g.h = c.h, g.w = c.w, g.oc = c.oc, g.kh = g.kw = c.k;
  g.stride_h = g.stride_w = c.stride, g.pad_h = g.pad_w = c.pad, g.dil_h = g.dil_w = c.dil, g.groups = c.groups;
  g.oh = (c.h + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
  g.ow = (c.w + 2 * c.pad - c.dil * (c.k - 1) - 1) / c.stride + 1;
  return g;
}

class CudaConv : public ::testing::TestWithParam<ConvParam> {};

TEST_P(CudaConv, ForwardAndBackwardMatchTheReference) {
  const auto [index, t] = GetParam();
  const ConvCase& c = conv_cases()[index];
  const kernels::ConvGeometry g = geometry(c);
  Generator gen(0xc0 + index * 3 + int(t));
  const Tensor x = nonzero_values(g.x_shape(), t, false, gen), w = nonzero_values(g.w_shape(), t, false, gen);
  const Tensor b = c.bias ? nonzero_values({g.oc}, t, false, gen) : Tensor();
  const Tensor gy = nonzero_values(g.y_shape(), t, false, gen);
  const int64_t taps = g.c / g.groups * g.kh * g.kw;
  // Wide weight gradient (autocast's f32 master of a bf16 weight) where the dtype has one.
  const DType wt = t == DType::bf16 ? DType::f32 : t;
  kernels::ConvGrads want;
  Tensor want_y;
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    want_y = kernels::conv2d_forward(x, w, b, g, c.relu);
    want = kernels::conv2d_backward(gy, x, w, g, true, true, true, t, wt);
  }
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = c.bias ? b.to(kGpu) : Tensor(), gyg = gy.to(kGpu);
  const Tensor got_y = kernels::conv2d_forward(xg, wg, bg, g, c.relu);
  const kernels::ConvGrads got = kernels::conv2d_backward(gyg, xg, wg, g, true, true, true, t, wt);
  EXPECT_TRUE(got_y.device() == kGpu);
  EXPECT_TRUE(agree_within_bound(host(got_y), want_y, taps + 1, 0, "conv2d output"));
  EXPECT_TRUE(agree_within_bound(host(got.x), want.x, g.oc / g.groups * g.kh * g.kw, 0, "conv2d grad x"));
  if (wt == t) {
    EXPECT_TRUE(agree_within_bound(host(got.weight), want.weight, g.n * g.oh * g.ow, 0, "conv2d grad weight"));
  } else {
    // bf16 operands, f32 weight gradient: cuDNN 9.19 has no engine that writes f32 from bf16, so
    // the gradient is formed in bf16 (f32 accumulation, one rounding) and widened, as PyTorch's
    // autocast gives it: the bound is bf16's (kernels/cuda/conv.cpp, conv2d_backward).
    EXPECT_EQ(got.weight.dtype(), wt);
    EXPECT_TRUE(agree_within_bound(kernels::cast(host(got.weight), t), kernels::cast(want.weight, t), g.n * g.oh * g.ow,
                                   0, "conv2d grad weight (bf16 bound)"));
  }
  EXPECT_TRUE(agree_within_bound(host(got.bias), want.bias, g.n * g.oh * g.ow, 0, "conv2d grad bias"));
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaConv, ::testing::ValuesIn(if_gpu([] {
                           std::vector<ConvParam> p;
                           for (size_t i = 0; i < conv_cases().size(); ++i)
                             for (DType dt : {DType::f32, DType::bf16, DType::f16}) p.emplace_back(i, dt);
                           return p;
                         }())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaConv);

// A convolution under a budget that leaves no room past its output: an engine without workspace
// runs it (one of the timed candidates, or a spare: the engines past them, least workspace first),
// or it is OutOfMemory, never another error (max-batch's search goes smaller on OutOfMemory alone:
// on 2026-11-27 "no cuDNN engine's workspace fits" ended it); with the budget lifted, the same call
// runs again (its engines timed again, or the spare that ran kept). Forward with bias + ReLU, and
// backward.
class CudaConvMemory : public ::testing::TestWithParam<DType> {};

TEST_P(CudaConvMemory, NoWorkspaceThatFitsIsOutOfMemoryAndTheNextCallRuns) {
  const DType t = GetParam();
  const ConvCase c{2, 64, 8, 8, 128, 3, 1, 1, 1, 1, true, true};
  const kernels::ConvGeometry g = geometry(c);
  Generator gen(0xb0d6e7 + int(t));
  const Tensor x = nonzero_values(g.x_shape(), t, false, gen), w = nonzero_values(g.w_shape(), t, false, gen);
  const Tensor b = nonzero_values({g.oc}, t, false, gen), gy = nonzero_values(g.y_shape(), t, false, gen);
  const int64_t taps = g.c * g.kh * g.kw;
  Tensor want_y;
  kernels::ConvGrads want;
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    want_y = kernels::conv2d_forward(x, w, b, g, true);
    want = kernels::conv2d_backward(gy, x, w, g, true, true, false, t, t);
  }
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu), gyg = gy.to(kGpu);
  struct Unbudgeted {
    ~Unbudgeted() { allocator::set_budget(0, kGpu); }
  } unbudgeted;
  auto check = [&](const char* what, const std::function<void()>& pass) {
    SCOPED_TRACE(what);
    // The budget at what is reserved, every cached byte taken but the outputs' blocks: the
    // outputs fit, a workspace does not.
    allocator::empty_cache(kGpu);
    std::vector<Tensor> outputs{Tensor::empty(g.y_shape(), t, kGpu), Tensor::empty(g.x_shape(), t, kGpu),
                                Tensor::empty(g.w_shape(), t, kGpu)},
        fillers;
    allocator::set_budget(allocator::stats(kGpu).reserved_bytes, kGpu);
    for (int64_t n = allocator::stats(kGpu).reserved_bytes - allocator::stats(kGpu).allocated_bytes; n >= 512;) {
      try {
        fillers.push_back(Tensor::empty({n}, DType::u8, kGpu));
      } catch (const OutOfMemory&) {
        n /= 2;
      }
    }
    outputs.clear();
    try {
      pass();  // an engine without workspace: its result is checked as any
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    } catch (const Error& e) {
      ADD_FAILURE() << "expected OutOfMemory or a result, got: " << e.what();
    }
    allocator::set_budget(0, kGpu);
    fillers.clear();
    pass();
  };
  check("forward", [&] {
    EXPECT_TRUE(agree_within_bound(host(kernels::conv2d_forward(xg, wg, bg, g, true)), want_y, taps + 1, 0, "y"));
  });
  check("backward", [&] {
    const kernels::ConvGrads got = kernels::conv2d_backward(gyg, xg, wg, g, true, true, false, t, t);
    EXPECT_TRUE(agree_within_bound(host(got.x), want.x, g.oc * g.kh * g.kw, 0, "grad x"));
    EXPECT_TRUE(agree_within_bound(host(got.weight), want.weight, g.n * g.oh * g.ow, 0, "grad weight"));
  });
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaConvMemory,
                         ::testing::ValuesIn(if_gpu<DType>({DType::f32, DType::bf16, DType::f16})));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaConvMemory);

// --------------------------------------------------------------------------------------- pool

using PoolParam = std::tuple<size_t, DType>;
const std::vector<kernels::PoolGeometry>& pool_cases() {
  static const std::vector<kernels::PoolGeometry> c = [] {
    std::vector<kernels::PoolGeometry> v;
    auto win = [&](int64_t h, int64_t w, int64_t k, int64_t s, int64_t p, int64_t d, bool include_pad) {
      kernels::PoolGeometry g;
      g.n = 2, g.c = 3, g.h = h, g.w = w, g.kh = g.kw = k, g.stride_h = g.stride_w = s, g.pad_h = g.pad_w = p;
      g.dil_h = g.dil_w = d, g.count_include_pad = include_pad;
      g.oh = (h + 2 * p - d * (k - 1) - 1) / s + 1, g.ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
      v.push_back(g);
    };
    win(4, 6, 2, 2, 0, 1, true);    // the CNN's 2x2 (pool_2x2.cuh's kernels: an exact tiling)
    win(28, 14, 2, 2, 0, 1, true);  // the same kernels on planes of the models' sizes
    win(7, 5, 3, 2, 1, 1, true);    // overlapping, padded
    win(9, 8, 3, 1, 1, 1, false);   // stride 1: every input in nine windows; pad not counted
    win(11, 10, 3, 2, 1, 2, true);  // dilation 2 (max only: avg ignores dilation)
    win(5, 7, 2, 2, 0, 1, true);    // tiles, with a row and a column that no window covers
    win(9, 6, 3, 3, 0, 1, true);    // 3x3 tiles
    auto adaptive = [&](int64_t h, int64_t w, int64_t oh, int64_t ow) {
      kernels::PoolGeometry g;
      g.n = 2, g.c = 3, g.h = h, g.w = w, g.oh = oh, g.ow = ow, g.adaptive = true;
      v.push_back(g);
    };
    adaptive(7, 5, 3, 2);  // shrinking, uneven windows
    adaptive(3, 2, 5, 4);  // growing: windows of one input, shared
    return v;
  }();
  return c;
}

class CudaPool : public ::testing::TestWithParam<PoolParam> {};

TEST_P(CudaPool, MaxAndAverageMatchTheReference) {
  const auto [index, t] = GetParam();
  const kernels::PoolGeometry& g = pool_cases()[index];
  Generator gen(0x9001 + index * 5 + int(t));
  const Tensor x = nonzero_values({g.n, g.c, g.h, g.w}, t, false, gen);
  const Tensor gy = nonzero_values({g.n, g.c, g.oh, g.ow}, t, false, gen);
  const Tensor xg = x.to(kGpu), gyg = gy.to(kGpu);
  const int64_t window = g.adaptive ? ((g.h + g.oh - 1) / g.oh + 1) * ((g.w + g.ow - 1) / g.ow + 1) : g.kh * g.kw;
  const kernels::PoolGeometry ga = [&] {
    kernels::PoolGeometry a = g;
    a.dil_h = a.dil_w = 1;
    return a;
  }();
  if (!g.adaptive) {
    kernels::MaxPoolResult want;
    Tensor want_gx;
    {
      const kernels::BackendGuard ref(kernels::Backend::ref);
      want = kernels::max_pool2d_forward(x, g);
      want_gx = kernels::max_pool2d_backward(gy, want.argmax, g);
    }
    const kernels::MaxPoolResult got = kernels::max_pool2d_forward(xg, g);
    EXPECT_EQ(host(got.dst).to_vector_f64(), want.dst.to_vector_f64()) << "max is a selection: exact";
    EXPECT_EQ(host(got.argmax).to_vector_i64(), want.argmax.to_vector_i64());
    EXPECT_TRUE(agree_within_bound(host(kernels::max_pool2d_backward(gyg, got.argmax, g)), want_gx, window, 0,
                                   "max_pool2d grad"));
    // The form that reads the input again (max_pool2d after a ReLU): the same winners, and the
    // backward is a gather, so the same bits.
    EXPECT_EQ(host(kernels::max_pool2d_backward_from_input(gyg, xg, g)).to_vector_f64(),
              host(kernels::max_pool2d_backward(gyg, got.argmax, g)).to_vector_f64());
    if (g.argmax_fits_two_bits()) {
      // The argmax in two bits (what max_pool2d keeps for a 2x2 window): the reference's bytes, and
      // the taps back; also for all taps but the last (a last byte of three).
      const Tensor all = got.argmax.reshape({-1});
      for (const Tensor& taps : {all, all.slice(0, 0, all.numel() - 1)}) {
        Tensor want_packed;
        {
          const kernels::BackendGuard ref(kernels::Backend::ref);
          want_packed = kernels::pack_argmax_2bit(host(taps));
        }
        const Tensor packed = kernels::pack_argmax_2bit(taps);
        EXPECT_EQ(host(packed).to_vector_i64(), want_packed.to_vector_i64());
        EXPECT_EQ(host(kernels::unpack_argmax_2bit(packed, taps.shape())).to_vector_i64(), host(taps).to_vector_i64());
      }
    }
  }
  if (g.dil_h == 1 || g.adaptive) {
    Tensor want_y, want_gx;
    {
      const kernels::BackendGuard ref(kernels::Backend::ref);
      want_y = kernels::avg_pool2d_forward(x, ga);
      want_gx = kernels::avg_pool2d_backward(gy, ga);
    }
    EXPECT_TRUE(agree_within_bound(host(kernels::avg_pool2d_forward(xg, ga)), want_y, window, 1, "avg_pool2d"));
    EXPECT_TRUE(agree_within_bound(host(kernels::avg_pool2d_backward(gyg, ga)), want_gx, window, 1, "avg_pool2d grad"));
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaPool, ::testing::ValuesIn(if_gpu([] {
                           std::vector<PoolParam> p;
                           for (size_t i = 0; i < pool_cases().size(); ++i)
                             for (DType dt : {DType::f32, DType::bf16, DType::f16}) p.emplace_back(i, dt);
                           return p;
                         }())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaPool);

// --------------------------------------------------------------------------------------- norm

using NormParam = std::tuple<Shape, DType>;
class CudaNorm : public ::testing::TestWithParam<NormParam> {};

TEST_P(CudaNorm, BatchAndLayerNormMatchTheReference) {
  const auto [shape, t] = GetParam();
  Generator gen(0x0e + shape_numel(shape) + int(t));
  const int64_t channels = shape[1], count = shape_numel(shape) / channels;
  const DType st = DType::f32;
  const Tensor x = nonzero_values(shape, t, false, gen), gy = nonzero_values(shape, t, false, gen);
  const Tensor w = nonzero_values({channels}, t, false, gen), b = nonzero_values({channels}, t, false, gen);
  const Tensor xg = x.to(kGpu), gyg = gy.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu);
  const kernels::BackendGuard ref_guard(kernels::Backend::ref);  // the CPU side: the reference
  Tensor mean, var, mean_g, var_g;
  kernels::batch_norm_stats(x, channels, mean, var);
  kernels::batch_norm_stats(xg, channels, mean_g, var_g);
  EXPECT_TRUE(agree_within_bound(host(mean_g), mean, count, 0, "batch_norm mean"));
  EXPECT_TRUE(agree_within_bound(host(var_g), var, 2 * count, 1, "batch_norm var"));
  const Tensor invstd = kernels::batch_norm_invstd(var, 1e-5, st);
  EXPECT_TRUE(agree_within_bound(host(kernels::batch_norm_invstd(var.to(kGpu), 1e-5, st)), invstd, 1, 0, "invstd"));
  EXPECT_TRUE(agree_within_bound(host(kernels::batch_norm_running(var.to(kGpu), mean.to(kGpu), 1.5, 0.1)),
                                 kernels::batch_norm_running(var, mean, 1.5, 0.1), 1, 0, "running"));
  const Tensor mg = mean.to(kGpu), ig = invstd.to(kGpu);
  EXPECT_TRUE(agree_within_bound(host(kernels::batch_norm_forward(xg, mg, ig, wg, bg)),
                                 kernels::batch_norm_forward(x, mean, invstd, w, b), 4, 1, "batch_norm forward"));
  for (bool training : {true, false}) {
    const kernels::NormGrads want = kernels::batch_norm_backward(gy, x, mean, invstd, w, training, true, true, true);
    const kernels::NormGrads got = kernels::batch_norm_backward(gyg, xg, mg, ig, wg, training, true, true, true);
    EXPECT_TRUE(agree_within_bound(host(got.x), want.x, 2 * count, 2, "batch_norm grad x"));
    EXPECT_TRUE(agree_within_bound(host(got.weight), want.weight, 2 * count, 1, "batch_norm grad weight"));
    EXPECT_TRUE(agree_within_bound(host(got.bias), want.bias, count, 0, "batch_norm grad bias"));
  }
  // Layer norm over rows of the last two dims flattened: [shape[0], rest].
  const Tensor x2 = x.reshape({shape[0], -1}), gy2 = gy.reshape({shape[0], -1});
  const int64_t cols = x2.size(1);
  const Tensor lw = nonzero_values({cols}, t, false, gen), lb = nonzero_values({cols}, t, false, gen);
  Tensor lm, lr, lm_g, lr_g;
  const Tensor y = kernels::layer_norm_forward(x2, lw, lb, 1e-5, lm, lr);
  const Tensor y_g = kernels::layer_norm_forward(x2.to(kGpu), lw.to(kGpu), lb.to(kGpu), 1e-5, lm_g, lr_g);
  EXPECT_TRUE(agree_within_bound(host(y_g), y, 2 * cols, 2, "layer_norm forward"));
  EXPECT_TRUE(agree_within_bound(host(lm_g), lm, cols, 0, "layer_norm mean"));
  EXPECT_TRUE(agree_within_bound(host(lr_g), lr, 2 * cols, 1, "layer_norm rstd"));
  const kernels::NormGrads lwant = kernels::layer_norm_backward(gy2, x2, lm, lr, lw, true, true, true);
  const kernels::NormGrads lgot =
      kernels::layer_norm_backward(gy2.to(kGpu), x2.to(kGpu), lm.to(kGpu), lr.to(kGpu), lw.to(kGpu), true, true, true);
  EXPECT_TRUE(agree_within_bound(host(lgot.x), lwant.x, 2 * cols, 2, "layer_norm grad x"));
  EXPECT_TRUE(agree_within_bound(host(lgot.weight), lwant.weight, 2 * shape[0], 1, "layer_norm grad weight"));
  EXPECT_TRUE(agree_within_bound(host(lgot.bias), lwant.bias, shape[0], 0, "layer_norm grad bias"));
  if (t != DType::f32) return;
  // What layer norm saves under 16-bit autocast: x̂ in bf16 from the forward, and the backward from
  // it (no mean), GPU against CPU.
  Tensor xm, xr, xm_g, xr_g;
  const Tensor xh = Tensor::empty(x2.shape(), DType::bf16), xh_g = Tensor::empty(x2.shape(), DType::bf16, kGpu);
  (void)kernels::layer_norm_forward(x2, lw, lb, 1e-5, xm, xr, xh);
  (void)kernels::layer_norm_forward(x2.to(kGpu), lw.to(kGpu), lb.to(kGpu), 1e-5, xm_g, xr_g, xh_g);
  EXPECT_TRUE(agree_within_bound(host(xh_g), xh, 2 * cols, 2, "layer_norm x̂"));
  const kernels::NormGrads hwant = kernels::layer_norm_backward(gy2, xh, Tensor(), xr, lw, true, true, true);
  const kernels::NormGrads hgot =
      kernels::layer_norm_backward(gy2.to(kGpu), xh.to(kGpu), Tensor(), xr.to(kGpu), lw.to(kGpu), true, true, true);
  EXPECT_TRUE(agree_within_bound(host(hgot.x), hwant.x, 2 * cols, 2, "layer_norm grad x from x̂"));
  EXPECT_TRUE(agree_within_bound(host(hgot.weight), hwant.weight, 2 * shape[0], 1, "layer_norm grad weight from x̂"));
  // A bf16 y (what a norm before a Linear writes under autocast) and the backward from a bf16
  // gradient into an f32 grad_x: on the GPU the bits of the f32 y cast and of the backward from
  // the gradient widened, and against the CPU within the bounds above.
  const Tensor gy16 = gy2.to(DType::bf16);
  Tensor ym, yr, ym_g, yr_g;
  const Tensor y16 = kernels::layer_norm_forward(x2, lw, lb, 1e-5, ym, yr, Tensor(), DType::bf16);
  const Tensor y16_g =
      kernels::layer_norm_forward(x2.to(kGpu), lw.to(kGpu), lb.to(kGpu), 1e-5, ym_g, yr_g, Tensor(), DType::bf16);
  ASSERT_EQ(y16_g.dtype(), DType::bf16);
  EXPECT_EQ(testutil::bytes_of(y16_g), testutil::bytes_of(y_g.to(DType::bf16))) << "bf16 y on the GPU: the f32 y cast";
  EXPECT_TRUE(agree_within_bound(host(y16_g), y16, 2 * cols, 2, "layer_norm bf16 y"));
  const kernels::NormGrads bgot =
      kernels::layer_norm_backward(gy16.to(kGpu), x2.to(kGpu), lm_g, lr_g, lw.to(kGpu), true, true, true, DType::f32);
  const kernels::NormGrads bwide = kernels::layer_norm_backward(gy16.to(DType::f32).to(kGpu), x2.to(kGpu), lm_g, lr_g,
                                                                lw.to(kGpu), true, true, true);
  ASSERT_EQ(bgot.x.dtype(), DType::f32);
  EXPECT_EQ(testutil::bytes_of(bgot.x), testutil::bytes_of(bwide.x)) << "grad x from a bf16 gradient";
  EXPECT_EQ(testutil::bytes_of(bgot.weight), testutil::bytes_of(bwide.weight)) << "grad weight from a bf16 gradient";
  const kernels::NormGrads bwant = kernels::layer_norm_backward(gy16, x2, lm, lr, lw, true, true, true, DType::f32);
  EXPECT_TRUE(agree_within_bound(host(bgot.x), bwant.x, 2 * cols, 2, "layer_norm grad x from a bf16 gradient"));
  // And from the bf16 x̂ (autocast's saved tensor, read as it is by the warp kernels), a bf16 or an
  // f32 gradient: the bits of the f32 operands' backward.
  const Tensor xh_wide = xh_g.to(DType::f32);
  const kernels::NormGrads xwide = kernels::layer_norm_backward(gy16.to(DType::f32).to(kGpu), xh_wide, Tensor(), xr_g,
                                                                lw.to(kGpu), true, true, true);
  for (DType gt : {DType::bf16, DType::f32}) {
    const kernels::NormGrads xgot = kernels::layer_norm_backward(gy16.to(gt).to(kGpu), xh_g, Tensor(), xr_g,
                                                                 lw.to(kGpu), true, true, true, DType::f32);
    EXPECT_EQ(testutil::bytes_of(xgot.x), testutil::bytes_of(xwide.x)) << dtype_name(gt) << " gradient, x̂: grad x";
    EXPECT_EQ(testutil::bytes_of(xgot.weight), testutil::bytes_of(xwide.weight))
        << dtype_name(gt) << " gradient, x̂: grad weight";
    EXPECT_EQ(testutil::bytes_of(xgot.bias), testutil::bytes_of(xwide.bias))
        << dtype_name(gt) << " gradient, x̂: grad bias";
  }
}

// Inner 64 (16-byte vectors), inner 15 (scalar), 1-d-ish [N, C]; layer norm's weight and bias
// gradients over 300 rows (5 chunks of 64 rows, the last partial) of 75 columns (3 tiles of 32, the
// last partial), and over 1000 rows of 128 (the char GPT's width). Layer norm takes the warp-a-row
// kernels (layer_norm_warp.cuh) up to 2048 columns forward and 1024 backward: 40 rows of 768
// (GPT-2's) both ways, 9 rows of 1500 the warp forward and the block backward, 6 rows of 2100 the
// block kernels both ways.
std::vector<NormParam> norm_cases() {
  std::vector<NormParam> p;
  for (const Shape& s : {Shape{4, 3, 8, 8}, Shape{5, 6, 3, 5}, Shape{32, 7}, Shape{300, 3, 5, 5}, Shape{1000, 128},
                         Shape{40, 768}, Shape{9, 1500}, Shape{6, 2100}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) p.emplace_back(s, dt);
  return p;
}
INSTANTIATE_TEST_SUITE_P(Gpu, CudaNorm, ::testing::ValuesIn(if_gpu(norm_cases())));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaNorm);

}  // namespace
}  // namespace mixprec::testing
