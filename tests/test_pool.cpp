// Pooling: f64 gradient checks (max with padding/stride/dilation/ceil mode/overlap, avg with
// both divisor rules, adaptive with uneven windows), known values, the fast path against the
// reference in f32/bf16/f16, the argmax storage, and shape errors.
#include <gtest/gtest.h>

#include <string>

#include "autograd/nodes.h"
#include "conv_test_util.h"
#include "gradcheck.h"
#include "mixprec/allocator.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;
using ops::Pool2dOptions;

// Distinct values, so max pooling has no ties and finite differences stay on one side of the
// argmax (a tie makes max non-differentiable).
Tensor distinct(Generator& g, const Shape& s) {
  const int64_t n = shape_numel(s);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i) * 0.37;
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[size_t(i)], v[size_t(g.next_u64() % uint64_t(i + 1))]);
  return Tensor::from_vector(v, s, DType::f64).set_requires_grad();
}

struct PoolCase {
  std::string name;
  Shape x;
  ops::IntPair k;
  Pool2dOptions o;
};

TEST(PoolGradcheck, MaxPool) {
  const std::vector<PoolCase> cases = {
      {"2x2", {2, 3, 6, 6}, 2, {}},
      {"3x3_stride1_overlap", {1, 2, 5, 5}, 3, {.stride = 1}},
      {"3x3_stride2_pad1", {1, 2, 7, 6}, 3, {.stride = 2, .padding = 1}},
      {"dilation2", {1, 2, 7, 7}, 2, {.stride = 1, .dilation = 2}},
      {"ceil_mode", {1, 2, 7, 7}, 2, {.ceil_mode = true}},
      {"rect_2x3", {1, 1, 6, 9}, {2, 3}, {.stride = {1, 2}}},
      {"unbatched", {2, 4, 4}, 2, {}},
  };
  for (const PoolCase& c : cases) {
    Generator g(1);
    EXPECT_TRUE(testing::gradcheck("max_pool2d/" + c.name,
                                   [&](const std::vector<Tensor>& x) { return ops::max_pool2d(x[0], c.k, c.o); },
                                   {distinct(g, c.x)}));
  }
}

// After a ReLU the pool's backward reads the ReLU's saved output instead of an argmax
// (PoolFromInput below): the same cases through that path. Values i*0.37 - 0.9 (shuffled): none
// at the ReLU's kink, some below it.
TEST(PoolGradcheck, MaxPoolAfterRelu) {
  const std::vector<PoolCase> cases = {
      {"2x2", {2, 3, 6, 6}, 2, {}},
      {"3x3_stride1_overlap", {1, 2, 5, 5}, 3, {.stride = 1}},
      {"3x3_stride2_pad1", {1, 2, 7, 6}, 3, {.stride = 2, .padding = 1}},
      {"dilation2_ceil", {1, 2, 7, 7}, 2, {.stride = 2, .dilation = 2, .ceil_mode = true}},
  };
  for (const PoolCase& c : cases) {
    Generator g(4);
    const Tensor x = distinct(g, c.x);
    std::vector<double> v = x.to_vector_f64();
    for (double& e : v) e -= 0.9;
    EXPECT_TRUE(
        testing::gradcheck("relu/max_pool2d/" + c.name,
                           [&](const std::vector<Tensor>& in) { return ops::max_pool2d(ops::relu(in[0]), c.k, c.o); },
                           {Tensor::from_vector(v, c.x, DType::f64).set_requires_grad()}));
  }
}

TEST(PoolGradcheck, AvgPool) {
  const std::vector<PoolCase> cases = {
      {"2x2", {2, 3, 6, 6}, 2, {}},
      {"3x3_pad1_include", {1, 2, 5, 5}, 3, {.stride = 2, .padding = 1}},
      {"3x3_pad1_exclude", {1, 2, 5, 5}, 3, {.stride = 2, .padding = 1, .count_include_pad = false}},
      {"ceil_mode", {1, 2, 7, 6}, 3, {.stride = 2, .padding = 1, .ceil_mode = true}},
      {"overlap", {1, 1, 6, 6}, 3, {.stride = 1}},
  };
  for (const PoolCase& c : cases) {
    Generator g(2);
    EXPECT_TRUE(testing::gradcheck("avg_pool2d/" + c.name,
                                   [&](const std::vector<Tensor>& x) { return ops::avg_pool2d(x[0], c.k, c.o); },
                                   {Tensor::uniform(c.x, g, -1, 1, DType::f64).set_requires_grad()}));
  }
}

