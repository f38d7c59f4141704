// The backward engine: deep chains, gradient accumulation, shared inputs, second-backward errors,
// no-grad mode, where gradient bytes are counted, and that graphs free everything they hold.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "mixprec/allocator.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"

namespace mixprec {
namespace {

int64_t live(MemCategory c) { return allocator::stats().live_bytes[static_cast<size_t>(c)]; }
int64_t live_total() { return allocator::stats().live_total; }
int64_t rounded(size_t bytes) { return int64_t((bytes + 63) / 64 * 64); }

TEST(Autograd, TenThousandOpChainIsIterativeAndExact) {
  constexpr int kDepth = 10000;
  const int64_t start = live_total();
  {
    Tensor x = Tensor::from_vector(std::vector<double>{1.0, -2.0, 0.5}, {3}).set_requires_grad();
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = ops::affine(y, 1.0001, 0.0);
    ops::sum(y).backward();
    const double expect = std::pow(1.0001, kDepth);  // ~e
    for (double g : x.grad().to_vector_f64()) EXPECT_NEAR(g, expect, 1e-10 * expect);
    const auto yv = y.to_vector_f64();
    EXPECT_NEAR(yv[1], -2.0 * expect, 1e-10 * expect);
  }
  EXPECT_EQ(live_total(), start);  // dropping the 10,000-node graph freed every tensor
}

TEST(Autograd, GradientAccumulatesAcrossBackwardCalls) {
  for (DType t : {DType::f64, DType::f32}) {
    Tensor w = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, t).set_requires_grad();
    const Tensor c = Tensor::from_vector(std::vector<double>{0.5, -1, 2, 3, -0.25, 1}, {2, 3}, t);
    ops::sum(ops::mul(w, c)).backward();
    EXPECT_EQ(w.grad().to_vector_f64(), c.to_vector_f64());
    EXPECT_EQ(w.grad().dtype(), t);
    ops::sum(ops::mul(ops::mul(w, c), Tensor::scalar(2.0, t))).backward();  // adds 2c
    std::vector<double> three_c = c.to_vector_f64();
    for (double& v : three_c) v *= 3;
    EXPECT_EQ(w.grad().to_vector_f64(), three_c) << dtype_name(t);
  }
}

TEST(Autograd, TensorUsedTwiceGetsBothContributions) {
  Tensor x = Tensor::from_vector(std::vector<double>{1.5, -2, 3}, {3}).set_requires_grad();
  ops::sum(ops::mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector_f64(), (std::vector<double>{3, -4, 6}));

  // Two branches that meet: d/dx sum(exp(x) + 3x) = exp(x) + 3.
  Tensor z = Tensor::from_vector(std::vector<double>{0.0, 1.0}, {2}).set_requires_grad();
  ops::sum(ops::add(ops::exp(z), ops::affine(z, 3.0))).backward();
  const auto g = z.grad().to_vector_f64();
  EXPECT_DOUBLE_EQ(g[0], 4.0);
  EXPECT_DOUBLE_EQ(g[1], std::exp(1.0) + 3.0);

  // The same intermediate consumed by three ops.
  Tensor a = Tensor::from_vector(std::vector<double>{2.0}, {1}).set_requires_grad();
  Tensor h = ops::affine(a, 2.0);                    // 2a
  ops::sum(ops::add(ops::mul(h, h), h)).backward();  // 4a^2 + 2a -> 8a + 2
  EXPECT_DOUBLE_EQ(a.grad().item(), 18.0);
}

TEST(Autograd, BackwardTwiceThroughTheSameGraphThrows) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2}, {2}).set_requires_grad();
  Tensor loss = ops::sum(ops::mul(x, x));
  loss.backward();
  try {
    loss.backward();
    FAIL() << "second backward did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
  // A fresh graph over the same leaf still works.
  ops::sum(x).backward();
  EXPECT_EQ(x.grad().to_vector_f64(), (std::vector<double>{3, 5}));
}

