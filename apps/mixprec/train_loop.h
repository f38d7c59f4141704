// What the two training loops of `mixprec train` share (the image models' epochs in train.cpp, the
// gpt's steps in train_gpt.cpp): around each optimizer step the lr schedule, the autocast trace and
// gradient diagnostics of --diagnose, the scale trace, the losses read from the device at the
// reported steps (their metrics lines and progress), and the checkpoints.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "metrics.h"
#include "mixprec/diagnostics.h"
#include "mixprec/io.h"
#include "mixprec/schedule.h"
#include "progress.h"
#include "session.h"
#include "train.h"

namespace mixprec::cli {

// The run's session (make_session), anomaly detection set as asked; with a checkpoint (`ckpt`,
// read from `path`), its model, optimizer, scaler and generator state loaded, the optimizer's lr
// back to the run's base lr (the schedule's; the file holds its last step's), and where its run
// stopped in `start` (zeros without one).
Session start_session(const SessionOptions& opt, bool detect_anomaly, const io::SafetensorsFile* ckpt,
                      const std::string& path, RunState& start);

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class StepLoop {
 public:
  // total_steps: the schedule's length; start_step: the steps a checkpoint had done (else 0).
  StepLoop(Session& s, const TrainOptions& o, MetricsWriter& metrics, int64_t total_steps, int64_t start_step,
           ProgressPrinter progress, Flags checkpoint_metadata);
  StepLoop(const StepLoop&) = delete;  // the session's hook points at this loop
  StepLoop& operator=(const StepLoop&) = delete;
  ~StepLoop();

 protected:
  // Gradient statistics at step 1 and every `diagnose` steps (the autocast trace: step 1 only).
  bool diagnose_due() const { return o_.diagnose > 0 && ((step_ + 1) % o_.diagnose == 0 || step_ == 0); }
  // Whether `step` (the i-th of its epoch) reads from the device: the losses of the steps not yet
  // read, its scale and skip. On the CPU at every step (reading costs nothing there); on a device
  // (a sync on a GPU) only where a metrics line or a progress line reports it (the last step of
  // an epoch has one), or diagnostics run.
  bool report_due(int64_t step, int64_t i) const;
  // Step `step_ + 1` on (x, y): one optimizer step (its loss is read later, by report_steps). With
  // `report`, the step's scale and skip are read too (and the scale trace records them).
  StepResult run_step(const Tensor& x, const Tensor& y, bool report);
  // After run_step: counts the step and keeps it for report_steps. epoch 0: a run of steps (gpt).
  void finish_step(int64_t epoch, int64_t i, int64_t epoch_samples, double seconds, StepResult r);
  // Reads the losses of the unread steps (one copy from the device), checks them for divergence,
  // and writes their metrics lines and progress in step order; adds them to loss_sum.
  void report_steps(double& loss_sum);
  // A checkpoint of the run at `r` (to --save, if given). The metrics lines so far are flushed
  // first, so that a run killed after the save has them all.
  void save(const RunState& r);

  Session& s_;
  const TrainOptions& o_;
  MetricsWriter& metrics_;
  optim::LrSchedule lr_schedule_;
  const ProgressPrinter progress_;
  amp::ScaleTrace scale_trace_;  // of this process's steps
  int64_t step_;                 // optimizer steps over the whole run

 private:
  void diagnose_gradients();
  void report_rounding();  // the updates since the last report that moved a weight in f32 but not its 16-bit copy

  const std::vector<std::pair<std::string, Tensor>> named_params_;
  const Flags metadata_;  // of the checkpoints
  // The steps whose loss is still on the device, with what their report needs.
  struct UnreadStep {
    int64_t step, epoch, i;  // i: the step's index in its epoch, from 1
    double lr;
    int64_t epoch_samples;
    double seconds;  // since the epoch began
    StepResult r;
  };
  std::vector<UnreadStep> unread_;
};

}  // namespace mixprec::cli
