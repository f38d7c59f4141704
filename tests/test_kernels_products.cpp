// The fast softmax and the matmul dispatch (backend cpu: oneDNN and mixprec's own products) against
// their references in f32, bf16 and f16 (the element-wise kernels: test_kernels.cpp). Tolerance: an
// f32 accumulation bound (n * 2^-24 * sum of |terms|) plus 1 ulp of the output dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_checks.h"
#include "kernels/kernels.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using namespace testutil;  // NOLINT(google-build-using-namespace): the shared checks of kernel_checks.h
using kernels::BackendGuard;

// ---------------------------------------------------------------- softmax

const std::vector<Shape> kSoftmaxShapes = {{1, 1},    {7, 7},     {3, 4095}, {2, 4096}, {100, 1000},
                                           {4097, 8}, {4, 5, 33}, {9},       {3, 4097}};

TEST(Kernels, SoftmaxForward) {
  Generator g(11);
  for (const Shape& s : kSoftmaxShapes)
    for (DType t : kDTypes)
      for (bool log : {false, true}) {
        const Tensor x = make(uniform(g, shape_numel(s), -8, 8), s, t);
        const Tensor ref = kernels::ref::softmax_lastdim(x, log);
        const double cols = double(s.back());
        const std::vector<double> r = ref.to_vector_f64();
        // log: v = x - lse, |x|, |lse| <= 8 + log(cols); the sum of exps is good to cols * u.
        auto tol = [&](size_t i) {
          return ulp_of(t, r[i]) + 4 * kU32 * (log ? cols + 20 + std::log(cols) : (cols + 20) * std::fabs(r[i]));
        };
        Tensor fast = Tensor::empty(s, t);
        const bool ok = kernels::cpu::softmax_lastdim(x, log, fast);
        const std::string what = tag(t, s) + (log ? " log" : "");
        if (s.back() <= 4096) {
          EXPECT_TRUE(ok) << "fast path declined " << what;
        }
        if (ok) {
          EXPECT_TRUE(close(fast, ref, tol)) << what;
        }
        const BackendGuard cpu(kernels::Backend::cpu);
        EXPECT_TRUE(close(kernels::softmax_lastdim(x, log), ref, tol)) << "dispatch " << what;
      }
}

TEST(Kernels, SoftmaxBackward) {
  Generator g(12);
  for (const Shape& s : kSoftmaxShapes)
    for (DType t : kDTypes)
      for (bool log : {false, true}) {
        const int64_t cols = s.back(), rows = shape_numel(s) / cols;
        const Tensor y = kernels::ref::softmax_lastdim(make(uniform(g, shape_numel(s), -8, 8), s, t), log);
        const Tensor gy = make(uniform(g, shape_numel(s), -2, 2), s, t);
        const Tensor ref = kernels::ref::softmax_lastdim_backward(y, gy, log);
        const std::vector<double> yv = y.to_vector_f64(), gv = gy.to_vector_f64(), r = ref.to_vector_f64();
        std::vector<double> row_s(size_t(rows), 0.0);  // sum of |terms| of the row's dot product
        for (int64_t i = 0; i < rows * cols; ++i)
          row_s[size_t(i / cols)] += std::fabs(gv[size_t(i)]) * (log ? 1.0 : std::fabs(yv[size_t(i)]));
        auto tol = [&](size_t i) {
          const double w = log ? std::exp(yv[i]) : std::fabs(yv[i]);
          return ulp_of(t, r[i]) +
                 4 * double(cols + 2) * kU32 * (std::fabs(gv[i]) * (1 + w) + w * row_s[i / size_t(cols)]);
        };
        Tensor fast = Tensor::empty(s, t);
        const bool ok = kernels::cpu::softmax_lastdim_backward(y, gy, log, fast);
        const std::string what = tag(t, s) + (log ? " log" : "");
        if (cols <= 4096) {
          EXPECT_TRUE(ok) << "fast path declined " << what;
        }
        if (ok) {
          EXPECT_TRUE(close(fast, ref, tol)) << what;
        }
        const BackendGuard cpu(kernels::Backend::cpu);
        EXPECT_TRUE(close(kernels::softmax_lastdim_backward(y, gy, log), ref, tol)) << "dispatch " << what;
      }
}

// ---------------------------------------------------------------- matmul (dispatch cpu vs ref)

struct MatmulShape {
  int64_t m, k, n;
};