TEST(Autograd, SeveralRootsAtOnce) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3}).set_requires_grad();
  Tensor h = ops::affine(x, 2.0);          // 2x
  Tensor loss = ops::sum(ops::mul(h, h));  // 4 x.x
  // h is a root and also inside loss's graph: dh = gh + 2h, dx = 2 dh.
  const Tensor gh = Tensor::from_vector(std::vector<double>{1, 0, -1}, {3});
  autograd::backward({h, loss}, {gh, Tensor::scalar(1.0, DType::f64)});
  EXPECT_EQ(x.grad().to_vector_f64(), (std::vector<double>{2 * (1 + 4), 2 * (0 + 8), 2 * (-1 + 12)}));

  // The same root twice: both gradients count, as in PyTorch.
  Tensor z = Tensor::from_vector(std::vector<double>{1, 2}, {2}).set_requires_grad();
  Tensor y = ops::affine(z, 3.0);
  autograd::backward({y, y}, {Tensor::ones({2}, DType::f64), Tensor::full({2}, 2.0, DType::f64)});
  EXPECT_EQ(z.grad().to_vector_f64(), (std::vector<double>{9, 9}));
}

TEST(Autograd, BackwardOfANonScalarNeedsAGradient) {
  Tensor x = Tensor::ones({3}, DType::f64).set_requires_grad();
  Tensor y = ops::affine(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  EXPECT_THROW(y.backward(Tensor::ones({4}, DType::f64)), Error);
  EXPECT_THROW(Tensor::ones({1}).backward(), Error);  // nothing requires grad
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = Tensor::ones({2, 2}, DType::f64).set_requires_grad();
  {
    autograd::NoGradGuard guard;
    EXPECT_FALSE(autograd::grad_enabled());
    Tensor y = ops::exp(ops::mul(x, x));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_TRUE(y.is_leaf());
    {
      autograd::EnableGradGuard on;
      EXPECT_TRUE(ops::mul(x, x).requires_grad());
    }
    EXPECT_FALSE(ops::neg(x).requires_grad());
  }
  EXPECT_TRUE(autograd::grad_enabled());
  Tensor z = ops::mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  ASSERT_NE(z.grad_fn(), nullptr);
  EXPECT_EQ(z.grad_fn()->name, "mul");
}

TEST(Autograd, LeafGradientBytesCountAsGradients) {
  Tensor w = Tensor::ones({64, 64}).set_requires_grad();  // 16 KiB f32
  Tensor x = Tensor::full({64, 64}, 0.5);
  const int64_t grads0 = live(MemCategory::gradients), temps0 = live(MemCategory::temporaries);
  ops::sum(ops::mul(w, x)).backward();  // the gradient buffer is made in backward, then moved
  EXPECT_EQ(live(MemCategory::gradients) - grads0, rounded(w.nbytes()));
  EXPECT_EQ(live(MemCategory::temporaries), temps0);
  EXPECT_EQ(w.grad().storage()->category(), MemCategory::gradients);
  EXPECT_EQ(w.grad().to_vector()[100], 0.5f);

  // A gradient the caller still holds is copied, and the copy counts as gradients too.
  Tensor v = Tensor::ones({32, 32}).set_requires_grad();
  const Tensor seed = Tensor::full({32, 32}, 2.0);
  const int64_t grads1 = live(MemCategory::gradients);
  v.backward(seed);
  EXPECT_EQ(live(MemCategory::gradients) - grads1, rounded(v.nbytes()));
  EXPECT_FALSE(v.grad().storage() == seed.storage());

  w = Tensor();
  v = Tensor();
  EXPECT_EQ(live(MemCategory::gradients), grads0);
}

TEST(Autograd, BackwardReleasesSavedActivations) {
  Generator g(1);
  Tensor w = Tensor::randn({256, 256}, g).set_requires_grad();
  Tensor loss;
  int64_t before_backward = 0;
  const int64_t act0 = live(MemCategory::activations);
  {
    Tensor x = Tensor::randn({128, 256}, g);
    Tensor h = ops::gelu(ops::linear(x, w));
    loss = ops::mean(ops::mul(h, h));
    before_backward = live(MemCategory::activations);
  }
  EXPECT_GT(before_backward - act0, 3 * 128 * 256 * 4);  // x, linear out, gelu out are saved
  loss.backward();
  EXPECT_LE(live(MemCategory::activations) - act0, 1024) << "saved tensors outlived backward";
}

// affine and neg need nothing from the forward: a chain of them must not keep its inputs alive.
TEST(Autograd, ScaleChainSavesNoActivations) {
  Tensor x = Tensor::ones({256, 256}).set_requires_grad();  // 256 KiB
  const int64_t act0 = live(MemCategory::activations);
  Tensor y = x;
  for (int i = 0; i < 8; ++i) y = ops::neg(ops::affine(y, 0.5, 1.0));
  EXPECT_EQ(live(MemCategory::activations) - act0, rounded(y.nbytes())) << "intermediates kept alive";
  ops::sum(y).backward();
  EXPECT_FLOAT_EQ(x.grad().to_vector()[0], std::pow(0.5f, 8.0f));
}

// Builds a graph through every op family with inputs that require grad.
Tensor every_op_loss(const Tensor& w, const Tensor& b, const Tensor& x, const Tensor& target, Generator& g) {
  Tensor h = ops::linear(x, w, b);  // [8, 32] @ [16, 32]^T: [8, 16]
  h = ops::gelu(ops::relu(ops::affine(h, 1.5, 0.1)), true);
  h = ops::dropout(h, 0.2, true, &g);
  Tensor s = ops::softmax(h, 0);
  Tensor t = ops::transpose(ops::reshape(h, {16, 8}), 0, 1);  // [8, 16] strided
  t = ops::slice(ops::contiguous(t), 1, 2, 12);               // [8, 10]
  Tensor u = ops::matmul(t, ops::slice(w, 0, 0, 10));         // [8, 10] @ [10, 32]
  Tensor logits = ops::div(ops::sub(u, ops::mean(u, {0}, true)), ops::sqrt(ops::exp(ops::affine(u, 0.1))));
  Tensor ce = ops::cross_entropy(ops::cast(ops::cast(logits, DType::f32), DType::f64), target);
  Tensor mse = ops::mse_loss(ops::pow(ops::log(ops::add(ops::exp(s), s)), 2.0), ops::neg(s.detach()));
  return ops::add(ops::add(ce, mse), ops::sum(ops::log_softmax(logits, -1), {1}).slice(0, 0, 1).reshape({}));
}

TEST(Autograd, NoLeakAfterBackwardOrWithout) {
  const int64_t start = live_total();
  Generator g(5);
  for (bool run_backward : {true, false}) {
    {
      Tensor w = Tensor::randn({16, 32}, g, DType::f64, 0.2).set_requires_grad();
      Tensor b = Tensor::randn({16}, g, DType::f64).set_requires_grad();
      Tensor x = Tensor::randn({8, 32}, g, DType::f64);
      Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
      Tensor loss = every_op_loss(w, b, x, target, g);
      ASSERT_TRUE(loss.requires_grad());
      if (run_backward) {
        loss.backward();
        ASSERT_TRUE(w.grad().defined());
        ASSERT_TRUE(b.grad().defined());
      }
    }
    EXPECT_EQ(live_total(), start) << (run_backward ? "after backward" : "graph dropped without backward");
  }
}

TEST(Autograd, AnomalyModeNamesTheOp) {
  autograd::set_anomaly_enabled(true);
  Tensor x = Tensor::from_vector(std::vector<double>{1.0, -1.0}, {2}).set_requires_grad();
  try {
    ops::log(x);
    ADD_FAILURE() << "no anomaly reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log"), std::string::npos) << e.what();
  }
  autograd::set_anomaly_enabled(false);
  EXPECT_NO_THROW(ops::log(x));
}

}  // namespace
}  // namespace mixprec

