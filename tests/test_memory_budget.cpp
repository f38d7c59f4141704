// The largest batch under a memory budget (find_largest_batch): the search on steps of known size,
// and what an OutOfMemory half way through a real AMP step (forward, backward, unscale, optimizer
// step) leaves behind: nothing, so the next, smaller attempt runs.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autocast/autocast_state.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/clip.h"
#include "mixprec/error.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/memory_budget.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"

namespace mixprec {
namespace {

constexpr int64_t kBlock = int64_t(100) << 10;  // 100 KiB per sample: a multiple of the 64-byte rounding

int64_t live() { return allocator::stats().live_total; }

// Restores "no budget" however the test exits.
struct BudgetGuard {
  ~BudgetGuard() { allocator::set_budget(0); }
};

TEST(MemoryBudget, DoublesThenBisectsToTheLargestBatch) {
  allocator::empty_cache();
  const int64_t live0 = live();
  int64_t calls = 0;
  auto step = [&](int64_t b) {
    ++calls;
    Tensor t = Tensor::empty({b * kBlock / 4});  // b samples of 100 KiB, f32
  };
  const BatchFit fit = find_largest_batch(step, live0 + 37 * kBlock + kBlock / 2, 1000);
  EXPECT_EQ(fit.batch, 37);
  EXPECT_EQ(fit.smallest_failed, 38);
  // 1, 2, 4, 8, 16, 32 fit, 64 does not; then 48, 40 fail, 36 fits, 38 fails, 37 fits.
  EXPECT_EQ(fit.attempts, 12);
  EXPECT_EQ(calls, 12);
  EXPECT_EQ(fit.stats.peak_total, live0 + 37 * kBlock);  // the answer's own peak, not the largest seen
  EXPECT_EQ(fit.stats.at_peak_bytes[size_t(MemCategory::activations)] -
                allocator::stats().live_bytes[size_t(MemCategory::activations)],
            37 * kBlock);
  // Every step, in order, with what it asked for; a refused one with the allocator's message.
  const std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37};
  ASSERT_EQ(fit.trials.size(), batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const BatchTrial& t = fit.trials[i];
    EXPECT_EQ(t.batch, batches[i]);
    EXPECT_EQ(t.fitted, t.batch <= 37) << t.batch;
    EXPECT_EQ(t.refusal.empty(), t.fitted) << t.batch;
    if (t.fitted) {
      EXPECT_EQ(t.peak_total, live0 + t.batch * kBlock) << t.batch;
    } else {
      EXPECT_NE(t.refusal.find("out of memory"), std::string::npos) << t.refusal;
    }
    EXPECT_GE(t.peak_reserved_bytes, t.peak_total) << t.batch;
  }
  EXPECT_EQ(live(), live0);
  EXPECT_EQ(allocator::stats().budget_bytes, 0);  // the budget before the search is back
}

TEST(MemoryBudget, StopsAtMaxBatchAndReportsNothingThatDoesNotFit) {
  BudgetGuard guard;
  allocator::set_budget(int64_t(1) << 40);  // a budget already in force is restored afterwards
  auto step = [](int64_t b) { Tensor t = Tensor::empty({b * kBlock / 4}); };
  const BatchFit capped = find_largest_batch(step, live() + 1000 * kBlock, 20);
  EXPECT_EQ(capped.batch, 20);
  EXPECT_EQ(capped.smallest_failed, 0);
  EXPECT_EQ(capped.attempts, 6);  // 1, 2, 4, 8, 16, 20
  EXPECT_EQ(allocator::stats().budget_bytes, int64_t(1) << 40);

  const BatchFit none = find_largest_batch(step, live() + kBlock / 2, 20);
  EXPECT_EQ(none.batch, 0);
  EXPECT_EQ(none.smallest_failed, 1);
  EXPECT_EQ(none.attempts, 1);
}

TEST(MemoryBudget, StateTheFirstStepCreatesCountsAgainstEveryBatch) {
  allocator::empty_cache();
  const int64_t live0 = live();
  Tensor state;  // made by the first step and kept, as an optimizer's moments
  auto step = [&](int64_t b) {
    Tensor t = Tensor::empty({b * kBlock / 4});
    if (!state.defined()) state = Tensor::zeros({10 * kBlock / 4});
  };
  // Without the state 30 samples would fit; with its 10 blocks held, 20.
  const BatchFit fit = find_largest_batch(step, live0 + 30 * kBlock, 1000);
  EXPECT_EQ(fit.batch, 20);
  EXPECT_EQ(fit.stats.peak_total, live0 + 30 * kBlock);
  // The first size runs twice (the state appeared); then 2..16 fit, 32 fails, 24, 20 | 22, 21 fail.
  EXPECT_EQ(fit.attempts, 11);
}

TEST(MemoryBudget, RefusesBadArgumentsAndPassesOtherErrorsOn) {
  auto step = [](int64_t) {};
  EXPECT_THROW(find_largest_batch(step, 0, 10), Error);
  EXPECT_THROW(find_largest_batch(step, 1 << 20, 0), Error);
  EXPECT_THROW(find_largest_batch(nullptr, 1 << 20, 10), Error);
  auto bad = [](int64_t b) {
    if (b > 2) throw std::runtime_error("not memory");
  };
  EXPECT_THROW(find_largest_batch(bad, live() + (int64_t(1) << 30), 10), std::runtime_error);
  EXPECT_EQ(allocator::stats().budget_bytes, 0);
}

// ---- an OutOfMemory inside a real step ----

// PyTorch's AMP loop on an MLP in f16 with dynamic loss scaling, unscale_ and clipping, and the
// recovery a loop that tries again does: drop the gradients, forget the scaler's iteration.
struct AmpLoop {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  amp::GradScaler scaler;

