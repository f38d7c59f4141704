// What `mixprec train` prints: the run's header, progress within an epoch (on stderr: a bar on a
// terminal, else a line every fifth of an epoch), the epoch lines, the diagnostics and the summary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/data.h"
#include "mixprec/diagnostics.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"
#include "session.h"

namespace mixprec::cli {

// Model, precision, loss scale, optimizer, threads and the data line; warnings about the
// optimizer's settings and --detect-anomaly go to stderr.
void print_header(const Session& s, const std::string& data_line, bool detect_anomaly);
// "data: DIR, 60000 train / 10000 test images of 28x28"
std::string image_data_line(const std::string& data_dir, const data::Dataset& train, const data::Dataset& test);

class ProgressPrinter {
 public:
  // epochs 0: a run of steps_per_epoch steps without epochs (the gpt's). quiet: prints nothing.
  ProgressPrinter(int64_t epochs, int64_t steps_per_epoch, bool quiet = false);
  // After step i (from 1) of `epoch`: `samples` trained in `seconds` this epoch.
  void step(int64_t epoch, int64_t i, double loss, int64_t samples, double seconds) const;
  void end_epoch() const;  // ends the terminal's bar line
  // Whether a line (not the terminal's bar) reports step i: every fifth of an epoch and its end.
  // On a GPU the loss is read at these steps (a sync), not at every one.
  bool line_due(int64_t i) const { return i % report_every_ == 0 || i == steps_per_epoch_; }

 private:
  int64_t epochs_, steps_per_epoch_, report_every_;
  bool tty_, quiet_;
};

void print_epoch(int64_t epoch, double train_loss, double test_accuracy, double test_loss, double seconds,
                 double samples_per_s);
void print_autocast_trace(const std::vector<amp::TraceEntry>& trace);
void print_gradient_stats(int64_t step, const std::vector<amp::GradStats>& stats, double scale);
void print_rounding(int64_t step, const optim::Optimizer::RoundingStats& r, const amp::Precision& p);
// The closing lines: steps, time and speed, the final result ("final test accuracy 91.20%"), peak
// memory, and the loss-scale trace when a scaler ran or diagnostics were asked for.
void print_done(const Session& s, int64_t steps, double wall_seconds, double train_seconds, double samples_per_s,
                const std::string& result, const amp::ScaleTrace& scale_trace, bool diagnose);

// "peak memory 41.4 MiB: parameters 7.1 ..." (the split at the moment of the total peak), on the
// device the run trained on.
std::string peak_memory_table(const Device& device);
// Bytes in MiB, for the tables train, compare and max-batch print.
double mib(int64_t bytes);

}  // namespace mixprec::cli