TEST(PoolGradcheck, AdaptiveAvgPool) {
  for (const auto& [in, out] : std::vector<std::pair<Shape, ops::IntPair>>{
           {{2, 3, 7, 7}, 3}, {{1, 2, 5, 8}, {2, 3}}, {{1, 2, 4, 4}, 1}, {{1, 1, 3, 3}, 5}}) {
    Generator g(3);
    EXPECT_TRUE(testing::gradcheck("adaptive_avg_pool2d",
                                   [&](const std::vector<Tensor>& x) { return ops::adaptive_avg_pool2d(x[0], out); },
                                   {Tensor::uniform(in, g, -1, 1, DType::f64).set_requires_grad()}));
  }
}

TEST(Pool, KnownValues) {
  // 4x4 ramp 0..15.
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[size_t(i)] = float(i);
  const Tensor x = Tensor::from_vector(v, {1, 1, 4, 4});
  EXPECT_EQ(ops::max_pool2d(x, 2).to_vector(), (std::vector<float>{5, 7, 13, 15}));
  EXPECT_EQ(ops::avg_pool2d(x, 2).to_vector(), (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));
  // 3x3 window, stride 2, padding 1: corner window covers 4 real pixels (0,1,4,5) of 9.
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1}).to_vector()[0], 10.f / 9.f);
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1, .count_include_pad = false}).to_vector()[0], 2.5f);
  // Ceil mode, 4 -> 2 windows of 3 with stride 2: rows/cols [0,3) and [2,4).
  EXPECT_EQ(ops::max_pool2d(x, 3, {.stride = 2, .ceil_mode = true}).to_vector(), (std::vector<float>{10, 11, 14, 15}));
  // Its avg divisor: the last window is clipped to the input (not counted past it): (10+11+14+15)/4.
  EXPECT_FLOAT_EQ(ops::avg_pool2d(x, 3, {.stride = 2, .ceil_mode = true}).to_vector()[3], 12.5f);
  // Adaptive 4 -> 3: windows [0,2), [1,3), [2,4).
  EXPECT_FLOAT_EQ(ops::adaptive_avg_pool2d(x, 3).to_vector()[0], 2.5f);
  EXPECT_FLOAT_EQ(ops::adaptive_avg_pool2d(x, 1).to_vector()[0], 7.5f);
}

TEST(Pool, MaxPropagatesNaNAndKeepsArgmaxInOneByte) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, NAN, 3, 4}, {1, 1, 2, 2}).set_requires_grad();
  Tensor y = ops::max_pool2d(x, 2);
  EXPECT_TRUE(std::isnan(y.item()));
  const kernels::MaxPoolResult r = kernels::max_pool2d_forward(
      Tensor::zeros({1, 1, 4, 4}),
      {.n = 1, .c = 1, .h = 4, .w = 4, .oh = 2, .ow = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2});
  EXPECT_EQ(r.argmax.dtype(), DType::u8);
}

// ---- the fast path against the reference ----

struct FastRun {
  Tensor y, gx;
};
template <class F>
FastRun pool_run(const Tensor& x, const Tensor& gy, kernels::Backend be, F&& f) {
  BackendGuard guard(be);
  Tensor xl = x.clone().set_requires_grad();
  FastRun r;
  r.y = f(xl);
  r.y.backward(gy);
  r.gx = xl.grad();
  return r;
}