  AmpLoop() {
    default_generator().manual_seed(3);
    model = std::make_shared<nn::Sequential>(nn::Linear(64, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(),
                                             nn::Linear(256, 10));
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-3});
  }
  static std::pair<Tensor, Tensor> batch(int64_t b) {
    MemoryScope scope(MemCategory::data);
    Generator g(static_cast<uint64_t>(b));
    std::vector<int64_t> labels(static_cast<size_t>(b));
    for (auto& l : labels) l = int64_t(g.uniform_below(10));
    return {Tensor::randn({b, 64}, g), Tensor::from_vector(labels, {b})};
  }
  Tensor forward(const Tensor& x, const Tensor& y) {
    amp::Autocast ac(DType::f16);
    return ops::cross_entropy((*model)(x), y);
  }
  void finish() {  // unscale, clip, step, update
    scaler.unscale_(*opt);
    nn::clip_grad_norm_(opt->params(), 1.0);
    scaler.step(*opt);
    scaler.update();
  }
  void step(int64_t b) {
    const auto [x, y] = batch(b);
    try {
      opt->zero_grad();
      scaler.scale(forward(x, y)).backward();
      finish();
    } catch (const OutOfMemory&) {
      opt->zero_grad();
      scaler.reset_iteration();
      throw;
    }
  }
};

TEST(MemoryBudget, OutOfMemoryInBackwardLeavesNothingBehind) {
  BudgetGuard guard;
  AmpLoop loop;
  loop.step(64);  // the optimizer's moments exist from here on, as in any step but the first
  loop.opt->zero_grad();
  allocator::empty_cache();
  const int64_t live0 = live();
  {
    const auto [x, y] = AmpLoop::batch(256);
    loop.opt->zero_grad();
    Tensor loss = loop.forward(x, y);
    const int64_t after_forward = live();
    allocator::reset_peak();
    loop.scaler.scale(loss).backward();
    const int64_t backward_needs = allocator::stats().peak_total - after_forward;
    loop.opt->zero_grad();
    loss = loop.forward(x, y);
    ASSERT_EQ(live(), after_forward);
    allocator::set_budget(after_forward + backward_needs / 2);  // backward stops half way
    EXPECT_THROW(loop.scaler.scale(loss).backward(), OutOfMemory);
    int64_t grads = 0;
    for (const Tensor& p : loop.opt->params()) grads += p.grad().defined();
    EXPECT_GT(grads, 0) << "the budget should have stopped backward after some gradients were made";
    EXPECT_LT(grads, int64_t(loop.opt->params().size()));
    loop.opt->zero_grad();
    loop.scaler.reset_iteration();
  }                               // the loss and its graph go here
  EXPECT_EQ(live(), live0 - 64);  // less the last step's found_inf (0-d, 64 bytes): reset_iteration drops it
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
  // The next, smaller attempt runs under the same budget, the whole loop.
  EXPECT_NO_THROW(loop.step(32));
  EXPECT_TRUE(loop.scaler.stepped(*loop.opt));
}

