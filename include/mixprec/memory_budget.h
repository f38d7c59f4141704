// The largest batch whose training step fits a memory budget: doubling, then bisecting, over a step
// the caller runs (whatever model, optimizer and precision it uses), with the allocator's budget as
// the limit and OutOfMemory as the answer "too large".
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/device.h"

namespace mixprec {

// One step the search ran: what it asked of the allocator, and the refusal of one that did not fit
// (whose message says which request, of which category, against what: the answer to "why not a
// larger batch", where the steps' sizes do not grow smoothly, as cuDNN's workspaces do not).
struct BatchTrial {
  int64_t batch = 0;
  bool fitted = false;
  int64_t peak_total = 0;           // live bytes at the step's peak (up to the refusal, for one that failed)
  int64_t peak_reserved_bytes = 0;  // live and cached: what a device's budget counts
  std::string refusal;              // the OutOfMemory's message; empty for a step that fitted
};

struct BatchFit {
  int64_t batch = 0;            // the largest batch whose step fitted; 0 when not even a batch of 1 did
  MemoryStats stats;            // the allocator's stats after that batch's step (peak_total, at_peak_bytes: its peak)
  int64_t attempts = 0;         // steps run, those that ran out of memory included
  int64_t smallest_failed = 0;  // the smallest batch seen not to fit; 0 when max_batch fitted
  std::vector<BatchTrial> trials;  // every step run, in order (attempts of them)
};

// Runs step(b), one whole training step at batch b (the batch made inside it, so it counts), under a
// budget of budget_bytes on `device`: b = 1, 2, 4, ... up to max_batch until a step throws
// OutOfMemory, then bisection between the largest size that fitted and the smallest that did not.
// It assumes what a step needs grows with b (true of every layer the library has, up to oneDNN
// picking another algorithm with another scratchpad for some sizes).
//
// The answer is a steady-state step's: a step that leaves more bytes live than it found (the first
// one creates the gradients and the optimizer's moments) is run again at the same size, so a batch
// counts as fitting only once it fitted with that state already held, as every step but the first
// of a real run holds it. Each attempt's peak is measured from its own start (reset_peak).
//
// step must leave the process able to run again after an OutOfMemory: the library's objects do (an
// exception mid-step leaves no graph, autocast state or half-made gradient behind), except that a
// GradScaler needs reset_iteration() when the exception came between its scale() and update().
// Any other exception propagates. The budget in force before the call is restored on return.
BatchFit find_largest_batch(const std::function<void(int64_t batch)>& step, int64_t budget_bytes, int64_t max_batch,
                            const Device& device = Device::cpu());

}  // namespace mixprec