namespace mixprec {
namespace {

// In-place writes to a tensor that a node saved for backward are refused at backward, naming the
// op, wherever the write came from (the tensor, a view of it, an optimizer step); writes to
// tensors no node saved, and writes after backward, are fine.
TEST(Autograd, InPlaceWriteToASavedTensorIsRefused) {
  Generator g(3);
  auto expect_refused = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << "no error for " << op;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("backward of " + op), std::string::npos) << msg;
      EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
    }
  };
  {  // mul saves both operands; write through a detached view of one
    Tensor a = Tensor::randn({4}, g).set_requires_grad(), b = Tensor::randn({4}, g).set_requires_grad();
    Tensor y = ops::sum(ops::mul(a, b));
    b.detach().copy_(Tensor::ones({4}));
    expect_refused([&] { y.backward(); }, "mul");
  }
  {  // an optimizer step between the forward and the backward of a linear layer
    Tensor w = Tensor::randn({3, 4}, g).set_requires_grad();
    Tensor y = ops::sum(ops::linear(Tensor::randn({2, 4}, g), w));
    w.set_grad(Tensor::ones({3, 4}));
    optim::SGD({w}, {.lr = 0.1}).step();
    expect_refused([&] { y.backward(); }, "linear");
  }
  {  // the output of relu (what its backward reads) written in place
    Tensor x = Tensor::randn({5}, g).set_requires_grad();
    Tensor r = ops::relu(x);
    Tensor y = ops::sum(r);
    r.fill_(1.0);
    expect_refused([&] { y.backward(); }, "relu");
  }
  {  // add saves nothing: writing an input afterwards is allowed
    Tensor a = Tensor::randn({4}, g).set_requires_grad(), b = Tensor::randn({4}, g).set_requires_grad();
    Tensor y = ops::sum(ops::add(a, b));
    a.detach().fill_(2.0);
    ASSERT_NO_THROW(y.backward());
    EXPECT_EQ(a.grad().to_vector(), std::vector<float>(4, 1.0f));
  }
  {  // a write after backward is none of backward's business
    Tensor a = Tensor::randn({4}, g).set_requires_grad(), b = Tensor::randn({4}, g).set_requires_grad();
    Tensor y = ops::sum(ops::mul(a, b));
    const std::vector<float> bv = b.to_vector();
    ASSERT_NO_THROW(y.backward());
    b.detach().fill_(0.0);
    EXPECT_EQ(a.grad().to_vector(), bv);
  }
}

}  // namespace
}  // namespace mixprec