TEST(PoolFast, MatchesReferenceInEveryDType) {
  using Fn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> fns = {
      {"max2x2", [](const Tensor& x) { return ops::max_pool2d(x, 2); }},
      // 13 x 11 in ceil mode: the last row and column of windows hang over the edge (one tap or
      // two missing), which the 2x2 vector kernel must leave to the plane kernels.
      {"max2x2_ceil", [](const Tensor& x) { return ops::max_pool2d(x, 2, {.ceil_mode = true}); }},
      {"max3x3s2p1", [](const Tensor& x) { return ops::max_pool2d(x, 3, {.stride = 2, .padding = 1}); }},
      {"max_dil_ceil",
       [](const Tensor& x) { return ops::max_pool2d(x, 2, {.stride = 2, .dilation = 2, .ceil_mode = true}); }},
      {"max3x3s1", [](const Tensor& x) { return ops::max_pool2d(x, 3, {.stride = 1}); }},
      {"avg2x2", [](const Tensor& x) { return ops::avg_pool2d(x, 2); }},
      {"avg3x3s2p1_excl",
       [](const Tensor& x) { return ops::avg_pool2d(x, 3, {.stride = 2, .padding = 1, .count_include_pad = false}); }},
      {"avg3x3s1", [](const Tensor& x) { return ops::avg_pool2d(x, 3, {.stride = 1, .ceil_mode = true}); }},
      {"adaptive3",
       [](const Tensor& x) {
         return ops::adaptive_avg_pool2d(x, {3, 4});
       }},
  };
  // 13 x 11: odd sizes, inputs no 2x2 window reaches. Even heights: the 2x2 kernels walk the rows
  // of all planes as one run, in blocks of 64 (14 x 14 as the nets' second pool: 70 rows; 12 x 9:
  // 126 rows, an odd last column).
  const std::vector<Shape> shapes = {{3, 5, 13, 11}, {2, 5, 14, 14}, {3, 7, 12, 9}};
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [name, f] : fns)
      for (const Shape& xs : shapes) {
        SCOPED_TRACE(name + " " + std::string(dtype_name(t)) + " " + shape_str(xs));
        Generator g(8);
        const Tensor x = convtest::rand(g, xs, t);
        Shape ys;
        {
          BackendGuard ref(kernels::Backend::ref);
          ys = f(x).shape();
        }
        const Tensor gy = convtest::rand(g, ys, t);
        const FastRun ref = pool_run(x, gy, kernels::Backend::ref, f), fast = pool_run(x, gy, kernels::Backend::cpu, f);
        // Max is exact; averages and gradient sums over overlapping windows accumulate at most 16
        // f32 terms, each at most max|input|.
        auto bound = [t](const Tensor& expect, const Tensor& in) {
          double mx = 0;
          for (double v : in.to_vector_f64()) mx = std::max(mx, std::fabs(v));
          const std::vector<double> r = expect.to_vector_f64();
          return [r, t, mx](size_t i) { return convtest::ulp_of(t, r[i]) + 16 * 16 * convtest::kU32 * mx; };
        };
        EXPECT_TRUE(convtest::close(fast.y, ref.y, bound(ref.y, x), "forward"));
        EXPECT_TRUE(convtest::close(fast.gx, ref.gx, bound(ref.gx, gy), "backward"));
      }
  }
}

TEST(PoolFast, MaxPool2x2TiesAndNaNsPickWhatTheReferencePicks) {
  // Rows of 40 -> 20 outputs: 16 through the vector kernel and a tail of 4 through the scalar one.
  // Values from {0, 1, 2, NaN} make ties and NaNs common; the gradient shows which input won.
  // 7 rows: an odd last row, each plane a run; 16 rows: 288 output rows of 17 in one run of all
  // planes, 4 blocks of 64 and one of 32, in parallel. f16 runs the vector kernels with AVX-512
  // only (elsewhere the plane path).
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (const Shape& xs : {Shape{2, 3, 7, 40}, Shape{4, 9, 16, 34}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_str(xs));
      Generator g(21);
      std::vector<float> v(size_t(xs[0] * xs[1] * xs[2] * xs[3]));
      for (float& x : v) {
        const uint64_t r = g.next_u64() % 8;
        x = r == 7 ? NAN : float(r % 3);
      }
      const Tensor x = Tensor::from_vector(v, xs, t);
      const Tensor gy = convtest::rand(g, {xs[0], xs[1], xs[2] / 2, xs[3] / 2}, t);
      auto f = [](const Tensor& in) { return ops::max_pool2d(in, 2); };
      const FastRun ref = pool_run(x, gy, kernels::Backend::ref, f), fast = pool_run(x, gy, kernels::Backend::cpu, f);
      EXPECT_TRUE(convtest::close(
          fast.y, ref.y, [](size_t) { return 0.0; }, "forward"));
      EXPECT_TRUE(convtest::close(
          fast.gx, ref.gx, [](size_t) { return 0.0; }, "backward"));
    }
}

// ---- the input read again instead of an argmax ----

kernels::PoolGeometry max_geometry(const Shape& x, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  kernels::PoolGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kh = g.kw = k, g.stride_h = g.stride_w = stride, g.pad_h = g.pad_w = pad, g.dil_h = g.dil_w = dil;
  g.oh = (g.h + 2 * pad - dil * (k - 1) - 1) / stride + 1;
  g.ow = (g.w + 2 * pad - dil * (k - 1) - 1) / stride + 1;
  return g;
}

