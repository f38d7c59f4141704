// Every fast element-wise and reduction kernel (kernels::cpu::*) against its reference
// (kernels::ref::*) in f32, bf16 and f16, on sizes that hit vector tails and OpenMP blocks (softmax
// and the matmul dispatch: test_kernels_products.cpp). Inputs are rounded to the dtype first, so both
// sides see the same values. Tolerance: none (the same bits) for copies, the binary arithmetic and
// add_inplace, one correctly rounded IEEE operation on both sides; 1 ulp of the output dtype for the
// other element-wise kernels (their math functions are not correctly rounded); reductions add an f32
// accumulation bound (n * 2^-24 * sum of |terms|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "kernel_checks.h"
#include "kernels/cpu/vec_exp.h"
#include "kernels/kernels.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using namespace testutil;  // NOLINT(google-build-using-namespace): the shared checks of kernel_checks.h
using kernels::BackendGuard;

// ---------------------------------------------------------------- copy / conversion

// The threshold rule of every fast kernel's parallel region (core/parallel.h): libgomp's passive
// wait policy, in any letter case as libgomp reads it, multiplies the work a region needs by 16; any
// other setting leaves the kernels' own thresholds. ctest runs this suite under both (the
// kernels.passive_wait_policy entry).
TEST(Threads, PassiveWaitPolicyRaisesTheParallelThreshold) {
  const char* env = std::getenv("OMP_WAIT_POLICY");
  std::string policy = env ? env : "";
  for (char& c : policy) c = char(std::tolower(static_cast<unsigned char>(c)));
  const int64_t factor = policy == "passive" ? 16 : 1;
  EXPECT_EQ(detail::parallel_work_factor(), factor) << "OMP_WAIT_POLICY=" << (env ? env : "(unset)");
  EXPECT_TRUE(detail::parallel_worth(4 * factor, 4));
  EXPECT_FALSE(detail::parallel_worth(4 * factor - 1, 4));
}

TEST(Kernels, CopyConvertsLikeTheReference) {
  Generator g(1);
  for (DType src_t : kDTypes)
    for (DType dst_t : kDTypes)
      for (int64_t n : kSizes) {
        std::vector<float> v = uniform(g, n, -70000, 70000);  // f16 overflow and subnormal ranges too
        for (size_t i = 0; i < v.size(); i += 3) v[i] *= 1e-9f;
        const Tensor src = make(v, {n}, src_t);
        Tensor fast = Tensor::empty({n}, dst_t), ref = Tensor::empty({n}, dst_t);
        ASSERT_TRUE(kernels::cpu::copy(src, fast)) << tag(src_t, {n});
        kernels::ref::copy(src, ref);
        EXPECT_TRUE(bit_equal(fast, ref)) << dtype_name(src_t) << " -> " << dtype_name(dst_t) << " n=" << n;
      }
}

TEST(Kernels, CopyOfAStridedViewFallsBackCorrectly) {
  Generator g(2);
  for (DType t : kDTypes) {
    const Tensor src = make(uniform(g, 35, -2, 2), {5, 7}, t).detach().transpose(0, 1);  // [7, 5] strided
    Tensor fast = Tensor::empty({7, 5}, DType::f32), ref = Tensor::empty({7, 5}, DType::f32);
    kernels::copy(src, fast);  // dispatch: the cpu path must decline or agree
    kernels::ref::copy(src, ref);
    EXPECT_TRUE(bit_equal(fast, ref)) << dtype_name(t);
    const auto rv = ref.to_vector(), sv = src.to_vector();
    EXPECT_EQ(rv, sv);
  }
}

// A transpose made contiguous: the fast copy reads kTile x kTile tiles along the source's
// unit-stride dim and writes along the destination's rows (cpu/shape.cpp, copy_tiles). Bit for bit
// the reference, for every dtype pair it takes (one dtype of 1, 2, 4 or 8 bytes; f32 to and from
// the 16-bit floats), partial tiles on both sides, the unit-stride dim before and after an outer
// dim, and a destination whose rows are wider than the copy (its gaps untouched).
TEST(Kernels, CopyOfATransposeRunsInTilesLikeTheReference) {
  Generator g(3);
  struct View {
    Shape base;
    int64_t d0, d1;  // base.transpose(d0, d1) is the source
  };
  // Thin ones too (2 to 7 along a dim: channels-last copies of a 4-channel cnn, kernels/shape.cpp).
  const std::vector<View> views = {{{70, 45}, 0, 1}, {{3, 33, 40}, 1, 2}, {{33, 3, 40}, 0, 2},
                                   {{64, 32}, 0, 1}, {{5, 7}, 0, 1},      {{2, 4, 49}, 1, 2}};
  std::vector<std::pair<DType, DType>> pairs = {
      {DType::f64, DType::f64}, {DType::i64, DType::i64}, {DType::u8, DType::u8}};
  for (DType a : kDTypes)
    for (DType b : kDTypes)
      if (a == b || a == DType::f32 || b == DType::f32) pairs.emplace_back(a, b);
  for (const View& v : views)
    for (const auto& [st, dt] : pairs) {
      std::vector<float> vals = uniform(g, shape_numel(v.base), 0, 200);
      if (st != DType::u8 && st != DType::i64)
        for (size_t i = 0; i < vals.size(); i += 7) vals[i] = -vals[i] * 1e-3f;
      const Tensor src = make(vals, v.base, st).detach().transpose(v.d0, v.d1);
      const std::string what =
          std::string(dtype_name(st)) + " -> " + std::string(dtype_name(dt)) + " " + shape_str(src.shape());
      Shape wide = src.shape();
      wide.back() += 5;
      Tensor fast_wide = Tensor::full(wide, 7.0, dt), ref_wide = Tensor::full(wide, 7.0, dt);
      Tensor fast = fast_wide.slice(src.dim() - 1, 0, src.size(-1)),
             ref = ref_wide.slice(src.dim() - 1, 0, src.size(-1));
      ASSERT_TRUE(kernels::cpu::copy(src, fast)) << what;
      kernels::ref::copy(src, ref);
      EXPECT_TRUE(bit_equal(fast_wide, ref_wide)) << what;
    }
}

