// 16-bit products computed in f32 a block per thread (kernels/cpu/matmul_widened.h): every shape
// it takes, in bf16 and f16, on 1, 2 and 3 threads (the blocks' count follows the threads, and the
// last block is shorter), against the reference kernel's exact product rounded once; and the shapes
// it leaves to the whole-tensor road.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>

#include "conv_test_util.h"
#include "kernels/cpu/matmul_widened.h"
#include "kernels/shape.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"

namespace mixprec {
namespace {

using kernels::MatmulOpts;
using kernels::cpu::matmul_widened;
using kernels::cpu::set_matmul_widened_b;
using kernels::cpu::WidenedB;

class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) { omp_set_num_threads(n); }
  ~ThreadsGuard() { omp_set_num_threads(prev_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int prev_ = omp_get_max_threads();
};

// Sets how a product by rows holds b for a scope (every case runs both ways on every host).
class WidenedBGuard {
 public:
  explicit WidenedBGuard(WidenedB how) : prev_(set_matmul_widened_b(how)) {}
  ~WidenedBGuard() { set_matmul_widened_b(prev_); }
  WidenedBGuard(const WidenedBGuard&) = delete;
  WidenedBGuard& operator=(const WidenedBGuard&) = delete;

 private:
  WidenedB prev_;
};

struct Case {
  const char* what;
  int64_t m, k, n;
  bool trans_a = false, trans_b = false, bias = false, relu = false, accumulate = false;
  bool strided = false;    // a's rows are a slice of wider rows
  bool f32_dst = false;    // bf16 @ bf16 -> f32 (a weight gradient's product)
  bool bf16_only = false;  // a shape whose f64 reference takes seconds: f16 goes the same road
};

// Operands as op(a) @ op(b) wants them, values in [-1, 1) stored in t.
struct Operands {
  Tensor a, b, bias, dst;
};

Operands make(const Case& c, DType t, uint64_t seed) {
  Generator g(seed);
  Operands p;
  const Shape as = c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k};
  if (c.strided) {
    const Tensor wide = convtest::rand(g, {as[0], as[1] + 24}, t);
    p.a = ops::slice(wide, 1, 8, 8 + as[1]).detach();
  } else {
    p.a = convtest::rand(g, as, t);
  }
  p.b = convtest::rand(g, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, t);
  if (c.bias) p.bias = convtest::rand(g, {c.n}, t);
  p.dst = convtest::rand(g, {c.m, c.n}, c.f32_dst ? DType::f32 : t);
  return p;
}

MatmulOpts opts(const Case& c, const Operands& p) {
  MatmulOpts o;
  o.trans_a = c.trans_a, o.trans_b = c.trans_b, o.relu = c.relu, o.accumulate = c.accumulate;
  o.bias = c.bias ? &p.bias : nullptr;
  return o;
}

// The reference's exact product rounded once, and the sum of the terms' magnitudes (the
// products, the bias, the accumulated value) for the bound, both from the reference kernel in f64.
struct Expected {
  Tensor ref, abs_sum;
};

Expected expected(const Case& c, const Operands& p) {
  Expected e{p.dst.clone(), Tensor()};
  kernels::ref::matmul(p.a, p.b, e.ref, opts(c, p));
  // The magnitudes in f32 (the 16-bit values' exactly) through the default kernel, a fraction of
  // the f64 reference's time: a sum of k + 2 terms >= 0 in f32 is within about (k + 2) 2^-24 of
  // the exact one, relative, so scaling it up by twice that bounds the exact sum from above.
  const auto abs32 = [](const Tensor& x) { return convtest::abs_of(x).to(DType::f32); };
  const Tensor abs_bias = c.bias ? abs32(p.bias) : Tensor();
  MatmulOpts ao = opts(c, p);
  ao.relu = false;
  ao.bias = c.bias ? &abs_bias : nullptr;
  Tensor sum = abs32(p.dst);
  kernels::matmul(abs32(p.a), abs32(p.b), sum, ao);
  e.abs_sum = ops::mul(sum.to(DType::f64), Tensor::scalar(1.0 + double(c.k + 2) * 0x1p-23, DType::f64)).detach();
  return e;
}

TEST(MatmulWidened, EveryShapeItTakesMatchesTheReference) {
  // Blocks of 600 rows: one on one thread, two (304 + 296) on two, three (208, 208, 184) on three;
  // chunks of 2000: two on one or two threads (1008 + 992), three on three; 600 columns (b the
  // larger operand, blocks of at most 256): three (208, 208, 184) on one or three threads, four
  // (3 x 160 + 120) on two; a transposed with b not (a weight gradient's product), 200 x 800 x 600,
  // whose chunks' partials would outweigh the operands: the same columns (blocks of at most 262).
  const Case cases[] = {
      {.what = "rows", .m = 600, .k = 128, .n = 256},
      {.what = "rows, b transposed, bias, relu",
       .m = 600,
       .k = 128,
       .n = 256,
       .trans_b = true,
       .bias = true,
       .relu = true},
      {.what = "rows, accumulate", .m = 600, .k = 160, .n = 224, .accumulate = true},
      {.what = "strided rows of a", .m = 600, .k = 128, .n = 200, .strided = true},
      {.what = "rows into f32", .m = 600, .k = 128, .n = 256, .trans_b = true, .f32_dst = true},
      {.what = "chunks", .m = 64, .k = 2000, .n = 128, .trans_a = true},
      {.what = "chunks, accumulate", .m = 64, .k = 2000, .n = 128, .trans_a = true, .accumulate = true},
      {.what = "chunks into f32, strided",
       .m = 64,
       .k = 2000,
       .n = 128,
       .trans_a = true,
       .strided = true,
       .f32_dst = true},
      // 448 x 2400 x 300: a partial per chunk (7 on one thread, 8 on two, 9 on three) would
      // outweigh the operands: each thread's share of dst's columns adds every chunk itself, into
      // dst (f32) or into an f32 block of its own; shares of 160 + 140 columns on two threads,
      // 112 + 112 + 76 on three.
      {.what = "chunks into columns", .m = 448, .k = 2400, .n = 300, .trans_a = true, .bf16_only = true},
      {.what = "chunks into f32 columns, accumulate",
       .m = 448,
       .k = 2400,
       .n = 300,
       .trans_a = true,
       .accumulate = true,
       .f32_dst = true},
      {.what = "chunks into f32 columns, strided",
       .m = 448,
       .k = 2400,
       .n = 300,
       .trans_a = true,
       .strided = true,
       .f32_dst = true},
      {.what = "chunks into columns, accumulate",
       .m = 448,
       .k = 2400,
       .n = 300,
       .trans_a = true,
       .accumulate = true,
       .bf16_only = true},
      {.what = "columns", .m = 16, .k = 1024, .n = 600},
      {.what = "columns, b transposed, bias, relu",
       .m = 16,
       .k = 1024,
       .n = 600,
       .trans_b = true,
       .bias = true,
       .relu = true},
      {.what = "columns, accumulate", .m = 16, .k = 1024, .n = 600, .accumulate = true},
      {.what = "columns into f32, a transposed and strided",
       .m = 200,
       .k = 800,
       .n = 600,
       .trans_a = true,
       .strided = true,
       .f32_dst = true},
      {.what = "columns into f32, accumulate",
       .m = 200,
       .k = 800,
       .n = 600,
       .trans_a = true,
       .accumulate = true,
       .f32_dst = true},
      {.what = "columns, both transposed, accumulate",
       .m = 16,
       .k = 1024,
       .n = 600,
       .trans_a = true,
       .trans_b = true,
       .accumulate = true},
  };
  for (DType t : {DType::bf16, DType::f16})
    for (const Case& c : cases) {
      if (c.f32_dst && t == DType::f16) continue;  // f16 products keep f16's range (matmul.cpp)
      if (c.bf16_only && t == DType::f16) continue;
      const Operands p = make(c, t, 11);
      const Expected e = expected(c, p);
      // Blocks of rows with b not transposed hold b as given or as [n, k] (the host's rule picks
      // one): both, on every host.
      const bool rows_of_b = !c.trans_a && !c.trans_b && c.n <= c.m;
      for (WidenedB how : {WidenedB::given, WidenedB::rows}) {
        if (how == WidenedB::rows && !rows_of_b) continue;
        const WidenedBGuard b_guard(how);
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(c.what) + " " + std::string(dtype_name(t)) + " on " + std::to_string(threads) +
                       " threads" + (how == WidenedB::rows ? ", b as [n, k]" : ""));
          const ThreadsGuard guard(threads);
          Tensor fast = p.dst.clone();
          ASSERT_TRUE(matmul_widened(p.a, p.b, fast, opts(c, p)));
          // One rounding to dst's dtype of an f32 accumulation: (k + 16) * 2^-24 * the terms'
          // magnitudes (16 covers the partial sums of a weight gradient's chunks).
          EXPECT_TRUE(convtest::close_accumulated(fast, e.ref, e.abs_sum, double(c.k + 16), c.what));
        }
      }
    }
}