// g in ceil mode (pad 0): one more window where the floor drops a partial one.
kernels::PoolGeometry ceil_geometry(kernels::PoolGeometry g) {
  g.oh = (g.h - g.kh + g.stride_h - 1) / g.stride_h + 1;
  g.ow = (g.w - g.kw + g.stride_w - 1) / g.stride_w + 1;
  return g;
}

// kernels::max_pool2d_backward_from_input finds the winners the forward found: its gradient is
// the argmax form's bit for bit, on both CPU backends and in every dtype, through the 2x2 vector
// kernel (rows of 40 inputs: 16 outputs and a tail of 4; an odd last row no window reaches), the
// 2x2 in ceil mode (41 columns: the last windows hang over the edge), overlapping, padded and
// dilated windows, and a window of 289 taps (i64 argmax). Values from {-1, 0, 1, 2, NaN}: ties and
// NaNs common.
// (Where windows overlap the backends' sums round differently: PoolFast bounds that.)
TEST(PoolFromInput, BackwardEqualsTheArgmaxFormBitForBit) {
  const std::vector<std::pair<std::string, kernels::PoolGeometry>> cases = {
      {"2x2", max_geometry({2, 3, 7, 40}, 2, 2, 0, 1)},
      {"2x2even", max_geometry({8, 16, 14, 14}, 2, 2, 0, 1)},  // one run of 896 rows, in parallel
      {"2x2even_oddw", max_geometry({3, 7, 12, 9}, 2, 2, 0, 1)},
      {"3x3s1", max_geometry({1, 2, 9, 11}, 3, 1, 0, 1)},
      {"3x3s2p1", max_geometry({1, 2, 7, 6}, 3, 2, 1, 1)},
      {"2x2d2", max_geometry({1, 2, 7, 7}, 2, 1, 0, 2)},
      {"17x17", max_geometry({1, 2, 17, 18}, 17, 1, 0, 1)},
      {"2x2ceil", ceil_geometry(max_geometry({2, 3, 7, 41}, 2, 2, 0, 1))},
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const auto& [name, g] : cases) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(t)));
      Generator gen(31);
      std::vector<double> v(size_t(g.n * g.c * g.h * g.w));
      for (double& e : v) {
        const uint64_t r = gen.next_u64() % 9;
        e = r == 8 ? NAN : double(r % 4) - 1.0;
      }
      const Tensor x = Tensor::from_vector(v, {g.n, g.c, g.h, g.w}, t);
      const Tensor gy = convtest::rand(gen, {g.n, g.c, g.oh, g.ow}, t);
      std::vector<double> first;
      for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
        const kernels::BackendGuard guard(be);
        const kernels::MaxPoolResult r = kernels::max_pool2d_forward(x, g);
        EXPECT_EQ(r.argmax.dtype(), g.kh * g.kw > 256 ? DType::i64 : DType::u8);
        const std::vector<double> want = kernels::max_pool2d_backward(gy, r.argmax, g).to_vector_f64();
        const std::vector<double> got = kernels::max_pool2d_backward_from_input(gy, x, g).to_vector_f64();
        EXPECT_EQ(got, want) << (be == kernels::Backend::cpu ? "cpu" : "ref");
        // Without overlap every input gets at most one term: the backends agree exactly too.
        if (first.empty()) {
          first = got;
        } else if (name == "2x2" || name == "2x2ceil" || name == "2x2even" || name == "2x2even_oddw") {
          EXPECT_EQ(got, first) << "the fast kernel against the reference";
        }
      }
    }
  }
}

// Live activation bytes a forward leaves (outputs and what backward keeps), inputs made before.
template <class F>
int64_t held_by(F&& forward) {
  const MemoryScope act(MemCategory::activations);
  const int64_t before = allocator::stats().live_bytes[size_t(MemCategory::activations)];
  const Tensor y = forward();
  return allocator::stats().live_bytes[size_t(MemCategory::activations)] - before;
}