// dst = op(a) @ op(b) (+ bias) (+ dst) through kernels::matmul with the cpu backend, against
// ref::matmul. Bound: f32 accumulation over k products plus one rounding to the dst dtype.
void check_matmul(const MatmulShape& sh, DType t, bool ta, bool tb, bool bias, bool acc, bool strided_a, Generator& g,
                  bool relu = false) {
  const Shape as = ta ? Shape{sh.k, sh.m} : Shape{sh.m, sh.k};
  const Shape bs = tb ? Shape{sh.n, sh.k} : Shape{sh.k, sh.n};
  Tensor a = make(uniform(g, shape_numel(as), -2, 2), as, t);
  if (strided_a)  // same logical values, column-major storage
    a = make(uniform(g, shape_numel(as), -2, 2), {as[1], as[0]}, t).detach().transpose(0, 1);
  const Tensor b = make(uniform(g, shape_numel(bs), -2, 2), bs, t);
  const Tensor bias_t = make(uniform(g, sh.n, -1, 1), {sh.n}, t);
  const Tensor prev = make(uniform(g, sh.m * sh.n, -4, 4), {sh.m, sh.n}, t);
  kernels::MatmulOpts o;
  o.trans_a = ta;
  o.trans_b = tb;
  o.bias = bias ? &bias_t : nullptr;
  o.relu = relu;  // 1-Lipschitz: the bound below holds for relu(v) as for v
  o.accumulate = acc;
  Tensor ref = prev.clone(), fast = prev.clone(), direct = prev.clone();
  kernels::ref::matmul(a, b, ref, o);
  {
    const BackendGuard cpu(kernels::Backend::cpu);
    kernels::matmul(a, b, fast, o);
  }
  // The fast path itself must take every contiguous case (else the dispatch check is vacuous).
  const bool took = kernels::cpu::matmul(a, b, direct, o);
  if (!strided_a) {
    EXPECT_TRUE(took) << "cpu::matmul declined " << dtype_name(t);
  }
  // Sum of |terms| per output element, from the stored (rounded) inputs.
  const std::vector<double> av = a.to_vector_f64(), bv = b.to_vector_f64(), biasv = bias_t.to_vector_f64(),
                            pv = prev.to_vector_f64(), r = ref.to_vector_f64();
  std::vector<double> bound(size_t(sh.m * sh.n));
  for (int64_t i = 0; i < sh.m; ++i)
    for (int64_t j = 0; j < sh.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < sh.k; ++p) {
        const double x = ta ? av[size_t(p * sh.m + i)] : av[size_t(i * sh.k + p)];
        const double y = tb ? bv[size_t(j * sh.k + p)] : bv[size_t(p * sh.n + j)];
        s += std::fabs(x * y);
      }
      if (bias) s += std::fabs(biasv[size_t(j)]);
      if (acc) s += std::fabs(pv[size_t(i * sh.n + j)]);
      bound[size_t(i * sh.n + j)] = double(sh.k + 3) * kU32 * s;
    }
  if (took) {
    EXPECT_TRUE(close(direct, ref, [&](size_t i) { return bound[i] + ulp_of(t, r[i]); })) << "direct";
  }
  EXPECT_TRUE(close(fast, ref, [&](size_t i) { return bound[i] + ulp_of(t, r[i]); }))
      << dtype_name(t) << " m=" << sh.m << " k=" << sh.k << " n=" << sh.n << " ta=" << ta << " tb=" << tb
      << " bias=" << bias << " acc=" << acc << " strided_a=" << strided_a << " relu=" << relu;
}

TEST(Kernels, MatmulCpuBackendMatchesReference) {
  const std::vector<MatmulShape> shapes =
      kSanitized ? std::vector<MatmulShape>{{1, 1, 1}, {7, 13, 5}, {24, 70, 17}}
                 : std::vector<MatmulShape>{{1, 1, 1}, {7, 13, 5}, {33, 64, 17}, {64, 300, 48}};
  Generator g(13);
  for (DType t : kDTypes)
    for (const MatmulShape& sh : shapes)
      for (int flags = 0; flags < 16; ++flags)
        check_matmul(sh, t, flags & 1, flags & 2, flags & 4, flags & 8, false, g);
}

// The fused ReLU (linear_relu) in every dtype: f32 and bf16 as a oneDNN post-op, f16 through f32.
TEST(Kernels, MatmulReluMatchesReference) {
  Generator g(15);
  for (DType t : kDTypes)
    for (const MatmulShape& sh : {MatmulShape{7, 13, 5}, MatmulShape{33, 64, 17}})
      for (int flags = 0; flags < 4; ++flags) check_matmul(sh, t, false, true, flags & 1, flags & 2, false, g, true);
}