// The same call twice on one thread count gives the same bits (a fixed order of blocks and
// partial sums, whichever thread runs which).
TEST(MatmulWidened, RepeatsBitForBit) {
  for (const Case& c :
       {Case{.what = "rows", .m = 600, .k = 128, .n = 256},
        Case{.what = "chunks", .m = 64, .k = 2000, .n = 128, .trans_a = true},
        Case{.what = "chunks into columns", .m = 448, .k = 2400, .n = 300, .trans_a = true},
        Case{.what = "chunks into f32 columns", .m = 512, .k = 1500, .n = 300, .trans_a = true, .f32_dst = true},
        Case{.what = "columns", .m = 16, .k = 1024, .n = 600}}) {
    const Operands p = make(c, DType::bf16, 5);
    Tensor first = p.dst.clone(), second = p.dst.clone();
    ASSERT_TRUE(matmul_widened(p.a, p.b, first, opts(c, p)));
    ASSERT_TRUE(matmul_widened(p.a, p.b, second, opts(c, p)));
    EXPECT_EQ(first.to_vector_f64(), second.to_vector_f64()) << c.what;
  }
}

// What it declines (nothing written) goes the whole-tensor road, whose values the kernel tests hold.
TEST(MatmulWidened, LeavesOtherShapesToTheWholeTensorRoad) {
  const Case big{.what = "big", .m = 512, .k = 256, .n = 256};
  const Operands p = make(big, DType::bf16, 3);
  const auto declines = [](const Tensor& a, const Tensor& b, Tensor dst, const MatmulOpts& o) {
    const std::vector<double> before = dst.to_vector_f64();
    const bool took = matmul_widened(a, b, dst, o);
    return !took && dst.to_vector_f64() == before;
  };
  Tensor d32 = Tensor::zeros({512, 256}, DType::f32);
  EXPECT_TRUE(declines(kernels::cast(p.a, DType::f32), kernels::cast(p.b, DType::f32), d32, {})) << "f32 operands";
  Generator g(1);
  const Tensor small_a = convtest::rand(g, {64, 64}, DType::bf16), small_b = convtest::rand(g, {64, 64}, DType::bf16);
  EXPECT_TRUE(declines(small_a, small_b, Tensor::zeros({64, 64}, DType::bf16), {})) << "under 2^22 flops";
  const Tensor a3 = convtest::rand(g, {2, 512, 256}, DType::bf16), b3 = convtest::rand(g, {2, 256, 256}, DType::bf16);
  EXPECT_TRUE(declines(a3, b3, Tensor::zeros({2, 512, 256}, DType::bf16), {})) << "rank 3";
  // a transposed by its strides (columns of unit stride, not rows) without trans_a
  const Tensor at = ops::transpose(convtest::rand(g, {256, 512}, DType::bf16), 0, 1).detach();
  EXPECT_TRUE(declines(at, p.b, Tensor::zeros({512, 256}, DType::bf16), {})) << "a's rows not contiguous";
  // A weight gradient with a bias or b transposed (where b is not the larger operand, which goes
  // by columns), or whose partial sums would outweigh its operands.
  const Tensor ga = convtest::rand(g, {3000, 160}, DType::bf16), gb = convtest::rand(g, {3000, 96}, DType::bf16);
  const Tensor bias = convtest::rand(g, {96}, DType::bf16);
  EXPECT_TRUE(declines(ga, gb, Tensor::zeros({160, 96}, DType::bf16), {.trans_a = true, .bias = &bias}))
      << "chunks with a bias";
  const Tensor gbt = convtest::rand(g, {96, 3000}, DType::bf16);
  EXPECT_TRUE(declines(ga, gbt, Tensor::zeros({160, 96}, DType::bf16), {.trans_a = true, .trans_b = true}))
      << "chunks with b transposed";
  // A weight gradient whose partials per chunk would outweigh its operands, and whose buffers by
  // columns would not be under half of them: the whole-tensor road is as small and faster.
  const Tensor sa = convtest::rand(g, {300, 512}, DType::bf16), sb = convtest::rand(g, {300, 512}, DType::bf16);
  EXPECT_TRUE(declines(sa, sb, Tensor::zeros({512, 512}, DType::bf16), {.trans_a = true}))
      << "partials would outweigh the operands, columns would hold as much";
  // b the larger operand but strided along its columns (a transpose's view), and too few rows for
  // blocks of rows.
  const Tensor bt = ops::transpose(convtest::rand(g, {1200, 448}, DType::bf16), 0, 1).detach();
  const Tensor ca = convtest::rand(g, {16, 448}, DType::bf16);
  EXPECT_TRUE(declines(ca, bt, Tensor::zeros({16, 1200}, DType::bf16), {})) << "b not of unit column stride, m < 32";
}

}  // namespace
}  // namespace mixprec
