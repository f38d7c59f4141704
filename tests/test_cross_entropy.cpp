// cross_entropy's own kernels (kernels/loss.h): on the CPU's fast path the bits of the composite
// it replaced (nll_loss of log_softmax in f32, then the cast's backward), the fast kernels against
// the f64 reference with per-element bounds in every dtype, rows longer than a block, and what
// the forward keeps. The f64 finite-difference checks of the op run through
// these kernels too (test_gradcheck.cpp, cross_entropy's cases: f64 takes them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cross_entropy_checks.h"
#include "kernel_checks.h"
#include "kernels/loss.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using kernels::Backend;
using kernels::BackendGuard;
using kernels::LossReduce;
using ops::Reduction;
using testutil::kU32;

constexpr int64_t kIgnore = -100;

struct Case {
  Shape logits;  // [..., C]
  double lo, hi;
};

// Targets in [0, C), every third one ignore_index.
Tensor targets_for(Generator& g, const Shape& logits) {
  const int64_t c = logits.back();
  const Shape lead(logits.begin(), logits.end() - 1);
  std::vector<int64_t> t(static_cast<size_t>(shape_numel(lead)));
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 3 == 2 ? kIgnore : int64_t(g.next_u64() % uint64_t(c));
  return Tensor::from_vector(t, lead);
}

Tensor logits_for(Generator& g, const Case& c, DType t) {
  return Tensor::uniform(c.logits, g, c.lo, c.hi, DType::f64).to(t).detach();
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{6, 10}, -4, 4},     // the image models' classes
      {{3, 4, 65}, -8, 8},  // the char gpt's vocabulary, [B, T, V]
      {{5, 4096}, -2, 2},   // a whole block
      {{2, 3000}, 20, 60},  // large logits: the max carries the row
      {{4096, 7}, -3, 3},   // rows enough for two threads
      {{37, 81}, -4, 4},    // the fast kernels' groups of 16 rows and a tail of 5
  };
  return c;
}

Reduction reduction_of(LossReduce r) {
  return r == LossReduce::mean ? Reduction::mean : r == LossReduce::sum ? Reduction::sum : Reduction::none;
}

// The loss and the logits' gradient through the op, for a gradient of the loss of `gy` (a scalar
// for sum and mean, the targets' shape for none).
struct LossAndGrad {
  Tensor loss, grad;
};
template <class F>
LossAndGrad run(const Tensor& logits, const Tensor& gy, F&& loss_of) {
  Tensor x = logits.clone().set_requires_grad();
  LossAndGrad r;
  r.loss = loss_of(x);
  r.loss.backward(gy);
  r.grad = x.grad();
  return r;
}

// On the fast CPU path, in each storage dtype and reduction, the op gives the loss and the
// gradient bits of what autocast ran before it had kernels of its own: the logits widened to
// f32, log_softmax, nll_loss, and the widening's backward rounding the f32 gradient once.
TEST(CrossEntropyFused, TheCpuKernelsGiveTheCompositesBits) {
  const BackendGuard cpu(Backend::cpu);
  Generator g(31);
  for (const Case& c : cases()) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (LossReduce red : {LossReduce::mean, LossReduce::sum, LossReduce::none}) {
        SCOPED_TRACE(testutil::tag(t, c.logits) + " reduction " + std::to_string(int(red)));
        const Tensor logits = logits_for(g, c, t), target = targets_for(g, c.logits);
        const Reduction r = reduction_of(red);
        const Tensor gy = red == LossReduce::none ? Tensor::uniform(target.shape(), g, 0.5, 2.0, DType::f32)
                                                  : Tensor::scalar(1.5, DType::f32);
        const LossAndGrad fused = run(logits, gy, [&](const Tensor& x) {
          const amp::Autocast ac(DType::bf16);
          return ops::cross_entropy(x, target, r, kIgnore);
        });
        const LossAndGrad composite = run(logits, gy, [&](const Tensor& x) {
          return ops::nll_loss(ops::log_softmax(x.to(DType::f32), -1), target, r, kIgnore);
        });
        EXPECT_EQ(fused.loss.dtype(), DType::f32);
        EXPECT_EQ(fused.grad.dtype(), t);
        EXPECT_TRUE(testutil::bit_equal(fused.loss, composite.loss));
        EXPECT_TRUE(testutil::bit_equal(fused.grad, composite.grad));
      }
    }
  }
}