// ---------------------------------------------------------------- binary

const std::vector<kernels::BinaryOp> kBinaryOps = {kernels::BinaryOp::add, kernels::BinaryOp::sub,
                                                   kernels::BinaryOp::mul, kernels::BinaryOp::div};

struct BinCase {
  Shape a, b;
  bool fast_must_support;  // contiguous same-shape or suffix-row broadcast
};

void check_binary(const BinCase& c, Generator& g) {
  for (DType t : kDTypes)
    for (kernels::BinaryOp op : kBinaryOps) {
      const Tensor a = make(uniform(g, shape_numel(c.a), -3, 3), c.a, t);
      const Tensor b = make(away_from_zero(g, shape_numel(c.b), 0.25, 3), c.b, t);
      const Tensor ref = kernels::ref::binary(op, a, b);
      Tensor fast = Tensor::empty(kernels::broadcast_shapes(c.a, c.b, "test"), t);
      const bool ok = kernels::cpu::binary(op, a, b, fast);
      const std::string what = tag(t, c.a) + " op" + std::to_string(int(op)) + " " + shape_str(c.b);
      if (c.fast_must_support) {
        EXPECT_TRUE(ok) << "fast path declined " << what;
      }
      // One IEEE operation in f32 (f64 for f64), rounded once to the dtype, on both sides: the
      // same bits, not merely the same value within an ulp.
      if (ok) {
        EXPECT_TRUE(bit_equal(fast, ref)) << what;
      }
      const BackendGuard cpu(kernels::Backend::cpu);
      EXPECT_TRUE(bit_equal(kernels::binary(op, a, b), ref)) << "dispatch " << what;
    }
}

TEST(Kernels, BinarySameShape) {
  Generator g(3);
  for (int64_t n : kSizes) check_binary({{n}, {n}, true}, g);
  check_binary({{3, 4097}, {3, 4097}, true}, g);
}

TEST(Kernels, BinaryBroadcastRowsAndScalars) {
  Generator g(4);
  const std::vector<BinCase> cases = {
      {{5, 4000}, {4000}, true},     // bias rows, period not a divisor of the block
      {{4000}, {5, 4000}, true},     // row on the left (sub/div operand order)
      {{6667, 3}, {3}, true},        // short rows, 5 blocks (parallel)
      {{3, 4097}, {1, 4097}, true},  // leading ones
      {{2, 3, 7}, {3, 7}, true},     // suffix of two dims
      {{20000}, {}, true},           // scalar right
      {{}, {4097}, true},            // scalar left
      {{7}, {1}, true},
      {{}, {}, true},
      {{4097, 3}, {4097, 1}, false},  // [N,1] columns
      {{4097, 1}, {1, 5}, false},     // outer broadcast
      {{2, 1, 7}, {3, 1}, false},
  };
  for (const BinCase& c : cases) check_binary(c, g);
}

TEST(Kernels, AddInplaceAccumulates) {
  Generator g(5);
  for (DType t : kDTypes)
    for (int64_t n : kSizes) {
      Tensor acc = make(uniform(g, n, -2, 2), {n}, t);
      const Tensor x = make(uniform(g, n, -2, 2), {n}, t);
      const Tensor ref = kernels::ref::binary(kernels::BinaryOp::add, acc, x);
      const BackendGuard cpu(kernels::Backend::cpu);
      kernels::add_inplace(acc, x);
      EXPECT_TRUE(bit_equal(acc, ref)) << tag(t, {n});
    }
}

// ---------------------------------------------------------------- unary and unary_grad

