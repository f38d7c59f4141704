// Smoke test: a tiny linear model's forward and backward through the whole stack.
#include <gtest/gtest.h>

#include "mixprec/autograd.h"
#include "mixprec/ops.h"

using namespace mixprec;

TEST(Smoke, LinearBackward) {
  Generator gen(1);
  Tensor x = Tensor::randn({4, 3}, gen);
  Tensor w = Tensor::randn({2, 3}, gen).set_requires_grad();
  Tensor b = Tensor::zeros({2}).set_requires_grad();
  Tensor y = ops::linear(x, w, b);
  Tensor loss = ops::sum(ops::mul(y, y));
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  // d/dw sum((xw^T+b)^2) = 2 * y^T x
  auto yv = y.to_vector(), xv = x.to_vector(), gw = w.grad().to_vector();
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 3; ++i) {
      double s = 0;
      for (int n = 0; n < 4; ++n) s += 2 * yv[n * 2 + o] * xv[n * 3 + i];
      EXPECT_NEAR(gw[o * 3 + i], s, 1e-4);
    }
}