// The fast kernels against the f64 reference, per element (cross_entropy_checks.h).
TEST(CrossEntropyFused, FastKernelsAgreeWithTheF64Reference) {
  Generator g(32);
  for (const Case& c : cases()) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (LossReduce red : {LossReduce::mean, LossReduce::none}) {
        SCOPED_TRACE(testutil::tag(t, c.logits) + " reduction " + std::to_string(int(red)));
        const Tensor logits = logits_for(g, c, t), target = targets_for(g, c.logits);
        const Tensor gy = red == LossReduce::none ? Tensor::uniform(target.shape(), g, 0.5, 2.0, DType::f32)
                                                  : Tensor::scalar(1.5, DType::f32);
        const BackendGuard cpu(Backend::cpu);
        const kernels::CrossEntropyResult got = kernels::cross_entropy_forward(logits, target, red, kIgnore);
        const Tensor got_dx = kernels::cross_entropy_backward(gy, logits, got.lse, target, red, kIgnore);
        testutil::expect_cross_entropy_near_reference(logits, target, gy, red, kIgnore, got, got_dx);
      }
    }
  }
}

// Rows longer than a block (GPT-2's vocabulary of 50304), where log_softmax's fast kernel gives way
// to the reference and cross-entropy's does not: against the reference's bounds, through the op.
TEST(CrossEntropyFused, RowsLongerThanABlock) {
  Generator g(33);
  for (DType t : {DType::f32, DType::bf16}) {
    const Case c{{3, 50304}, -6, 6};
    const Tensor logits = logits_for(g, c, t), target = targets_for(g, c.logits);
    const BackendGuard cpu(Backend::cpu);
    const kernels::CrossEntropyResult got = kernels::cross_entropy_forward(logits, target, LossReduce::mean, kIgnore);
    const Tensor gy = Tensor::scalar(1.0, DType::f32);
    const Tensor got_dx = kernels::cross_entropy_backward(gy, logits, got.lse, target, LossReduce::mean, kIgnore);
    testutil::expect_cross_entropy_near_reference(logits, target, gy, LossReduce::mean, kIgnore, got, got_dx);
    const amp::Autocast ac(DType::bf16);
    EXPECT_TRUE(testutil::bit_equal(ops::cross_entropy(logits, target, Reduction::mean, kIgnore), got.loss));
  }
}

// What the forward keeps under autocast: the 16-bit logits it was given (already held) and one f32
// per row, no f32 copy of the logits and no f32 log-probabilities.
TEST(CrossEntropyFused, TheForwardKeepsOneF32ARowBesideTheLogits) {
  const BackendGuard cpu(Backend::cpu);
  Generator g(34);
  const Case c{{64, 65}, -4, 4};
  const Tensor logits = logits_for(g, c, DType::bf16).set_requires_grad();
  const Tensor target = targets_for(g, c.logits);
  const int64_t before = allocator::stats().live_total;
  Tensor loss;
  {
    const amp::Autocast ac(DType::bf16);
    loss = ops::cross_entropy(logits, target);
  }
  const auto blocks = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };  // the CPU allocator's
  EXPECT_EQ(allocator::stats().live_total - before, blocks(64 * 4) + blocks(4)) << "lse and the scalar loss";
  loss.backward();
  EXPECT_EQ(logits.grad().dtype(), DType::bf16);
}

}  // namespace
}  // namespace mixprec