struct UnaryCase {
  kernels::UnaryOp op;
  kernels::UnaryParams p;
  double lo, hi;
  const char* name;
};
const std::vector<UnaryCase> kUnaryCases = {
    {kernels::UnaryOp::neg, {}, -5, 5, "neg"},        {kernels::UnaryOp::affine, {1.7, -0.3}, -5, 5, "affine"},
    {kernels::UnaryOp::exp, {}, -12, 12, "exp"},  // overflows f16 above ~11.1
    {kernels::UnaryOp::log, {}, 1e-3, 100, "log"},    {kernels::UnaryOp::pow, {2.5, 0}, 0.01, 20, "pow2.5"},
    {kernels::UnaryOp::pow, {3.0, 0}, -4, 4, "pow3"}, {kernels::UnaryOp::sqrt, {}, 0, 100, "sqrt"},
};

TEST(Kernels, Unary) {
  Generator g(6);
  for (const UnaryCase& c : kUnaryCases)
    for (DType t : kDTypes)
      for (int64_t n : kSizes) {
        const Tensor x = make(uniform(g, n, c.lo, c.hi), {n}, t);
        Tensor fast = Tensor::empty({n}, t);
        ASSERT_TRUE(kernels::cpu::unary(c.op, x, c.p, fast)) << c.name;
        EXPECT_TRUE(within_ulp(fast, kernels::ref::unary(c.op, x, c.p))) << c.name << " " << tag(t, {n});
      }
}

TEST(Kernels, UnaryGrad) {
  using G = kernels::UnaryGradOp;
  struct GradCase {
    G op;
    kernels::UnaryParams p;
    double lo, hi;
    const char* name;
  };
  const std::vector<GradCase> cases = {
      {G::exp, {}, -8, 8, "exp"},
      {G::log, {}, 1e-2, 100, "log"},
      {G::pow, {2.5, 0}, 0.01, 20, "pow"},
      {G::sqrt, {}, 1e-2, 100, "sqrt"},
  };
  Generator g(7);
  for (const GradCase& c : cases)
    for (DType t : kDTypes)
      for (int64_t n : kSizes) {
        const Tensor x = make(uniform(g, n, c.lo, c.hi), {n}, t);
        const Tensor gr = make(uniform(g, n, -2, 2), {n}, t);
        Tensor fast = Tensor::empty({n}, t);
        ASSERT_TRUE(kernels::cpu::unary_grad(c.op, gr, x, c.p, fast)) << c.name;
        EXPECT_TRUE(within_ulp(fast, kernels::ref::unary_grad(c.op, gr, x, c.p))) << c.name << " " << tag(t, {n});
      }
}

// ---------------------------------------------------------------- activations

// The fast kernel may differ from the reference's f32 value by `f32_ulps` f32 ulps (silu, sigmoid
// and tanh: the vector exp, a polynomial, against libm's correctly rounded one, plus the sum and
// quotient around it), then both round to the dtype: 1 ulp of the dtype plus that. A gradient
// g * f'(s) is bounded the same way relative to |g| (1 + |s|), the size of f''s terms: silu's
// derivative sigma (1 + x (1 - sigma)) cancels near x = -1.28, so a relative bound cannot hold.
struct ActivationCase {
  kernels::Activation op;
  double lo, hi;
  double fwd_f32_ulps, grad_f32_ulps;
  const char* name;
};
const std::vector<ActivationCase> kActivationCases = {
    {kernels::Activation::relu, -3, 3, 0, 0, "relu"},           {kernels::Activation::gelu, -6, 6, 0, 0, "gelu"},
    {kernels::Activation::gelu_tanh, -6, 6, 4, 4, "gelu_tanh"}, {kernels::Activation::silu, -20, 20, 4, 4, "silu"},
    {kernels::Activation::sigmoid, -20, 20, 4, 0, "sigmoid"},  // grad y(1-y): the same f32 operations
    {kernels::Activation::tanh, -6, 6, 4, 0, "tanh"},
};

::testing::AssertionResult within(const Tensor& fast, const Tensor& ref, double f32_ulps) {
  const std::vector<double> r = ref.to_vector_f64();
  const DType t = ref.dtype();
  return close(fast, ref, [&](size_t i) { return ulp_of(t, r[i]) + f32_ulps * ulp_of(DType::f32, r[i]); });
}

