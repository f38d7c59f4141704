// `mixprec train`: train a model on an idx data set, evaluate after each epoch, write metrics;
// with --diagnose K, report the gradients' fp16 range, the loss-scale trace and the autocast trace.
// This file is the epoch loop; what it prints is in progress.cpp, what it writes to --metrics in
// metrics.cpp.
#include <chrono>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "metrics.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/data.h"
#include "mixprec/diagnostics.h"
#include "mixprec/error.h"
#include "mixprec/schedule.h"
#include "progress.h"
#include "session.h"

namespace mixprec::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The flags of train beyond the ones it shares with bench (session.h).
struct TrainOptions {
  int64_t epochs = 5;
  std::string data_dir, metrics_path;
  int64_t log_every = 1;  // a metrics line every K steps
  bool detect_anomaly = false;
  int64_t diagnose = 0;  // gradient statistics every K steps; 0: off
  std::string lr_schedule;
  int64_t lr_warmup = 0;
};

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
  return o;
}

struct EvalResult {
  double accuracy = 0, loss = 0;
};

EvalResult evaluate(Session& s, const data::Dataset& test, data::Normalize norm) {
  data::LoaderOptions lo;
  lo.batch_size = 1000;
  lo.shuffle = false;
  lo.norm = norm;
  lo.pin_memory = s.opt.device.is_cuda();
  data::BatchLoader loader(test, lo);
  loader.begin_epoch(0);
  s.model->eval();
  autograd::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  data::HostBatch b;
  while (loader.next(b)) {
    const data::DeviceBatch d = data::to_device(b, test.rows, test.cols, s.opt.device);
    const Tensor &x = d.x, &y = d.y;
    Tensor logits, loss;
    {
      amp::Autocast ac(s.opt.device.type, s.opt.precision.autocast_dtype, s.opt.precision.autocast);
      logits = (*s.model)(x);
      loss = ops::cross_entropy(logits, y, ops::Reduction::sum);
    }
    loss_sum += loss.item();
    const std::vector<float> l = logits.to_vector();
    const int64_t c = logits.size(1);
    for (int64_t i = 0; i < b.n; ++i) {
      const float* row = l.data() + i * c;
      const int64_t pred = std::max_element(row, row + c) - row;
      correct += pred == b.y[size_t(i)];
    }
    seen += b.n;
  }
  s.model->train();
  return {double(correct) / double(std::max<int64_t>(seen, 1)), loss_sum / double(std::max<int64_t>(seen, 1))};
}

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

// One training run: the epochs, and around each step the lr schedule, the diagnostics, the
// scale trace, the metrics lines and the progress.
class TrainingRun {
 public:
  TrainingRun(Session& s, const TrainOptions& o, const data::Dataset& train, const data::Dataset& test,
              data::Normalize norm, MetricsWriter& metrics)
      : s_(s),
        o_(o),
        train_(train),
        test_(test),
        norm_(norm),
        metrics_(metrics),
        loader_(train, train_loader_options(s.opt, norm)),
        lr_schedule_(*s.optimizer, o.lr_schedule, o.epochs * loader_.num_batches(), o.lr_warmup),
        progress_(o.epochs, loader_.num_batches()),
        named_params_(s.model->named_parameters()) {
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

  void run() {
    const auto t_start = Clock::now();
    for (int64_t epoch = 1; epoch <= o_.epochs; ++epoch) run_epoch(epoch);
    const double wall = seconds_since(t_start);
    const double sps = double(samples_) / train_seconds_;
    print_done(s_, step_, wall, train_seconds_, sps, last_.accuracy, scale_trace_, o_.diagnose > 0);
    metrics_.write(summary_event(s_, step_, wall, sps, last_.accuracy));
    metrics_.check();
  }

 private:
  // Gradient statistics at step 1 and every `diagnose` steps (the autocast trace: step 1 only).
  bool diagnose_due() const { return o_.diagnose > 0 && ((step_ + 1) % o_.diagnose == 0 || step_ == 0); }

  void run_epoch(int64_t epoch) {
    loader_.begin_epoch(int(epoch - 1));
    const auto t_epoch = Clock::now();
    data::HostBatch b;
    int64_t i = 0, epoch_samples = 0;
    double loss_sum = 0;
    while (loader_.next(b)) {
      const bool report = report_due(step_ + 1, i + 1);
      StepResult r = run_step(b, report);
      ++step_, ++i;
      samples_ += b.n, epoch_samples += b.n;
      unread_.push_back({step_, epoch, i, s_.optimizer->lr(), epoch_samples, seconds_since(t_epoch), std::move(r)});
      if (report) report_steps(loss_sum);
    }
    report_steps(loss_sum);
    const double epoch_train_s = seconds_since(t_epoch);
    train_seconds_ += epoch_train_s;
    progress_.end_epoch();
    last_ = evaluate(s_, test_, norm_);
    const double epoch_s = seconds_since(t_epoch);
    const double train_loss = loss_sum / double(std::max<int64_t>(i, 1));
    print_epoch(epoch, train_loss, last_.accuracy, last_.loss, epoch_s, double(epoch_samples) / epoch_train_s);
    metrics_.write(epoch_event(epoch, last_.accuracy, last_.loss, train_loss, epoch_s));
    metrics_.flush();
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
  amp::ScaleTrace scale_trace_;
  // The steps whose loss is still on the device, with what their report needs.
  struct UnreadStep {
    int64_t step, epoch, i;  // i: the step's index in its epoch, from 1
    double lr;
    int64_t epoch_samples;
    double seconds;  // since the epoch began
    StepResult r;
  };
  std::vector<UnreadStep> unread_;
  int64_t step_ = 0, samples_ = 0;  // over the whole run
  double train_seconds_ = 0;        // without the evaluations
  EvalResult last_;                 // the latest evaluation
};

}  // namespace

int cmd_train(Args& a) {
  SessionOptions opt = parse_session(a);
  const TrainOptions o = parse_train_options(a);
  a.finish();

  // Data first: a missing or broken file fails before any model is built.
  const data::Dataset train = data::load_idx_dataset(o.data_dir, "train");
  const data::Dataset test = data::load_idx_dataset(o.data_dir, "t10k");
  MIXPREC_CHECK(train.rows == test.rows && train.cols == test.cols, "train images are ", train.rows, "x", train.cols,
                " but test images are ", test.rows, "x", test.cols, " in ", o.data_dir);
  opt.model.image_rows = train.rows;
  opt.model.image_cols = train.cols;
  const data::Normalize norm =
      o.data_dir == data::kDefaultDataDir ? data::kFashionMnistNorm : data::compute_normalize(train);

  MetricsWriter metrics(o.metrics_path);
  autograd::set_anomaly_enabled(o.detect_anomaly);
  Session s = make_session(opt);
  print_header(s, o.data_dir, train, test, o.detect_anomaly);
  TrainingRun(s, o, train, test, norm, metrics).run();
  return 0;
}

}  // namespace mixprec::cli