// After a ReLU, whose backward keeps its output anyway, max_pool2d keeps no argmax: the forward
// leaves the ReLU's output and the pool's and nothing else. On a leaf (nobody keeps the input) the
// argmax, two bits an output, is kept. The gradient is the argmax form's, through the ReLU's mask.
TEST(PoolFromInput, AfterAReluTheForwardKeepsNoArgmax) {
  for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(be == kernels::Backend::cpu ? "cpu " : "ref ") + std::string(dtype_name(t)));
      const kernels::BackendGuard guard(be);
      Generator gen(5);
      const Shape xs{2, 4, 8, 16}, ys{2, 4, 4, 8};  // 1024 and 256 elements: whole 64-byte blocks
      const int64_t es = int64_t(dtype_size(t));
      Tensor x, gy;
      {
        const MemoryScope data(MemCategory::data);
        x = convtest::rand(gen, xs, t).set_requires_grad();
        gy = convtest::rand(gen, ys, t);
      }
      Tensor a, y;
      EXPECT_EQ(held_by([&] {
                  a = ops::relu(x);
                  y = ops::max_pool2d(a, 2);
                  return y;
                }),
                (1024 + 256) * es);
      EXPECT_TRUE(autograd::kept_by_grad_fn(a));
      y.backward(gy);

      Tensor leaf = a.detach().clone().set_requires_grad();
      Tensor y_leaf;
      EXPECT_EQ(held_by([&] { return y_leaf = ops::max_pool2d(leaf, 2); }), 256 * es + 256 / 4);
      y_leaf.backward(gy);
      EXPECT_EQ(y.to_vector_f64(), y_leaf.to_vector_f64());
      const std::vector<double> av = a.to_vector_f64(), gl = leaf.grad().to_vector_f64();
      std::vector<double> want(av.size());
      for (size_t i = 0; i < av.size(); ++i) want[i] = av[i] > 0 ? gl[i] : 0.0;
      EXPECT_EQ(x.grad().to_vector_f64(), want);
    }
  }
}

// What counts as kept: a ReLU's output and a fused conv-ReLU's, at the version they were saved;
// not a leaf, not an addition's output (its backward keeps nothing), not a ReLU output written
// in place since (the pool then keeps its argmax, and the ReLU's backward refuses as before).
TEST(PoolFromInput, KeptMeansSavedByTheProducerAtThisVersion) {
  Generator gen(6);
  const Tensor x = convtest::rand(gen, {1, 2, 6, 6}, DType::f32).set_requires_grad();
  const Tensor w = convtest::rand(gen, {3, 2, 3, 3}, DType::f32).set_requires_grad();
  EXPECT_FALSE(autograd::kept_by_grad_fn(x));
  EXPECT_TRUE(autograd::kept_by_grad_fn(ops::relu(x)));
  EXPECT_TRUE(autograd::kept_by_grad_fn(ops::conv2d(x, w, Tensor(), {.padding = 1, .relu = true})));
  EXPECT_FALSE(autograd::kept_by_grad_fn(ops::conv2d(x, w, Tensor(), {.padding = 1})));
  EXPECT_FALSE(autograd::kept_by_grad_fn(ops::add(x, x)));
  Tensor a = ops::relu(x);
  {
    const autograd::NoGradGuard no_grad;
    a.fill_(1.0);
  }
  EXPECT_FALSE(autograd::kept_by_grad_fn(a));
  {
    const autograd::NoGradGuard no_grad;
    EXPECT_FALSE(autograd::kept_by_grad_fn(ops::relu(x))) << "no graph, nothing kept";
  }
}

// ---- the argmax in two bits ----

// Windows of up to 4 taps keep their argmax in two bits an output. Known bytes; the reference and
// the fast kernels give the same bytes and the same taps back, at sizes with 0-3 taps in the
// last byte and one large enough for two threads; the reference refuses a tap of 4.
TEST(PoolArgmax2bit, PacksAndUnpacksTheSameOnBothBackends) {
  const std::vector<uint8_t> known{1, 2, 3, 0, 2};
  const Tensor known_t = Tensor::from_vector(std::vector<double>(known.begin(), known.end()), {5}, DType::u8);
  for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
    const BackendGuard guard(be);
    const Tensor packed = kernels::pack_argmax_2bit(known_t);
    EXPECT_EQ(packed.to_vector_i64(), (std::vector<int64_t>{0x39, 0x02}));
    EXPECT_EQ(kernels::unpack_argmax_2bit(packed, {5}).to_vector_i64(), known_t.to_vector_i64());
  }
  Generator gen(11);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), int64_t(4), int64_t(6), int64_t(255), (int64_t(1) << 23) + 7}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<double> taps(static_cast<size_t>(n));
    for (double& t : taps) t = double(gen.next_u64() % 4);
    const Shape shape = n % 2 == 0 && n > 0 ? Shape{2, n / 2} : Shape{n};
    const Tensor argmax = Tensor::from_vector(taps, shape, DType::u8);
    Tensor want;
    {
      const BackendGuard ref(kernels::Backend::ref);
      want = kernels::pack_argmax_2bit(argmax);
      EXPECT_EQ(kernels::unpack_argmax_2bit(want, shape).to_vector_i64(), argmax.to_vector_i64());
    }
    const BackendGuard cpu(kernels::Backend::cpu);
    const Tensor got = kernels::pack_argmax_2bit(argmax);
    EXPECT_EQ(got.shape(), (Shape{(n + 3) / 4}));
    EXPECT_EQ(got.to_vector_i64(), want.to_vector_i64());
    const Tensor back = kernels::unpack_argmax_2bit(got, shape);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(back.to_vector_i64(), argmax.to_vector_i64());
  }
  const BackendGuard ref(kernels::Backend::ref);
  EXPECT_THROW(kernels::pack_argmax_2bit(Tensor::from_vector(std::vector<double>{0, 4}, {2}, DType::u8)), Error);
}