// GELU's tanh form: the reference computes 0.5 x (1 + t) with libm's tanh, the fast kernel the
// same function as x sigmoid(2u) with a vector exp (one exp and one division instead of tanh's
// exp, division and polynomial). Their difference is bounded by f32_ulps of t carried through the
// reference's formula (0.5 x (1 + t): |x|/2 per unit of t; the derivative 0.5 (1 + t) + 0.5 s
// (1 - t^2) c (1 + 3a s^2): 1/2 + |s t| c (1 + 3a s^2) per unit of t; the sigmoid form is the more
// accurate of the two where 1 + t cancels) plus f32_ulps of the result for the multiplications.
double gelu_tanh_t_ulp(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return ulp_of(DType::f32, t);
}
::testing::AssertionResult gelu_tanh_within(const Tensor& fast, const Tensor& ref, const Tensor& x, double f32_ulps) {
  const std::vector<double> r = ref.to_vector_f64(), xv = x.to_vector_f64();
  const DType t = ref.dtype();
  return close(fast, ref, [&](size_t i) {
    return ulp_of(t, r[i]) + f32_ulps * ulp_of(DType::f32, r[i]) +
           f32_ulps * 0.5 * std::fabs(xv[i]) * gelu_tanh_t_ulp(xv[i]);
  });
}
::testing::AssertionResult gelu_tanh_grad_within(const Tensor& fast, const Tensor& ref, const Tensor& gr,
                                                 const Tensor& saved, double f32_ulps) {
  const std::vector<double> r = ref.to_vector_f64(), gv = gr.to_vector_f64(), sv = saved.to_vector_f64();
  const DType t = ref.dtype();
  return close(fast, ref, [&](size_t i) {
    const double s = sv[i], c = 0.7978845608028654;
    const double per_t = 0.5 + std::fabs(s) * c * (1 + 3 * 0.044715 * s * s);  // |t| <= 1
    return ulp_of(t, r[i]) + f32_ulps * kU32 * std::fabs(gv[i]) * (1 + std::fabs(s)) +
           f32_ulps * std::fabs(gv[i]) * per_t * gelu_tanh_t_ulp(s);
  });
}

TEST(Kernels, Activation) {
  Generator g(18);
  for (const ActivationCase& c : kActivationCases)
    for (DType t : kDTypes)
      for (int64_t n : kSizes) {
        std::vector<float> v = uniform(g, n, c.lo, c.hi);
        if (n > 4) v[1] = 0.f, v[2] = NAN, v[3] = INFINITY, v[4] = -INFINITY;
        if (n > 5) v[5] = -60.f;  // finite, with gelu_tanh's e^-2u over f32's range
        const Tensor x = make(v, {n}, t);
        Tensor fast = Tensor::empty({n}, t);
        ASSERT_TRUE(kernels::cpu::activation(c.op, x, fast)) << c.name;
        const Tensor ref = kernels::ref::activation(c.op, x);
        EXPECT_TRUE(c.op == kernels::Activation::gelu_tanh ? gelu_tanh_within(fast, ref, x, c.fwd_f32_ulps)
                                                           : within(fast, ref, c.fwd_f32_ulps))
            << c.name << " " << tag(t, {n});
      }
}

::testing::AssertionResult grad_within(const Tensor& fast, const Tensor& ref, const Tensor& gr, const Tensor& saved,
                                       double f32_ulps) {
  const std::vector<double> r = ref.to_vector_f64(), gv = gr.to_vector_f64(), sv = saved.to_vector_f64();
  const DType t = ref.dtype();
  return close(fast, ref,
               [&](size_t i) { return ulp_of(t, r[i]) + f32_ulps * kU32 * std::fabs(gv[i]) * (1 + std::fabs(sv[i])); });
}

TEST(Kernels, ActivationGrad) {
  Generator g(19);
  for (const ActivationCase& c : kActivationCases)
    for (DType t : kDTypes)
      for (int64_t n : kSizes) {
        std::vector<float> v = uniform(g, n, c.lo, c.hi);
        if (n > 1) v[1] = -60.f;  // as in Kernels.Activation: gelu_tanh's e^-2u over f32's range
        const Tensor x = make(v, {n}, t);
        const Tensor saved = kernels::grad_from_output(c.op) ? kernels::ref::activation(c.op, x) : x;
        const Tensor gr = make(away_from_zero(g, n, 0.25, 2), {n}, t);
        Tensor fast = Tensor::empty({n}, t);
        ASSERT_TRUE(kernels::cpu::activation_grad(c.op, gr, saved, fast)) << c.name;
        const Tensor ref = kernels::ref::activation_grad(c.op, gr, saved);
        EXPECT_TRUE(c.op == kernels::Activation::gelu_tanh
                        ? gelu_tanh_grad_within(fast, ref, gr, saved, c.grad_f32_ulps)
                        : grad_within(fast, ref, gr, saved, c.grad_f32_ulps))
            << c.name << " " << tag(t, {n});
      }
}

