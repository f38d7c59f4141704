// The engine of `mixprec max-batch`: the largest batch whose whole training step fits a memory
// budget, for one model and precision (the search itself: mixprec/memory_budget.h).
#pragma once
#include <cstdint>
#include <vector>

#include "metrics.h"
#include "mixprec/memory_budget.h"
#include "session.h"

namespace mixprec::cli {

struct MaxBatchResult {
  int64_t batch = 0;                       // 0: not even a batch of 1 fits
  int64_t peak_bytes = 0;                  // that batch's step, measured from its start
  Json peak_by_category = Json::object();  // the split at the moment of that peak ("total" first), as peak_memory_json
  int64_t attempts = 0;                    // training steps run, those that ran out of memory included
  int64_t smallest_failed = 0;             // the smallest batch seen not to fit; 0 when --max-batch fitted
  std::vector<BatchTrial> trials;          // every step run, in order
};

// The largest batch (<= max_batch) whose whole training step (forward, backward, optimizer step
// incl. its state, and the data batch itself) fits in budget_bytes on opt.device; opt.batch_size is
// ignored. The same model, optimizer and step as a real run (make_session, train_step) on synthetic
// data of the real shapes (images: N(0, 1) in batch_dtype(opt), as train holds them; gpt: random
// tokens, opt.model.vocab_size set).
MaxBatchResult find_max_batch(const SessionOptions& opt, int64_t budget_bytes, int64_t max_batch);

}  // namespace mixprec::cli
