// Learning-rate schedules against their formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "mixprec/error.h"
#include "mixprec/schedule.h"

using namespace mixprec;

TEST(Schedule, CosineAnnealsToZero) {
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 0.4});
  optim::LrSchedule s(opt, "cosine", 100);
  EXPECT_DOUBLE_EQ(s.apply(0), 0.4);
  EXPECT_DOUBLE_EQ(opt.lr(), 0.4);
  EXPECT_NEAR(s.apply(50), 0.2, 1e-12);
  EXPECT_NEAR(s.apply(25), 0.2 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_NEAR(s.apply(99), 0.2 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-12);
  EXPECT_GT(opt.lr(), 0.0);
}

TEST(Schedule, WarmupThenConstant) {
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 1.0});
  optim::LrSchedule s(opt, "constant", 10, 3);
  EXPECT_DOUBLE_EQ(s.apply(0), 0.25);
  EXPECT_DOUBLE_EQ(s.apply(2), 0.75);
  EXPECT_DOUBLE_EQ(s.apply(3), 1.0);
  EXPECT_DOUBLE_EQ(s.apply(9), 1.0);
}

TEST(Schedule, RejectsBadArguments) {
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 1.0});
  EXPECT_THROW(optim::LrSchedule(opt, "linear", 10), Error);
  EXPECT_THROW(optim::LrSchedule(opt, "cosine", 0), Error);
  EXPECT_THROW(optim::LrSchedule(opt, "cosine", 10, 10), Error);
}

// nanoGPT's get_lr (its train.py), restated: the recipe of `train --model gpt`.
static double nanogpt_lr(int64_t it, double lr, double min_lr, int64_t warmup, int64_t steps) {
  if (it < warmup) return lr * double(it + 1) / double(warmup + 1);
  const double ratio = double(it - warmup) / double(steps - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (lr - min_lr);
}

TEST(Schedule, WarmupThenCosineToAMinimumAsNanoGpt) {
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  Tensor q = Tensor::zeros({2}).set_requires_grad();
  // Two groups with their own base lrs; the minimum is one value for both.
  optim::AdamW opt({{{p}, {.lr = 1e-3}}, {{q}, {.lr = 2e-3}}}, {});
  optim::LrSchedule s(opt, "cosine", 2000, 100, 1e-4);
  EXPECT_DOUBLE_EQ(s.apply(0), 1e-3 / 101);
  EXPECT_DOUBLE_EQ(opt.lr(1), 2e-3 / 101);
  EXPECT_DOUBLE_EQ(s.apply(99), 1e-3 * 100 / 101);
  EXPECT_DOUBLE_EQ(s.apply(100), 1e-3);  // the peak, right after warm-up
  for (const int64_t it : {0, 1, 50, 99, 100, 101, 500, 1050, 1999}) {
    s.apply(it);
    EXPECT_NEAR(opt.lr(0), nanogpt_lr(it, 1e-3, 1e-4, 100, 2000), 1e-18) << it;
    EXPECT_NEAR(opt.lr(1), nanogpt_lr(it, 2e-3, 1e-4, 100, 2000), 1e-18) << it;
  }
  EXPECT_NEAR(s.apply(1050), 0.5 * (1e-3 + 1e-4), 1e-18);  // half way down
  // The last step is one step short of the minimum, as nanoGPT's with lr_decay_iters = steps.
  EXPECT_GT(s.apply(1999), 1e-4);
  EXPECT_LT(s.apply(1999), 1e-4 + 1e-9);
}

TEST(Schedule, ZeroMinimumRoundsAsBefore) {
  // The image models' runs keep their bits: min 0 gives base * 0.5 * (1 + cos) exactly.
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 0.0037});
  optim::LrSchedule s(opt, "cosine", 977, 13);
  for (int64_t it = 13; it < 977; it += 7)
    EXPECT_EQ(s.apply(it), 0.0037 * 0.5 * (1.0 + std::cos(std::numbers::pi * double(it - 13) / 964.0))) << it;
}

TEST(Schedule, RejectsABadMinimum) {
  Tensor p = Tensor::zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 1e-3});
  EXPECT_THROW(optim::LrSchedule(opt, "cosine", 10, 0, -1e-4), Error);
  EXPECT_THROW(optim::LrSchedule(opt, "cosine", 10, 0, 2e-3), Error);
}
