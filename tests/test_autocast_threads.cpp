// Autocast across threads: each thread's guard, dtype and weight-cast cache are its own while the
// threads share f32 parameters, and concurrent forward/backward passes give each thread the result
// it gets alone. scripts/dev.sh test also runs these under ThreadSanitizer (with the loader tests).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <latch>
#include <thread>
#include <vector>

#include "autocast/autocast_state.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

// Deterministic values without a generator: a repeating ramp around 0.
Tensor ramp(const Shape& shape, double step) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(step * double(i % 7 - 3));
  return Tensor::from_vector(v, shape);
}

// Runs fn(i) on `n` threads at once and joins them.
template <typename Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (std::thread& t : threads) t.join();
}

// bf16, f16, and a thread without autocast (f32), twice each.
DType mode_of(int thread) {
  const DType modes[] = {DType::bf16, DType::f16, DType::f32};
  return modes[thread % 3];
}

TEST(AutocastThreads, EachThreadHasItsOwnGuardAndCache) {
  const Tensor w = ramp({6, 8}, 0.05).set_requires_grad(), b = ramp({6}, 0.1).set_requires_grad();
  const Tensor x = ramp({4, 8}, 0.02);
  constexpr int kThreads = 6;
  struct Seen {
    DType out_before = DType::f64, out_after = DType::f64;  // linear's output dtype, before/after the rendezvous
    bool enabled_inside = false, enabled_after = true;
    DType dtype_inside = DType::f64;
    size_t cache_inside = 99, cache_after = 99;
  };
  std::vector<Seen> seen(kThreads);
  std::latch all_inside(kThreads);  // every thread holds its guard at the same time
  on_threads(kThreads, [&](int i) {
    const DType mode = mode_of(i);
    Seen& s = seen[size_t(i)];
    {
      amp::Autocast ac(mode == DType::f32 ? DType::bf16 : mode, /*enabled=*/mode != DType::f32);
      s.out_before = ops::linear(x, w, b).dtype();
      all_inside.arrive_and_wait();
      s.enabled_inside = amp::is_autocast_enabled();
      s.dtype_inside = amp::autocast_dtype();
      s.out_after = ops::linear(x, w, b).dtype();
      s.cache_inside = amp::autocast_cache_size();
    }
    s.enabled_after = amp::is_autocast_enabled();
    s.cache_after = amp::autocast_cache_size();
  });
  for (int i = 0; i < kThreads; ++i) {
    const DType mode = mode_of(i);
    const Seen& s = seen[size_t(i)];
    const bool on = mode != DType::f32;
    EXPECT_EQ(s.out_before, mode) << "thread " << i;
    EXPECT_EQ(s.out_after, mode) << "thread " << i;
    EXPECT_EQ(s.enabled_inside, on) << "thread " << i;
    if (on) {
      EXPECT_EQ(s.dtype_inside, mode) << "thread " << i;
    }
    EXPECT_EQ(s.cache_inside, on ? 2u : 0u) << "thread " << i;  // its own casts of w and b, not the others'
    EXPECT_FALSE(s.enabled_after) << "thread " << i;
    EXPECT_EQ(s.cache_after, 0u) << "thread " << i;
  }
  EXPECT_FALSE(amp::is_autocast_enabled());  // this thread never entered a guard
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
}

// A forward and backward pass under each thread's autocast, on its own copy of the parameters.
struct Grads {
  DType w_grad_dtype = DType::f64;
  std::vector<float> w_grad, b_grad;
  double loss = 0;
};
Grads train_once(DType mode) {
  Tensor w = ramp({6, 8}, 0.05).set_requires_grad(), b = ramp({6}, 0.1).set_requires_grad();
  const Tensor x = ramp({4, 8}, 0.02);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 5}, {4});
  Tensor loss;
  {
    amp::Autocast ac(mode == DType::f32 ? DType::bf16 : mode, /*enabled=*/mode != DType::f32);
    loss = ops::cross_entropy(ops::linear(ops::relu(ops::linear(x, w, b)), w.slice(1, 0, 6)), y);
  }
  loss.backward();
  return {w.grad().dtype(), w.grad().to_vector(), b.grad().to_vector(), loss.item()};
}

TEST(AutocastThreads, ConcurrentTrainingStepsMatchTheSameStepAlone) {
  constexpr int kThreads = 6, kRepeats = 3;
  // Alone: one thread at a time (each on a fresh thread, so OpenMP's settings are the same).
  std::vector<Grads> alone(3);
  for (int m = 0; m < 3; ++m) std::thread([&, m] { alone[size_t(m)] = train_once(mode_of(m)); }).join();
  std::vector<std::vector<Grads>> together(kThreads);
  on_threads(kThreads, [&](int i) {
    for (int r = 0; r < kRepeats; ++r) together[size_t(i)].push_back(train_once(mode_of(i)));
  });
  for (int i = 0; i < kThreads; ++i) {
    const Grads& want = alone[size_t(i % 3)];
    EXPECT_EQ(want.w_grad_dtype, DType::f32);  // f32 parameters get f32 gradients through the casts
    for (const Grads& got : together[size_t(i)]) {
      EXPECT_EQ(got.w_grad_dtype, want.w_grad_dtype) << "thread " << i;
      EXPECT_EQ(got.loss, want.loss) << "thread " << i;
      EXPECT_EQ(got.w_grad, want.w_grad) << "thread " << i;
      EXPECT_EQ(got.b_grad, want.b_grad) << "thread " << i;
    }
  }
  // The modes differ, so a thread that ran in another's dtype would have shown above.
  EXPECT_NE(alone[0].w_grad, alone[1].w_grad);
  EXPECT_NE(alone[0].w_grad, alone[2].w_grad);
}

// Threads that share parameters record ops on the same leaves and run backward into them at once:
// each leaf gets one AccumulateGrad (made under a lock) and takes every thread's gradient, so the
// sum is the one-thread gradient times the number of threads. ThreadSanitizer sees the rest.
TEST(AutocastThreads, ConcurrentBackwardIntoSharedLeavesSumsEveryThreadsGradient) {
  Tensor w = ramp({6, 8}, 0.05).set_requires_grad(), b = ramp({6}, 0.1).set_requires_grad();
  const Tensor x = ramp({4, 8}, 0.02);
  auto step = [&] { ops::sum(ops::relu(ops::linear(x, w, b))).backward(); };
  step();
  const std::vector<float> one_w = w.grad().to_vector(), one_b = b.grad().to_vector();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  constexpr int kThreads = 4, kRepeats = 8;
  on_threads(kThreads, [&](int) {
    for (int r = 0; r < kRepeats; ++r) step();
  });
  const std::vector<float> all_w = w.grad().to_vector(), all_b = b.grad().to_vector();
  const float n = kThreads * kRepeats;
  for (size_t i = 0; i < one_w.size(); ++i)  // sums of 32 equal terms: exact up to the f32 rounding of each add
    EXPECT_NEAR(all_w[i], n * one_w[i], 32 * 0x1p-24 * n * std::abs(one_w[i])) << "w.grad[" << i << "]";
  for (size_t i = 0; i < one_b.size(); ++i)
    EXPECT_NEAR(all_b[i], n * one_b[i], 32 * 0x1p-24 * n * std::abs(one_b[i])) << "b.grad[" << i << "]";
}

}  // namespace
}  // namespace mixprec
