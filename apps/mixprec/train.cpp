// `mixprec train`: train a model on an idx data set, evaluate after each epoch, write metrics;
// with --diagnose K, report the gradients' fp16 range, the loss-scale trace and the autocast trace;
// with --save, checkpoints that --resume continues bit-exactly. This file is the epoch loop; what
// it prints is in progress.cpp, what it writes to --metrics in metrics.cpp, what a checkpoint
// records of the run in run_config.cpp.
#include "train.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "evaluate.h"
#include "metrics.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/checkpoint.h"
#include "mixprec/data.h"
#include "mixprec/diagnostics.h"
#include "mixprec/error.h"
#include "mixprec/io.h"
#include "mixprec/schedule.h"
#include "progress.h"
#include "session.h"

namespace mixprec::cli {

TrainOptions parse_train_options(Args& a) {
  TrainOptions o;
  o.epochs = a.integer("epochs", 5, 1, 100000);
  o.data_dir = a.str("data", data::kDefaultDataDir);
  o.metrics_path = a.str("metrics", "");
  o.log_every = a.integer("log-every", 1, 1, INT64_MAX);
  o.detect_anomaly = a.flag("detect-anomaly");
  o.diagnose = a.integer("diagnose", 0, 0, INT64_MAX);
  // Cosine annealing by default: the last epochs take small steps, so the final accuracy is
  // the model's, not the luck of where a constant-lr walk stopped.
  o.lr_schedule = a.choice("lr-schedule", "cosine", {"cosine", "constant"});
  o.lr_warmup = a.integer("lr-warmup", 0, 0, INT64_MAX);
  o.save_path = a.str("save", "");
  o.save_every = a.integer("save-every", 0, 0, INT64_MAX);
  MIXPREC_CHECK(o.save_every == 0 || !o.save_path.empty(), "--save-every needs --save FILE");
  o.stop_after_steps = a.integer("stop-after-steps", 0, 0, INT64_MAX);
  return o;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

data::LoaderOptions train_loader_options(const SessionOptions& opt, data::Normalize norm) {
  data::LoaderOptions lo;
  lo.batch_size = opt.batch_size;
  lo.shuffle = true;
  lo.seed = opt.seed;
  lo.norm = norm;
  // Page-locked batches for a GPU: their copies run asynchronously, overlapping the step before.
  lo.pin_memory = opt.device.is_cuda();
  return lo;
}

// One training run, from its start or from where a checkpoint stopped: the epochs, and around
// each step the lr schedule, the diagnostics, the scale trace, the metrics lines, the progress
// and the checkpoints.
class TrainingRun {
 public:
  TrainingRun(Session& s, const TrainOptions& o, const data::Dataset& train, const data::Dataset& test,
              data::Normalize norm, MetricsWriter& metrics, const RunState& start, Flags checkpoint_metadata)
      : s_(s),
        o_(o),
        train_(train),
        test_(test),
        norm_(norm),
        metrics_(metrics),
        loader_(train, train_loader_options(s.opt, norm)),
        lr_schedule_(*s.optimizer, o.lr_schedule, o.epochs * loader_.num_batches(), o.lr_warmup),
        progress_(o.epochs, loader_.num_batches()),
        named_params_(s.model->named_parameters()),
        start_(start),
        metadata_(std::move(checkpoint_metadata)),
        step_(start.step),
        samples_(start.samples),
        train_seconds_(start.train_seconds),
        last_{start.test_accuracy, start.test_loss} {
    if (o_.diagnose > 0) {
      s_.optimizer->set_track_rounding(true);
      // After backward, while the gradients still carry the scale.
      s_.after_backward = [this] {
        if (diagnose_due()) diagnose_gradients();
      };
    }
  }
  TrainingRun(const TrainingRun&) = delete;  // the session's hook points at this run
  TrainingRun& operator=(const TrainingRun&) = delete;
  ~TrainingRun() { s_.after_backward = nullptr; }

  int64_t num_batches() const { return loader_.num_batches(); }

  void run() {
    const auto t_start = Clock::now();
    for (int64_t epoch = start_.epochs_done + 1; epoch <= o_.epochs; ++epoch)
      if (!run_epoch(epoch)) {
        std::printf("stopped after step %lld (--stop-after-steps)%s%s\n", (long long)step_,
                    o_.save_path.empty() ? "" : "; resume with --resume ", o_.save_path.c_str());
        metrics_.check();
        return;
      }
    const double wall = seconds_since(t_start);
    const double sps = double(samples_) / train_seconds_;
    print_done(s_, step_, wall, train_seconds_, sps, last_.accuracy, scale_trace_, o_.diagnose > 0);
    metrics_.write(summary_event(s_, step_, wall, sps, last_.accuracy));
    metrics_.check();
  }

 private:
  // Gradient statistics at step 1 and every `diagnose` steps (the autocast trace: step 1 only).
  bool diagnose_due() const { return o_.diagnose > 0 && ((step_ + 1) % o_.diagnose == 0 || step_ == 0); }

  // The epoch from the batch a checkpoint stopped at (or its first); false when the run stops
  // in it (--stop-after-steps).
  bool run_epoch(int64_t epoch) {
    const bool resumed = epoch == start_.epochs_done + 1;
    int64_t i = resumed ? start_.batches_done : 0, epoch_samples = 0;
    double loss_sum = resumed ? start_.epoch_loss_sum : 0;
    loader_.begin_epoch(int(epoch - 1), i);
    t_epoch_ = Clock::now();
    data::HostBatch b;
    while (loader_.next(b)) {
      const bool report = report_due(step_ + 1, i + 1);
      StepResult r = run_step(b, report);
      ++step_, ++i;
      samples_ += b.n, epoch_samples += b.n;
      unread_.push_back({step_, epoch, i, s_.optimizer->lr(), epoch_samples, seconds_since(t_epoch_), std::move(r)});
      if (report) report_steps(loss_sum);
      if (i == loader_.num_batches()) break;  // the epoch's end saves and stops below
      const bool stop = step_ == o_.stop_after_steps;
      if (stop || (o_.save_every > 0 && step_ % o_.save_every == 0)) {
        report_steps(loss_sum);  // the checkpoint holds the epoch's loss so far
        save(epoch - 1, i, loss_sum);
      }
      if (stop) {
        loader_.stop();
        progress_.end_epoch();
        return false;
      }
    }
    report_steps(loss_sum);
    const double epoch_train_s = seconds_since(t_epoch_);
    train_seconds_ += epoch_train_s;
    progress_.end_epoch();
    last_ = evaluate(*s_.model, s_.opt.precision, test_, norm_, s_.opt.device);
    const double epoch_s = seconds_since(t_epoch_);
    const double train_loss = loss_sum / double(std::max<int64_t>(i, 1));
    print_epoch(epoch, train_loss, last_.accuracy, last_.loss, epoch_s, double(epoch_samples) / epoch_train_s);
    metrics_.write(epoch_event(epoch, last_.accuracy, last_.loss, train_loss, epoch_s));
    metrics_.flush();
    save(epoch, 0, 0.0);
    return step_ != o_.stop_after_steps || epoch == o_.epochs;
  }

  // A checkpoint of the run as it stands after `batches_done` batches of epoch epochs_done + 1
  // (to --save, if given). The metrics lines so far are flushed first, so that a run killed
  // after the save has them all.
  void save(int64_t epochs_done, int64_t batches_done, double epoch_loss_sum) {
    if (o_.save_path.empty()) return;
    metrics_.flush();
    RunState r;
    r.epochs_done = epochs_done;
    r.batches_done = batches_done;
    r.step = step_;
    r.samples = samples_;
    r.epoch_loss_sum = epoch_loss_sum;
    r.train_seconds = train_seconds_ + (batches_done > 0 ? seconds_since(t_epoch_) : 0.0);
    r.test_accuracy = last_.accuracy;
    r.test_loss = last_.loss;
    Checkpoint(*s_.model, s_.optimizer.get(), s_.scaler.get(), &default_generator())
        .save(o_.save_path, metadata_, run_state_dict(r));
  }

  // Whether `step` (the i-th of its epoch) reads from the device: the losses of the steps not yet
  // read, its scale and skip. On the CPU at every step (reading costs nothing there); on a device
  // (a sync on a GPU) only where a metrics line or a progress line reports it (the last step of
  // an epoch has one), or diagnostics run.
  bool report_due(int64_t step, int64_t i) const {
    return s_.opt.device.is_cpu() || (metrics_.enabled() && step % o_.log_every == 0) || progress_.line_due(i) ||
           diagnose_due();
  }

  // Reads the losses of the unread steps (one copy from the device), checks them for divergence,
  // and writes their metrics lines and progress in step order.
  void report_steps(double& loss_sum) {
    if (unread_.empty()) return;
    std::vector<const StepLoss*> pending;
    for (const UnreadStep& u : unread_) pending.push_back(&u.r.pending_loss);
    const std::vector<double> losses = read_losses(pending);
    for (size_t k = 0; k < unread_.size(); ++k) {
      UnreadStep& u = unread_[k];
      u.r.loss = losses[k];
      MIXPREC_CHECK(std::isfinite(u.r.loss), "training diverged: loss is ", u.r.loss, " at step ", u.step,
                    " (try a lower --lr, or --detect-anomaly to find the op)");
      loss_sum += u.r.loss;
      if (metrics_.enabled() && u.step % o_.log_every == 0) metrics_.write(step_event(u.step, u.epoch, u.lr, u.r));
      progress_.step(u.epoch, u.i, u.r.loss, u.epoch_samples, u.seconds);
    }
    unread_.clear();
  }

  // Step `step_ + 1`: one optimizer step on batch b (its loss is read later, by report_steps).
  // With `report`, the step's scale and skip are read too (and the scale trace records them).
  StepResult run_step(data::HostBatch& b, bool report) {
    const data::DeviceBatch d = data::to_device(b, train_.rows, train_.cols, s_.opt.device);
    const Tensor &x = d.x, &y = d.y;
    const bool trace_autocast = o_.diagnose > 0 && step_ == 0;
    if (trace_autocast) amp::start_trace();
    s_.measure_grad_norm = metrics_.enabled() && (step_ + 1) % o_.log_every == 0;  // for the metrics line
    s_.host_values = report;
    StepResult r;
    try {
      lr_schedule_.apply(step_);
      r = train_step(s_, x, y);
    } catch (const OutOfMemory&) {
      throw;
    } catch (const Error& e) {
      if (trace_autocast) amp::stop_trace();
      throw Error(detail::concat(e.what(), " (at step ", step_ + 1, ")"));
    }
    if (trace_autocast) print_autocast_trace(amp::stop_trace());
    if (report) scale_trace_.record(step_ + 1, r.scale, r.skipped);  // on a device: the reported steps
    if (diagnose_due()) report_rounding();
    return r;
  }

  void diagnose_gradients() {
    const double scale = s_.scaler->get_scale();
    const std::vector<amp::GradStats> stats = amp::gradient_stats(named_params_, scale);
    print_gradient_stats(step_ + 1, stats, scale);
    metrics_.write(diagnose_event(step_ + 1, scale, stats));
  }

  // The updates since the last report that moved a weight in f32 but not its 16-bit copy.
  void report_rounding() {
    const optim::Optimizer::RoundingStats r = s_.optimizer->take_rounding_stats();
    if (r.changed == 0) return;  // no 16-bit parameters (or no update)
    print_rounding(step_ + 1, r, s_.opt.precision);
    metrics_.write(rounding_event(step_ + 1, r, s_.opt.precision));
  }

  Session& s_;
  const TrainOptions& o_;
  const data::Dataset &train_, &test_;
  const data::Normalize norm_;
  MetricsWriter& metrics_;
  data::BatchLoader loader_;
  optim::LrSchedule lr_schedule_;
  const ProgressPrinter progress_;
  const std::vector<std::pair<std::string, Tensor>> named_params_;
  const RunState start_;         // where this process starts: zeros, or a checkpoint's
  const Flags metadata_;         // of the checkpoints
  amp::ScaleTrace scale_trace_;  // of this process's steps
  int64_t step_, samples_;       // over the whole run
  double train_seconds_;         // without the evaluations
  EvalResult last_;              // the latest evaluation
  Clock::time_point t_epoch_;    // the current epoch's start in this process
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

}  // namespace

int cmd_train(Args& given) {
  // --resume: the checkpoint's settings are the defaults, and an explicit flag must agree with them.
  const std::string resume = given.str("resume", "");
  std::optional<io::SafetensorsFile> ckpt;
  Flags stored;
  if (!resume.empty()) {
    ckpt = io::load_safetensors(resume);
    stored = stored_run_flags(ckpt->metadata, resume);
  }
  Args a = ckpt ? given.with_defaults(stored) : given;
  (void)a.str("resume", "");
  SessionOptions opt = parse_session(a);
  const TrainOptions o = parse_train_options(a);
  a.finish();
  if (ckpt) check_same_settings(stored, setting_flags(opt, o), given, resume);

  // Data first: a missing or broken file fails before any model is built.
  const data::Dataset train = data::load_idx_dataset(o.data_dir, "train");
  const data::Dataset test = data::load_idx_dataset(o.data_dir, "t10k");
  MIXPREC_CHECK(train.rows == test.rows && train.cols == test.cols, "train images are ", train.rows, "x", train.cols,
                " but test images are ", test.rows, "x", test.cols, " in ", o.data_dir);
  opt.model.image_rows = train.rows;
  opt.model.image_cols = train.cols;
  DataFacts facts{train.size, train.rows, train.cols,
                  o.data_dir == data::kDefaultDataDir ? data::kFashionMnistNorm : data::compute_normalize(train)};
  if (ckpt) {
    const DataFacts was = stored_data_facts(ckpt->metadata, resume);
    MIXPREC_CHECK(was.train_samples == facts.train_samples && was.rows == facts.rows && was.cols == facts.cols,
                  "--resume ", resume, ": its run trained on ", was.train_samples, " images of ", was.rows, "x",
                  was.cols, ", ", o.data_dir, " has ", facts.train_samples, " of ", facts.rows, "x", facts.cols,
                  ": a resumed run needs the same data");
    facts.norm = was.norm;
  }

  autograd::set_anomaly_enabled(o.detect_anomaly);
  Session s = make_session(opt);
  RunState start;
  if (ckpt) {
    Checkpoint(*s.model, s.optimizer.get(), s.scaler.get(), &default_generator())
        .load_state_dict(ckpt->tensors, resume);
    // The schedule takes its base lr from the optimizer: the file holds the lr of its last step.
    s.optimizer->set_lr(opt.lr);
    start = load_run_state(ckpt->tensors, resume);
    const int64_t per_epoch = (train.size + opt.batch_size - 1) / opt.batch_size;
    MIXPREC_CHECK(start.epochs_done <= o.epochs && start.batches_done < per_epoch &&
                      start.step == start.epochs_done * per_epoch + start.batches_done,
                  resume, ": run.* says step ", start.step, " after ", start.epochs_done, " epochs and ",
                  start.batches_done, " batches, which is no point of a run of ", o.epochs, " epochs of ", per_epoch,
                  " batches");
    MIXPREC_CHECK(o.stop_after_steps == 0 || o.stop_after_steps > start.step, "--stop-after-steps ", o.stop_after_steps,
                  ": ", resume, " is at step ", start.step, " already");
  }
  // Last, as it rewrites the metrics file: a resumed run keeps the lines up to its checkpoint.
  MetricsWriter metrics(o.metrics_path,
                        ckpt ? std::optional<MetricsWriter::KeepUpTo>({start.step, start.epochs_done}) : std::nullopt);
  print_header(s, o.data_dir, train, test, o.detect_anomaly);
  if (ckpt)
    std::printf("resumed from %s: epoch %lld, step %lld\n", resume.c_str(), (long long)start.epochs_done + 1,
                (long long)start.step);
  TrainingRun(s, o, train, test, facts.norm, metrics, start, checkpoint_metadata(opt, o, facts)).run();
  return 0;
}

}  // namespace mixprec::cli
