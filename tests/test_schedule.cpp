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
