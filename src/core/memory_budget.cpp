// find_largest_batch: doubling then bisecting over a caller's training step under the allocator's
// budget (the search behind `mixprec max-batch`).
#include "mixprec/memory_budget.h"

#include <algorithm>

#include "mixprec/error.h"

namespace mixprec {
namespace {

// A step that still leaves more bytes live after this many runs at one size is taken as it is (a
// loop that keeps, say, every loss tensor grows a little forever); the state a training step creates
// is all there after its first run.
constexpr int kMaxRunsPerSize = 3;

// Sets the budget for the search and puts back the one in force before it, also on an exception.
class BudgetScope {
 public:
  BudgetScope(int64_t bytes, const Device& d) : device_(d), prev_(allocator::stats(d).budget_bytes) {
    allocator::set_budget(bytes, d);
  }
  ~BudgetScope() { allocator::set_budget(prev_, device_); }
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  Device device_;
  int64_t prev_;
};

}  // namespace

BatchFit find_largest_batch(const std::function<void(int64_t batch)>& step, int64_t budget_bytes, int64_t max_batch,
                            const Device& device) {
  MIXPREC_CHECK(step != nullptr, "find_largest_batch: no step function");
  MIXPREC_CHECK(budget_bytes > 0, "find_largest_batch: the budget must be > 0 bytes, got ", budget_bytes);
  MIXPREC_CHECK(max_batch >= 1, "find_largest_batch: max_batch must be >= 1, got ", max_batch);
  BudgetScope budget(budget_bytes, device);
  BatchFit fit;
  // Whether a step at batch b fits once the state it creates is held; fills `stats` when it does.
  auto fits = [&](int64_t b, MemoryStats& stats) {
    for (int run = 0; run < kMaxRunsPerSize; ++run) {
      const int64_t live_before = allocator::stats(device).live_total;
      allocator::reset_peak(device);
      ++fit.attempts;
      BatchTrial& trial = fit.trials.emplace_back();
      trial.batch = b;
      const auto measure = [&] {
        const MemoryStats now = allocator::stats(device);
        trial.peak_total = now.peak_total;
        trial.peak_reserved_bytes = now.peak_reserved_bytes;
        return now;
      };
      try {
        step(b);
      } catch (const OutOfMemory& e) {
        measure();
        trial.refusal = e.what();
        return false;
      }
      trial.fitted = true;
      stats = measure();
      if (stats.live_total <= live_before) break;
    }
    return true;
  };
  int64_t lo = 0, hi = 0;  // lo fits (0: nothing yet), hi does not (0: nothing failed)
  MemoryStats lo_stats;
  for (int64_t b = 1;; b = std::min(b * 2, max_batch)) {
    MemoryStats st;
    if (!fits(b, st)) {
      hi = b;
      break;
    }
    lo = b;
    lo_stats = st;
    if (b == max_batch) break;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    MemoryStats st;
    if (fits(mid, st)) {
      lo = mid;
      lo_stats = st;
    } else {
      hi = mid;
    }
  }
  fit.batch = lo;
  fit.stats = lo_stats;
  fit.smallest_failed = hi;
  return fit;
}

}  // namespace mixprec