// bf16 tensors of the vectorised activations run their own loops (widened in registers, rounded on
// the way out): each result must be, bit for bit, the f32 kernel's result on the widened inputs
// rounded once, as it was when the bf16 blocks went through f32 buffers; sizes with every tail.
// The vector e^x of the fast activations, each form this host runs (AVX-512, AVX2), within 2 ulp of
// the correctly rounded e^x over the whole range, subnormal results included (within 2 of their
// ulp), with inf above 88.72, +0 far below, and NaN kept.
__attribute__((target("avx512f"))) void exp_avx512(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, kernels::cpu::exp_ps(_mm512_loadu_ps(x + i)));
}
__attribute__((target("avx2,fma"))) void exp_avx2(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, kernels::cpu::exp256_ps(_mm256_loadu_ps(x + i)));
}
TEST(Kernels, VectorExpIsWithinTwoUlp) {
  std::vector<float> x;
  for (float v = -110.f; v < 95.f; v += 0.00137f) x.push_back(v);
  for (float v : {0.f, -0.f, 88.72f, 88.73f, -87.33f, -103.97f, -104.f, -200.f, INFINITY, -INFINITY, NAN})
    x.push_back(v);
  x.resize((x.size() + 15) / 16 * 16, 1.f);
  std::vector<std::pair<const char*, void (*)(const float*, float*, size_t)>> forms;
  if (mixprec::cpu::has_avx512f()) forms.emplace_back("AVX-512", exp_avx512);
  if (mixprec::cpu::has_avx2_fma()) forms.emplace_back("AVX2", exp_avx2);
  if (forms.empty()) GTEST_SKIP() << "neither AVX-512 nor AVX2 on this host: no vector exp runs";
  for (const auto& [name, fn] : forms) {
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), x.size());
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float ref = float(std::exp(double(x[i])));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(y[i])) << name;
        continue;
      }
      if (std::isinf(ref) || ref == 0.f) {
        EXPECT_EQ(y[i], ref) << name << " e^" << x[i];
        continue;
      }
      const double ulp = std::ldexp(1.0, std::max(std::ilogb(ref), -126) - 23);
      worst = std::max(worst, std::fabs(double(y[i]) - double(ref)) / ulp);
      ASSERT_LE(std::fabs(double(y[i]) - double(ref)), 2 * ulp) << name << " e^" << x[i] << " = " << ref;
    }
    std::printf("%s exp: worst %.2f ulp over %zu values\n", name, worst, x.size());
  }
}

// The bf16 attention tiles' e^x (vec_exp.h, exp_bf16_ps) on its domain, x <= 0: within 3e-6 of e^x
// relative down to x = -86 (its clamp, so no result is subnormal), a normal number at most
// e^-86 below it (-inf included: the uses mask those lanes), and NaN kept. The bound is
// the polynomial's 2.6e-6 plus f32's roundings; a coefficient off in its fourth digit breaks it.
__attribute__((target("avx512f"))) void exp_bf16_avx512(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, kernels::cpu::exp_bf16_ps(_mm512_loadu_ps(x + i)));
}
TEST(Kernels, VectorExpForBf16IsWithinThreeMillionths) {
  if (!mixprec::cpu::has_avx512f())
    GTEST_SKIP() << "no AVX-512 on this host: the bf16 attention tiles (exp_bf16_ps's only users) do not run";
  std::vector<float> x;
  for (float v = -100.f; v <= 0.f; v += 0.000731f) x.push_back(v);
  for (float v : {0.f, -0.f, -1e-30f, -0.3465736f, -0.3465737f, -86.f, -86.5f, -87.34f, -104.f, -1e30f, -INFINITY, NAN})
    x.push_back(v);
  x.resize((x.size() + 15) / 16 * 16, 0.f);
  std::vector<float> y(x.size());
  exp_bf16_avx512(x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    ASSERT_TRUE(std::isnormal(y[i])) << "e^" << x[i] << " gave " << y[i];
    if (x[i] < -86.f) {
      EXPECT_LE(double(y[i]), std::exp(-86.0) * (1 + 3e-6)) << "e^" << x[i];
      continue;
    }
    const double ref = std::exp(double(x[i])), rel = std::fabs(double(y[i]) - ref) / ref;
    worst = std::max(worst, rel);
    ASSERT_LE(rel, 3e-6) << "e^" << x[i] << " = " << ref << ", got " << y[i];
  }
  std::printf("bf16 attention exp: worst %.2e relative over %zu values\n", worst, x.size());
}