// Batched [B, ., .] products in every dtype: transposed operands and a batch-broadcast operand
// (stride 0 over the batch, as ops::matmul's expand gives). Bound: f32 accumulation over k
// products, from the reference run on absolute values, plus one rounding to the dtype.
TEST(Kernels, BatchedMatmulMatchesReference) {
  Generator g(16);
  const int64_t nb = 3, m = 9, k = 21, n = 7;
  for (DType t : kDTypes)
    for (int flags = 0; flags < 8; ++flags) {
      const bool ta = flags & 1, tb = flags & 2, bcast_a = flags & 4;
      const Shape as = ta ? Shape{k, m} : Shape{m, k}, bs = tb ? Shape{n, k} : Shape{k, n};
      Tensor a = bcast_a ? make(uniform(g, shape_numel(as), -2, 2), {1, as[0], as[1]}, t)
                         : make(uniform(g, nb * shape_numel(as), -2, 2), {nb, as[0], as[1]}, t);
      if (bcast_a) a = ops::expand(a, {nb, as[0], as[1]});
      const Tensor b = make(uniform(g, nb * shape_numel(bs), -2, 2), {nb, bs[0], bs[1]}, t);
      kernels::MatmulOpts o;
      o.trans_a = ta;
      o.trans_b = tb;
      Tensor fast = Tensor::empty({nb, m, n}, t), ref = Tensor::empty({nb, m, n}, t),
             mag = Tensor::empty({nb, m, n}, DType::f64);
      ASSERT_TRUE(kernels::cpu::matmul(a, b, fast, o)) << dtype_name(t) << " flags " << flags;
      kernels::ref::matmul(a, b, ref, o);
      auto absolute = [](const Tensor& x) {
        std::vector<double> v = x.to_vector_f64();
        for (double& e : v) e = std::fabs(e);
        return Tensor::from_vector(v, x.shape());
      };
      kernels::ref::matmul(absolute(a), absolute(b), mag, o);
      const std::vector<double> r = ref.to_vector_f64(), s = mag.to_vector_f64();
      EXPECT_TRUE(close(fast, ref, [&](size_t i) { return double(k + 3) * kU32 * s[i] + ulp_of(t, r[i]); }))
          << dtype_name(t) << " ta=" << ta << " tb=" << tb << " broadcast a=" << bcast_a;
    }
}

// ops::matmul's batched path end to end (broadcast batch dims, gradients through expand and the
// batched backward) on the fast backend against the reference backend, f32 and bf16.
TEST(Kernels, BatchedMatmulOpFastMatchesReference) {
  for (DType t : {DType::f32, DType::bf16}) {
    Generator g(17);
    const Tensor a0 = make(uniform(g, 2 * 1 * 6 * 8, -1, 1), {2, 1, 6, 8}, t);
    const Tensor b0 = make(uniform(g, 3 * 8 * 5, -1, 1), {3, 8, 5}, t);
    const Tensor c = make(uniform(g, 2 * 3 * 6 * 5, -1, 1), {2, 3, 6, 5}, t);
    auto run = [&](kernels::Backend backend) {
      const BackendGuard guard(backend);
      Tensor a = a0.detach().set_requires_grad(), b = b0.detach().set_requires_grad();
      Tensor y = ops::matmul(a, b);
      EXPECT_EQ(y.shape(), Shape({2, 3, 6, 5}));
      ops::sum(ops::mul(y, c)).backward();
      return std::vector<Tensor>{y, a.grad(), b.grad()};
    };
    const auto fast = run(kernels::Backend::cpu), ref = run(kernels::Backend::ref);
    // Both backends round at the same places (the product, then expand's sum over the repeated
    // batch dim); they differ by f32 vs f64 accumulation (n * n * 2^-24 for n terms in [-1, 1]),
    // by an ulp at each final rounding, and by an ulp of an intermediate partial (|partial| <= 8,
    // the 8-term products) where a rounding flips. Terms: 8 (y), 3 * 5 (a's gradient), 2 * 6 (b's).
    const std::vector<double> terms = {8, 15, 12};
    for (size_t i = 0; i < fast.size(); ++i) {
      const std::vector<double> r = ref[i].to_vector_f64();
      const double partial = i == 0 ? 0.0 : ulp_of(t, 8.0);
      EXPECT_TRUE(
          close(fast[i], ref[i], [&](size_t j) { return 2 * ulp_of(t, r[j]) + partial + terms[i] * terms[i] * kU32; }))
          << dtype_name(t) << " tensor " << i;
    }
  }
}

TEST(Kernels, MatmulStridedOperand) {
  Generator g(14);
  for (DType t : kDTypes)
    for (bool ta : {false, true}) check_matmul({9, 31, 6}, t, ta, true, true, false, true, g);
}

// The reference itself, on a product small enough to write down.
TEST(Kernels, ReferenceMatmulIsExact) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector(std::vector<float>{1, 0, -1, 2, 0.5f, 1}, {3, 2});
  const Tensor bias = Tensor::from_vector(std::vector<float>{10, 20}, {2});
  Tensor dst = Tensor::full({2, 2}, 100.0);
  kernels::MatmulOpts o;
  o.bias = &bias;
  o.accumulate = true;
  kernels::ref::matmul(a, b, dst, o);
  // [1 2 3; 4 5 6] @ [1 0; -1 2; .5 1] = [0.5 7; 2 16]
  EXPECT_EQ(dst.to_vector(), (std::vector<float>{110.5f, 127.f, 112.f, 136.f}));
}

TEST(Kernels, UlpHelper) {
  EXPECT_EQ(ulp_of(DType::f32, 1.0), 0x1p-23);
  EXPECT_EQ(ulp_of(DType::bf16, 1.5), 0x1p-7);
  EXPECT_EQ(ulp_of(DType::f16, 1000.0), 0.5);
  EXPECT_EQ(ulp_of(DType::f16, 1e-6), 0x1p-24);  // subnormal spacing
}

}  // namespace
}  // namespace mixprec