TEST(MemoryBudget, OutOfMemoryInTheOptimizerStepLeavesNothingBehind) {
  BudgetGuard guard;
  AmpLoop loop;
  allocator::empty_cache();
  const int64_t live0 = live();
  {
    const auto [x, y] = AmpLoop::batch(128);
    loop.opt->zero_grad();
    loop.scaler.scale(loop.forward(x, y)).backward();
    loop.scaler.unscale_(*loop.opt);  // the f16 gradients become f32 ones
    nn::clip_grad_norm_(loop.opt->params(), 1.0);
    // The first step makes the moments (2 x 4 bytes per parameter): not a byte of them fits.
    allocator::set_budget(live() + 64);
    EXPECT_THROW(loop.scaler.step(*loop.opt), OutOfMemory);
    allocator::set_budget(0);
    EXPECT_EQ(loop.opt->steps(), 0);
    loop.opt->zero_grad();
    loop.scaler.reset_iteration();
  }
  EXPECT_EQ(live(), live0);
  EXPECT_EQ(loop.scaler.num_skipped_steps(), 0);
  // Unscaled, the optimizer failed: without reset_iteration the next unscale_ would be refused as
  // a second one; with it the loop goes on, and the step is the optimizer's first.
  EXPECT_NO_THROW(loop.step(32));
  EXPECT_EQ(loop.opt->steps(), 1);
}

TEST(MemoryBudget, OutOfMemoryInForwardUnderAutocastLeavesNothingBehind) {
  BudgetGuard guard;
  AmpLoop loop;
  loop.step(16);
  loop.opt->zero_grad();
  allocator::empty_cache();
  const int64_t live0 = live();
  {
    const auto [x, y] = AmpLoop::batch(512);
    loop.opt->zero_grad();
    allocator::set_budget(live() + (int64_t(1) << 18));  // the f16 weight copies fit, the activations not
    EXPECT_THROW(loop.forward(x, y), OutOfMemory);
  }
  EXPECT_FALSE(amp::is_autocast_enabled());
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
  EXPECT_EQ(live(), live0);
}

TEST(MemoryBudget, FindsTheLargestBatchOfARealStep) {
  AmpLoop loop;
  loop.step(8);
  allocator::empty_cache();
  const int64_t budget = live() + (int64_t(1) << 20);
  const BatchFit fit = find_largest_batch([&](int64_t b) { loop.step(b); }, budget, 1 << 16);
  ASSERT_GT(fit.batch, 64);
  ASSERT_EQ(fit.smallest_failed, fit.batch + 1);
  EXPECT_LE(fit.stats.peak_total, budget);
  EXPECT_GT(fit.stats.at_peak_bytes[size_t(MemCategory::data)], 0);
  // The answer holds when asked again: the next size does not fit, the answer does.
  BudgetGuard guard;
  allocator::set_budget(budget);
  EXPECT_THROW(loop.step(fit.batch + 1), OutOfMemory);
  EXPECT_NO_THROW(loop.step(fit.batch));
  EXPECT_TRUE(loop.scaler.stepped(*loop.opt));
}

// ---- the budget is honest: what the allocator counts is what the process holds ----

// A field of /proc/self/status in bytes (VmRSS: resident now, VmHWM: the resident peak); -1 if the
// kernel does not say.
int64_t status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;  // "kB"
  return -1;
}