TEST(Kernels, ActivationBf16IsTheF32KernelRoundedOnce) {
  if (!mixprec::cpu::has_avx512f())
    GTEST_SKIP() << "no AVX-512 on this host: bf16 activations run the f32 kernels on converted blocks or their "
                    "tables (no loops of their own to compare)";
  // Each rounding this host runs: VCVTNE2PS2BF16 where it has AVX512-BF16, and the integer lanes of
  // the CPUs without it (detail::native_bf16_rounding).
  for (const detail::ConversionPath path : detail::bulk_conversion_paths()) {
    SCOPED_TRACE(std::string("rounding path ") + detail::conversion_path_name(path));
    const detail::ConversionPathScope scope(path);
    Generator g(20);
    for (const ActivationCase& c : kActivationCases) {
      if (c.op == kernels::Activation::relu || c.op == kernels::Activation::gelu) continue;  // not vectorised
      for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(4095), int64_t(4097), int64_t(100003)}) {
        std::vector<float> v = uniform(g, n, c.lo, c.hi);
        if (n > 4) v[1] = 0.f, v[2] = NAN, v[3] = INFINITY, v[4] = -INFINITY;
        // Subnormal results (the native rounding's fix-up: VCVTNE2PS2BF16 flushes them): gelu(x) ~ x / 2
        // and a gradient ~ g / 2 near 0.
        std::vector<float> gv = away_from_zero(g, n, 0.25, 2);
        if (n > 6) v[5] = std::ldexp(1.0f, -125), v[6] = -std::ldexp(3.0f, -131), gv[5] = std::ldexp(-5.0f, -130);
        const Tensor x = make(v, {n}, DType::bf16), gr = make(gv, {n}, DType::bf16);
        const Tensor x32 = make(std::vector<float>(v.size()), {n}, DType::f32);
        const Tensor gr32 = make(std::vector<float>(v.size()), {n}, DType::f32);
        convert(x.data_ptr(), DType::bf16, x32.data_ptr(), DType::f32, size_t(n));
        convert(gr.data_ptr(), DType::bf16, gr32.data_ptr(), DType::f32, size_t(n));
        Tensor y = Tensor::empty({n}, DType::bf16), y32 = Tensor::empty({n}, DType::f32);
        Tensor d = Tensor::empty({n}, DType::bf16), d32 = Tensor::empty({n}, DType::f32);
        ASSERT_TRUE(kernels::cpu::activation(c.op, x, y) && kernels::cpu::activation(c.op, x32, y32)) << c.name;
        ASSERT_TRUE(kernels::cpu::activation_grad(c.op, gr, x, d) &&
                    kernels::cpu::activation_grad(c.op, gr32, x32, d32))
            << c.name;
        const auto* yb = static_cast<const uint16_t*>(y.data_ptr());
        const auto* db = static_cast<const uint16_t*>(d.data_ptr());
        const auto* yf = static_cast<const float*>(y32.data_ptr());
        const auto* df = static_cast<const float*>(d32.data_ptr());
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; ++i)
          if (yb[i] != f32_to_bf16(yf[i]) || db[i] != f32_to_bf16(df[i])) bad += 1, first = first < 0 ? i : first;
        EXPECT_EQ(bad, 0) << c.name << " n=" << n << ": first at " << first;
      }
    }
  }
}

// The 16-bit activations' tables (cpu/activation.cpp, table16) against the arithmetic they
// replace, bit for bit: the forward on every bf16 and f16 pattern, the backward with every pattern
// saved and, for each, gradients of random bits (NaNs, infinities and subnormals among them) and of
// ordinary values, under each bf16 rounding this host runs; 7 more elements than the patterns, so
// the last block's tail runs too. One exception: where the gradient and the slope are both NaN the
// result is a NaN either way, but whose payload and sign comes out is the product's operand order,
// which C++ leaves to the compiler (exact GELU's scalar loop has them the other way round).
bool is_nan16(uint16_t b, DType t) { return (b & 0x7fff) > (t == DType::bf16 ? 0x7f80 : 0x7c00); }
::testing::AssertionResult same_bits(const Tensor& table, const Tensor& arith, const Tensor* grad = nullptr,
                                     const Tensor* saved = nullptr) {
  const DType t = table.dtype();
  const auto* a = static_cast<const uint16_t*>(table.data_ptr());
  const auto* b = static_cast<const uint16_t*>(arith.data_ptr());
  auto both_nan = [&](int64_t i) {
    return grad != nullptr && is_nan16(static_cast<const uint16_t*>(grad->data_ptr())[i], t) &&
           is_nan16(static_cast<const uint16_t*>(saved->data_ptr())[i], t) && is_nan16(a[i], t) && is_nan16(b[i], t);
  };
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < table.numel(); ++i)
    if (a[i] != b[i] && !both_nan(i)) bad += 1, first = first < 0 ? i : first;
  if (bad == 0) return ::testing::AssertionSuccess();
  char what[96];
  std::snprintf(what, sizeof what, ", the first at %lld: table 0x%04x, arithmetic 0x%04x",
                static_cast<long long>(first), unsigned(a[first]), unsigned(b[first]));
  return ::testing::AssertionFailure() << bad << " of " << table.numel() << " differ" << what;
}
Tensor of_bits(const std::vector<uint16_t>& bits, DType t) {
  Tensor x = Tensor::empty({int64_t(bits.size())}, t);
  std::copy(bits.begin(), bits.end(), static_cast<uint16_t*>(x.data_ptr()));
  return x;
}
TEST(Kernels, ActivationTablesAreTheArithmeticBitForBit) {
  if (!mixprec::cpu::has_avx512f() && !mixprec::cpu::has_avx2_fma())
    GTEST_SKIP() << "neither AVX-512 nor AVX2 on this host: the 16-bit activations run their arithmetic (no tables "
                    "to compare)";
  std::vector<uint16_t> saved_bits;
  for (int p = 0; p < (1 << 16); ++p) saved_bits.push_back(uint16_t(p));
  for (uint16_t p : {0x3f80, 0x0001, 0x7f80, 0xffff, 0x8000, 0x4000, 0xc100}) saved_bits.push_back(p);
  const int64_t n = int64_t(saved_bits.size());
  Generator g(21);
  std::vector<uint16_t> random_bits(saved_bits.size());
  for (uint16_t& b : random_bits) b = uint16_t(g.uniform() * 65536.0);
  for (const detail::ConversionPath path : detail::bulk_conversion_paths()) {
    SCOPED_TRACE(std::string("rounding path ") + detail::conversion_path_name(path));
    const detail::ConversionPathScope scope(path);
    for (const ActivationCase& c : kActivationCases) {
      if (c.op == kernels::Activation::relu) continue;  // on the raw bits, no table
      for (DType t : {DType::bf16, DType::f16}) {
        const Tensor x = of_bits(saved_bits, t);
        const Tensor ordinary = make(away_from_zero(g, n, 0.25, 2), {n}, t);
        Tensor y_table = Tensor::empty({n}, t), y_arith = Tensor::empty({n}, t);
        {
          const kernels::cpu::ActivationTable on(true);
          ASSERT_TRUE(kernels::cpu::activation(c.op, x, y_table)) << c.name;
        }
        {
          const kernels::cpu::ActivationTable off(false);
          ASSERT_TRUE(kernels::cpu::activation(c.op, x, y_arith)) << c.name;
        }
        EXPECT_TRUE(same_bits(y_table, y_arith)) << c.name << " forward " << dtype_name(t);
        for (const Tensor& gr : {of_bits(random_bits, t), ordinary}) {
          Tensor d_table = Tensor::empty({n}, t), d_arith = Tensor::empty({n}, t);
          {
            const kernels::cpu::ActivationTable on(true);
            ASSERT_TRUE(kernels::cpu::activation_grad(c.op, gr, x, d_table)) << c.name;
          }
          {
            const kernels::cpu::ActivationTable off(false);
            ASSERT_TRUE(kernels::cpu::activation_grad(c.op, gr, x, d_arith)) << c.name;
          }
          EXPECT_TRUE(same_bits(d_table, d_arith, &gr, &x)) << c.name << " backward " << dtype_name(t);
        }
      }
    }
  }
}