// Through the op: a 2x2 pool on a leaf keeps a quarter byte an output, a 3x3 one a byte, and the
// packed form's gradient is the kernels' from the unpacked argmax, in every dtype on both backends.
TEST(PoolArgmax2bit, TheOpKeepsAQuarterByteAnOutputAndTheSameGradient) {
  for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      SCOPED_TRACE(std::string(be == kernels::Backend::cpu ? "cpu " : "ref ") + std::string(dtype_name(t)));
      const BackendGuard guard(be);
      Generator gen(12);
      for (const PoolCase& c :
           {PoolCase{"2x2", {2, 4, 16, 32}, 2, {}}, PoolCase{"2x2_ceil_odd", {1, 3, 7, 9}, 2, {.ceil_mode = true}},
            PoolCase{"3x3", {2, 3, 8, 12}, 3, {}}}) {
        SCOPED_TRACE(c.name);
        Tensor x = convtest::rand(gen, c.x, t).set_requires_grad();
        const auto [g, outputs] = [&] {
          const Tensor y = ops::max_pool2d(x.detach(), c.k, c.o);
          kernels::PoolGeometry pg;
          pg.n = c.x[0], pg.c = c.x[1], pg.h = c.x[2], pg.w = c.x[3], pg.oh = y.size(2), pg.ow = y.size(3);
          pg.kh = c.k.h, pg.kw = c.k.w, pg.stride_h = c.k.h, pg.stride_w = c.k.w;
          return std::pair{pg, y.numel()};
        }();
        const int64_t es = int64_t(dtype_size(t));
        const int64_t argmax_bytes = g.argmax_fits_two_bits() ? (outputs + 3) / 4 : outputs;
        EXPECT_EQ(argmax_bytes, c.name == "3x3" ? outputs : (outputs + 3) / 4);
        Tensor y;
        const auto blocks = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };  // the CPU allocator's
        EXPECT_EQ(held_by([&] { return y = ops::max_pool2d(x, c.k, c.o); }),
                  blocks(outputs * es) + blocks(argmax_bytes));
        const Tensor gy = convtest::rand(gen, y.shape(), t);
        y.backward(gy);
        const kernels::MaxPoolResult r = kernels::max_pool2d_forward(kernels::contig(x.detach()), g);
        EXPECT_EQ(x.grad().to_vector_f64(), kernels::max_pool2d_backward(gy, r.argmax, g).to_vector_f64());
      }
    }
  }
}

TEST(PoolErrors, KernelLargerThanInputNamesLayerAndShapes) {
  nn::MaxPool2d pool(5);
  try {
    pool(Tensor::zeros({1, 2, 3, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MaxPool2d(kernel_size=5"), std::string::npos) << m;
    EXPECT_NE(m.find("[1, 2, 3, 3]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::max_pool2d(Tensor::zeros({1, 1, 4, 4}), 2, {.padding = 2}), Error);  // pad > kernel/2
  EXPECT_THROW(ops::avg_pool2d(Tensor::zeros({1, 1, 4, 4}), 2, {.dilation = 2}), Error);
  EXPECT_THROW(ops::adaptive_avg_pool2d(Tensor::zeros({1, 1, 4, 4}), 0), Error);
  EXPECT_THROW(ops::max_pool2d(Tensor::zeros({4, 4}), 2), Error);
}

TEST(PoolModules, NamesAsPyTorchPrintsThem) {
  EXPECT_EQ(nn::MaxPool2d(2).name(), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  EXPECT_EQ(nn::AvgPool2d(3, {.stride = 2, .padding = 1}).name(), "AvgPool2d(kernel_size=3, stride=2, padding=1)");
  EXPECT_EQ(nn::AdaptiveAvgPool2d(1).name(), "AdaptiveAvgPool2d(output_size=1)");
}

}  // namespace
}  // namespace mixprec
