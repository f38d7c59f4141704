// The JSON objects `mixprec train` and `mixprec bench` report, and the metrics file (--metrics)
// that holds one per line. Builders return JSON values; only the writer turns them into text.
#pragma once
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/diagnostics.h"
#include "mixprec/optim.h"
#include "session.h"

namespace mixprec::cli {

using Json = nlohmann::ordered_json;  // keys in the order written: a line reads event first

// Peak bytes on `device` by category ("total" first), at the moment of the total peak.
Json peak_memory_json(const Device& device);
Json peak_memory_json(const MemoryStats& st);  // the same from stats taken earlier
// Each category's own peak on `device` (not simultaneous: they need not add up to the total).
Json category_peak_json(const Device& device);

// One line per logged step: loss, lr, the scale the loss was multiplied by, whether the
// optimizer step was skipped, and the gradient norm (null when inf/NaN: JSON has no inf). epoch 0:
// a run of steps (gpt), whose lines have no epoch.
Json step_event(int64_t step, int64_t epoch, double lr, const StepResult& r);
// The gpt's validation loss (nats per character) after `step`.
Json eval_event(int64_t step, double val_loss);
Json epoch_event(int64_t epoch, double test_accuracy, double test_loss, double train_loss, double seconds);
// The gradient statistics of --diagnose, taken while the gradients carry `scale`.
Json diagnose_event(int64_t step, double scale, const std::vector<amp::GradStats>& stats);
// The weight updates since the last report, and how many left the 16-bit weight unchanged.
Json rounding_event(int64_t step, const optim::Optimizer::RoundingStats& r, const amp::Precision& p);
// The run's closing line: what was trained, how fast, how well, the scaler's end state, memory.
Json summary_event(const Session& s, int64_t steps, double wall_seconds, double samples_per_s, double test_accuracy);

// --metrics FILE, truncated at construction; with an empty path the writer is disabled and
// write() does nothing. A resumed run keeps the file's lines up to its checkpoint (the step lines
// up to `step`, the epoch lines up to `epoch`, no summary) and continues after them, so the file
// reads as if the run had never stopped.
class MetricsWriter {
 public:
  struct KeepUpTo {
    int64_t step = 0, epoch = 0;
  };
  explicit MetricsWriter(std::string path, std::optional<KeepUpTo> keep = std::nullopt);
  bool enabled() const { return file_.is_open(); }
  void write(const Json& event);  // one line
  void flush();                   // after each epoch: a run that is stopped keeps its lines
  void check() const;             // throws if any write failed

 private:
  std::string path_;
  std::ofstream file_;
};

}  // namespace mixprec::cli