// ReLU works on the raw bits of 16-bit values: for every class of value, in the vector body (32
// or 16 per step) and the tail, the forward must give exactly "x > 0 or NaN ? x : +0" and the
// backward select exactly what "x > 0 ? g : 0" selects.
TEST(Kernels, ReluSpecialValues) {
  const float sub16 = std::ldexp(1.0f, -24), sub_bf16 = std::ldexp(1.0f, -130);
  const std::vector<float> xs = {0.f, -0.f, NAN,      -NAN,      INFINITY, -INFINITY, sub16, -sub16,
                                 1.f, -1.f, sub_bf16, -sub_bf16, 65504.f,  -65504.f,  3e38f, -3e38f};
  const std::vector<float> gs = {1.5f, -2.f, NAN, INFINITY, -INFINITY, 0.f, -0.f, 7.f};
  for (DType t : kDTypes)
    for (int64_t n : {int64_t(5), int64_t(16 * 7 + 3)}) {
      std::vector<float> xv(static_cast<size_t>(n)), gv(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        xv[size_t(i)] = xs[size_t(i) % xs.size()], gv[size_t(i)] = gs[size_t(i) % gs.size()];
      const Tensor x = make(xv, {n}, t), gr = make(gv, {n}, t);
      Tensor fast = Tensor::empty({n}, t);
      ASSERT_TRUE(kernels::cpu::activation_grad(kernels::Activation::relu, gr, x, fast));
      Tensor fwd = Tensor::empty({n}, t);
      ASSERT_TRUE(kernels::cpu::activation(kernels::Activation::relu, x, fwd));
      const std::vector<float> xr = x.to_vector(), gr_v = gr.to_vector(), out = fast.to_vector(), y = fwd.to_vector();
      auto same = [](float a, float b) {
        return std::isnan(b) ? bool(std::isnan(a)) : a == b && std::signbit(a) == std::signbit(b);
      };
      for (int64_t i = 0; i < n; ++i) {
        const float xi = xr[size_t(i)];
        EXPECT_TRUE(same(out[size_t(i)], xi > 0.f ? gr_v[size_t(i)] : 0.f))
            << dtype_name(t) << " x=" << xi << " g=" << gr_v[size_t(i)] << " got " << out[size_t(i)];
        EXPECT_TRUE(same(y[size_t(i)], xi > 0.f || std::isnan(xi) ? xi : 0.f))
            << dtype_name(t) << " relu(" << xi << ") got " << y[size_t(i)];
      }
    }
}

// ---------------------------------------------------------------- sum

// Bound for element j of a sum over n_j terms: f32 accumulation plus one rounding to out_t.
::testing::AssertionResult sum_close(const Tensor& fast, const Tensor& ref, const Tensor& x,
                                     const std::vector<int64_t>& dims, bool keepdim) {
  Tensor xabs = Tensor::from_vector(x.to_vector_f64(), x.shape(), DType::f64);
  {
    double* p = xabs.data<double>();
    for (int64_t i = 0; i < xabs.numel(); ++i) p[i] = std::fabs(p[i]);
  }
  const std::vector<double> s = kernels::ref::sum(xabs, dims, keepdim, DType::f64).to_vector_f64();
  const std::vector<double> r = ref.to_vector_f64();
  const double n = double(x.numel()) / double(std::max<int64_t>(ref.numel(), 1));
  const DType t = ref.dtype();
  return close(fast, ref, [&](size_t i) { return (n + 1) * kU32 * s[i] + ulp_of(t, r[i]); });
}

void check_sum(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim, bool fast_must_support,
               Generator& g) {
  for (DType t : kDTypes)
    for (DType out_t : {t, DType::f32}) {
      const Tensor x = make(uniform(g, shape_numel(shape), -2, 3), shape, t);
      const Tensor ref = kernels::ref::sum(x, dims, keepdim, out_t);
      Tensor fast = Tensor::empty(ref.shape(), out_t);
      const bool ok = kernels::cpu::sum(x, dims, keepdim, fast);
      const std::string what = tag(t, shape) + " -> " + std::string(dtype_name(out_t)) +
                               " keepdim=" + std::to_string(keepdim) +
                               " dims[0]=" + std::to_string(dims.empty() ? -1 : dims[0]);
      if (fast_must_support) {
        EXPECT_TRUE(ok) << "fast path declined " << what;
      }
      if (ok) {
        EXPECT_TRUE(sum_close(fast, ref, x, dims, keepdim)) << what;
      }
      const BackendGuard cpu(kernels::Backend::cpu);
      EXPECT_TRUE(sum_close(kernels::sum(x, dims, keepdim, out_t), ref, x, dims, keepdim)) << "dispatch " << what;
    }
}

TEST(Kernels, SumFull) {
  Generator g(8);
  for (int64_t n : kSizes) check_sum({n}, {0}, false, true, g);
  check_sum({317, 311}, {0, 1}, false, true, g);
  check_sum({4, 5, 6}, {0, 1, 2}, true, true, g);
}

TEST(Kernels, SumOverLeadingDims) {
  Generator g(9);
  check_sum({4097, 3}, {0}, false, true, g);   // bias gradient of a narrow layer
  check_sum({7, 4097}, {0}, false, true, g);   // columns across two column blocks
  check_sum({100, 1000}, {0}, true, true, g);  // parallel over columns
  check_sum({6250, 16}, {0}, false, true, g);  // 100000 elements, few columns
  check_sum({10, 20, 33}, {0, 1}, false, true, g);
  check_sum({1, 4095}, {0}, false, true, g);
}

// bf16 column sums widen in registers: the same f32 additions as on the widened f32 tensor, so the
// same bits (the f32 output; bf16 outputs round that), on the bias gradients' shapes and the tails.
TEST(Kernels, SumOverLeadingDimsOfBf16IsTheF32SumOfItsValues) {
  Generator g(11);
  for (const Shape& shape : {Shape{4096, 384}, Shape{4097, 3}, Shape{7, 4097}, Shape{100, 1000}, Shape{1000, 33}}) {
    const int64_t n = shape_numel(shape);
    const Tensor x = make(uniform(g, n, -2, 3), shape, DType::bf16);
    const Tensor x32 = make(std::vector<float>(size_t(n)), shape, DType::f32);
    convert(x.data_ptr(), DType::bf16, x32.data_ptr(), DType::f32, size_t(n));
    Tensor s = Tensor::empty({shape[1]}, DType::f32), s32 = Tensor::empty({shape[1]}, DType::f32);
    ASSERT_TRUE(kernels::cpu::sum(x, {0}, false, s) && kernels::cpu::sum(x32, {0}, false, s32));
    EXPECT_EQ(s.to_vector_f64(), s32.to_vector_f64()) << tag(DType::bf16, shape);
  }
}

TEST(Kernels, SumOverOtherDimsMatchesThroughDispatch) {
  Generator g(10);
  check_sum({33, 17}, {1}, false, false, g);
  check_sum({5, 6, 7}, {1}, true, false, g);
  check_sum({5, 6, 7}, {0, 2}, false, false, g);
}

TEST(Kernels, SumOverAnEmptyDimIsZero) {
  for (DType t : kDTypes) {
    const Tensor x = Tensor::empty({0, 5}, t);
    const Tensor ref = kernels::ref::sum(x, {0}, false, t);
    ASSERT_EQ(ref.to_vector(), std::vector<float>(5, 0.f));
    Tensor fast = Tensor::full({5}, 7.0, t);  // garbage a kernel must overwrite
    if (kernels::cpu::sum(x, {0}, false, fast)) {
      EXPECT_EQ(fast.to_vector(), std::vector<float>(5, 0.f)) << dtype_name(t);
    }
    const BackendGuard cpu(kernels::Backend::cpu);
    EXPECT_EQ(kernels::sum(x, {0}, false, t).to_vector(), std::vector<float>(5, 0.f)) << dtype_name(t);
  }
}

}  // namespace
}  // namespace mixprec