namespace mixprec {
namespace {

// register_post_accumulate_grad_hook: once per backward pass and leaf, after the gradient (summed
// over every use of the leaf) is in leaf.grad(); in reverse order of use; removable.
TEST(Autograd, PostAccumulateGradHookSeesTheFinalGradient) {
  Tensor w1 = Tensor::from_vector(std::vector<double>{1, 2}, {2}).set_requires_grad();
  Tensor w2 = Tensor::from_vector(std::vector<double>{3, 4}, {2}).set_requires_grad();
  std::vector<std::string> order;
  std::vector<double> seen;
  const uint64_t id1 = autograd::register_post_accumulate_grad_hook(w1, [&](const Tensor& leaf) {
    order.push_back("w1");
    seen = leaf.grad().to_vector_f64();
  });
  autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor&) { order.push_back("w2"); });
  // w1 used twice (summed into one gradient, one hook call); w2 is used last, so reached first.
  Tensor h = ops::add(ops::mul(w1, w1.detach()), w1);
  ops::sum(ops::mul(h, w2)).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"w2", "w1"}));
  // d/dw1 of sum((w1*c + w1) * w2) with c = w1's values: (c + 1) * w2 = (2*3, 3*4)
  EXPECT_EQ(seen, (std::vector<double>{6, 12}));
  autograd::remove_post_accumulate_grad_hook(w1, id1);
  order.clear();
  ops::sum(ops::mul(w1, w2)).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"w2"}));
  Tensor not_leaf = ops::mul(w1, w2);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(not_leaf, [](const Tensor&) {}), Error);
}

}  // namespace
}  // namespace mixprec