// The growth of the process's resident set over one large training step, from an empty allocator
// cache and a trimmed heap, against the growth of what the allocator counts (live + cached, the
// bytes a budget refuses beyond). Anything a kernel allocates around the allocator (a std::vector of
// partial results, a library's own buffer) shows as resident growth the count lacks.
struct ResidentGrowth {
  int64_t counted = 0, resident = 0;
};
ResidentGrowth measure_step(DType autocast_dtype) {
  // About 185 MB at the peak in f32, 143 in bf16 (batch 64, 2 threads): a wide first convolution
  // (1 MB of activations per image) and a second one whose 9.4 MB weight makes any per-thread copy
  // of its gradient show. An average pool after the first: a max pool there would run fused with
  // the convolution (ops::conv2d_max_pool2d), whose full-size output and gradient are never
  // allocated, and the f32 step would peak at 51 MB (118 with the fusion off).
  default_generator().manual_seed(5);
  auto model = std::make_shared<nn::Sequential>(nn::Conv2d(1, 64, 3, nn::Conv2dOptions{.padding = 1}), nn::ReLU(),
                                                nn::AvgPool2d(16), nn::Conv2d(64, 2304, 4), nn::ReLU(), nn::Flatten(),
                                                nn::Linear(2304, 10));
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{.lr = 1e-3});
  auto step = [&] {
    Tensor x, y;
    {
      MemoryScope scope(MemCategory::data);
      Generator g(7);
      x = Tensor::randn({64, 1, 64, 64}, g);
      y = Tensor::from_vector(std::vector<int64_t>(64, 3), {64});
    }
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(autocast_dtype, autocast_dtype != DType::f32);
      loss = ops::cross_entropy((*model)(x), y);
    }
    loss.backward();
    opt.step();
  };
  step();  // primitives, moments, OpenMP threads: what the measured step finds made
  opt.zero_grad();
  // Nothing held but what is live: no cached blocks, no free heap the step could reuse unseen.
  allocator::empty_cache();
  malloc_trim(0);
  const int64_t live0 = allocator::stats().live_total;
  allocator::reset_peak();
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // VmHWM := VmRSS (Linux 4.0 on)
  }
  const int64_t rss0 = status_bytes("VmRSS"), hwm0 = status_bytes("VmHWM");
  if (rss0 < 0 || hwm0 < 0 || hwm0 > rss0 + (int64_t(1) << 20)) return {};
  step();
  return {allocator::stats().peak_reserved_bytes - live0, status_bytes("VmHWM") - rss0};
}

TEST(MemoryBudget, CountedPeakIsTheResidentGrowthOfALargeStep) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers' shadow memory (an eighth of every byte touched, under ASan) and their quarantine
  // of freed blocks are resident too: the process's growth is then not the program's. The Release
  // suite runs this test.
  GTEST_SKIP() << "resident memory under a sanitizer includes its shadow memory and quarantine";
#endif
  for (DType t : {DType::f32, DType::bf16}) {
    const ResidentGrowth g = measure_step(t);
    if (g.counted == 0) GTEST_SKIP() << "this kernel has no resettable VmHWM (/proc/self/clear_refs)";
    ASSERT_GT(g.counted, int64_t(64) << 20) << "the step is too small to tell";
    // Measured 0.1 MiB apart on a 230 MiB step. What may differ: the small objects of a step (graph
    // nodes, oneDNN memory handles; well under 1 MiB), pages of a scratchpad the primitive never
    // touches (counted, not resident), page rounding. 2 MiB + 1% allows those and nothing like one
    // weight-sized buffer outside the allocator (9.4 MB here, per thread).
    const int64_t tolerance = (int64_t(2) << 20) + g.counted / 100;
    EXPECT_NEAR(double(g.resident), double(g.counted), double(tolerance))
        << dtype_name(t) << ": resident growth " << g.resident << " bytes, counted " << g.counted;
  }
}

}  // namespace
}  // namespace mixprec
