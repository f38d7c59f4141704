// find_max_batch: one session (model, optimizer, GradScaler as `train` builds them) stepped on
// synthetic batches of growing size under the memory budget (find_largest_batch).
#include "max_batch.h"

#include <vector>

#include "mixprec/error.h"
#include "mixprec/memory_budget.h"
#include "mixprec/random.h"

namespace mixprec::cli {

MaxBatchResult find_max_batch(const SessionOptions& opt, int64_t budget_bytes, int64_t max_batch) {
  Session s = make_session(opt);
  const ModelSpec& m = opt.model;
  Generator gen(opt.seed + 1);
  auto step = [&](int64_t b) {
    Tensor x, y;
    {
      // The batch as a run holds it: in the data category, on the device (made on the CPU, then
      // moved, as the loader's batches are).
      MemoryScope scope(MemCategory::data);
      if (m.is_gpt()) {
        std::vector<int64_t> tokens(static_cast<size_t>(2 * b * m.block_size));
        for (auto& t : tokens) t = int64_t(gen.uniform_below(uint64_t(m.vocab_size)));
        const auto mid = tokens.begin() + b * m.block_size;
        x = Tensor::from_vector(std::vector<int64_t>(tokens.begin(), mid), {b, m.block_size}).to(opt.device);
        y = Tensor::from_vector(std::vector<int64_t>(mid, tokens.end()), {b, m.block_size}).to(opt.device);
      } else {
        x = Tensor::randn({b, 1, m.image_rows, m.image_cols}, gen).to(batch_dtype(opt)).to(opt.device);
        std::vector<int64_t> labels(static_cast<size_t>(b));
        for (auto& l : labels) l = int64_t(gen.uniform_below(uint64_t(m.num_classes)));
        y = Tensor::from_vector(labels, {b}).to(opt.device);
      }
    }
    try {
      const StepResult r = train_step(s, x, y);
      read_losses({&r.pending_loss});  // waits for the step where it runs asynchronously (a GPU)
    } catch (const OutOfMemory&) {
      // Give the failed step up as a loop would: its gradients go (the next step makes them again)
      // and the scaler forgets the iteration, so the next, smaller attempt starts as a step does.
      s.optimizer->zero_grad();
      s.scaler->reset_iteration();
      throw;
    }
  };
  const BatchFit fit = find_largest_batch(step, budget_bytes, max_batch, opt.device);
  MaxBatchResult r;
  r.batch = fit.batch;
  r.peak_bytes = fit.batch > 0 ? fit.stats.peak_total : 0;
  r.peak_by_category = fit.batch > 0 ? peak_memory_json(fit.stats) : Json::object();
  r.attempts = fit.attempts;
  r.smallest_failed = fit.smallest_failed;
  r.trials = fit.trials;
  return r;
}

}  // namespace mixprec::cli
