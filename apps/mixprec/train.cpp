// `mixprec train`: train a model on an idx data set, evaluate after each epoch, write metrics;
// with --diagnose K, report the gradients' fp16 range, the loss-scale trace and the autocast trace;
// with --save, checkpoints that --resume continues bit-exactly. This file is the epoch loop of the
// image models; the gpt's step loop is train_gpt.cpp, what both do around a step train_loop.cpp;
// what they print is in progress.cpp, what they write to --metrics in metrics.cpp, what a
// checkpoint records of the run in run_config.cpp.
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
#include "mixprec/text.h"
#include "progress.h"
#include "session.h"
#include "train_loop.h"

namespace mixprec::cli {

TrainOptions parse_train_options(Args& a, const std::string& model) {
  TrainOptions o;
  const Recipe recipe = default_recipe(model);
  if (model == "gpt") {
    o.steps = a.integer("steps", o.steps, 1, INT64_MAX / 2);
    o.eval_every = a.integer("eval-every", o.eval_every, 1, INT64_MAX);
    o.eval_batches = a.integer("eval-batches", o.eval_batches, 1, 1 << 20);
    o.text_path = a.str("text", data::kDefaultTextPath);
    o.min_lr = a.real("min-lr", recipe.min_lr, 0.0, 1e3);
  } else {
    o.epochs = a.integer("epochs", 5, 1, 100000);
    o.data_dir = a.str("data", data::kDefaultDataDir);
  }
  o.metrics_path = a.str("metrics", "");
  o.log_every = a.integer("log-every", 1, 1, INT64_MAX);
  o.detect_anomaly = a.flag("detect-anomaly");
  o.diagnose = a.integer("diagnose", 0, 0, INT64_MAX);
  // Cosine annealing by default: the last epochs take small steps, so the final accuracy is
  // the model's, not the luck of where a constant-lr walk stopped.
  o.lr_schedule = a.choice("lr-schedule", "cosine", {"cosine", "constant"});
  o.lr_warmup = a.integer("lr-warmup", recipe.lr_warmup, 0, INT64_MAX);
  o.save_path = a.str("save", "");
  o.save_every = a.integer("save-every", 0, 0, INT64_MAX);
  MIXPREC_CHECK(o.save_every == 0 || !o.save_path.empty(), "--save-every needs --save FILE");
  o.stop_after_steps = a.integer("stop-after-steps", 0, 0, INT64_MAX);
  return o;
}

namespace {

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

int64_t batches_per_epoch(const data::Dataset& train, const SessionOptions& opt) {
  return (train.size + opt.batch_size - 1) / opt.batch_size;
}

// One training run of an image model, from its start or from where a checkpoint stopped: the
// epochs, each ending with an evaluation, an epoch line and a checkpoint.
class EpochRun : StepLoop {
 public:
  EpochRun(Session& s, const TrainOptions& o, const data::Dataset& train, const data::Dataset& test,
           data::Normalize norm, MetricsWriter& metrics, const RunState& start, Flags checkpoint_metadata)
      : StepLoop(s, o, metrics, o.epochs * batches_per_epoch(train, s.opt), start.step,
                 ProgressPrinter(o.epochs, batches_per_epoch(train, s.opt)), std::move(checkpoint_metadata)),
        train_(train),
        test_(test),
        norm_(norm),
        loader_(train, train_loader_options(s.opt, norm)),
        start_(start),
        samples_(start.samples),
        train_seconds_(start.train_seconds),
        last_{start.test_accuracy, start.test_loss} {}

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
    char result[64];
    std::snprintf(result, sizeof result, "final test accuracy %.2f%%", 100 * last_.accuracy);
    print_done(s_, step_, wall, train_seconds_, sps, result, scale_trace_, o_.diagnose > 0);
    metrics_.write(summary_event(s_, step_, wall, sps, last_.accuracy));
    metrics_.check();
  }

 private:
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
      const data::DeviceBatch d = data::to_device(b, train_.rows, train_.cols, s_.opt.device, batch_dtype(s_.opt));
      StepResult r = run_step(d.x, d.y, report);
      ++i;
      samples_ += b.n, epoch_samples += b.n;
      finish_step(epoch, i, epoch_samples, seconds_since(t_epoch_), std::move(r));
      if (report) report_steps(loss_sum);
      if (i == loader_.num_batches()) break;  // the epoch's end saves and stops below
      const bool stop = step_ == o_.stop_after_steps;
      if (stop || (o_.save_every > 0 && step_ % o_.save_every == 0)) {
        report_steps(loss_sum);  // the checkpoint holds the epoch's loss so far
        save_at(epoch - 1, i, loss_sum);
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
    save_at(epoch, 0, 0.0);
    return step_ != o_.stop_after_steps || epoch == o_.epochs;
  }

  // A checkpoint after `batches_done` batches of epoch epochs_done + 1.
  void save_at(int64_t epochs_done, int64_t batches_done, double epoch_loss_sum) {
    RunState r;
    r.epochs_done = epochs_done;
    r.batches_done = batches_done;
    r.step = step_;
    r.samples = samples_;
    r.epoch_loss_sum = epoch_loss_sum;
    r.train_seconds = train_seconds_ + (batches_done > 0 ? seconds_since(t_epoch_) : 0.0);
    r.test_accuracy = last_.accuracy;
    r.test_loss = last_.loss;
    save(r);
  }

  const data::Dataset &train_, &test_;
  const data::Normalize norm_;
  data::BatchLoader loader_;
  const RunState start_;       // where this process starts: zeros, or a checkpoint's
  int64_t samples_;            // over the whole run
  double train_seconds_;       // without the evaluations
  EvalResult last_;            // the latest evaluation
  Clock::time_point t_epoch_;  // the current epoch's start in this process
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
  const TrainOptions o = parse_train_options(a, opt.model.name);
  a.finish();
  if (ckpt) check_same_settings(stored, setting_flags(opt, o), given, resume);
  if (opt.model.is_gpt()) return train_gpt(opt, o, resume, ckpt ? &*ckpt : nullptr);

  // Data first: a missing or broken file fails before any model is built.
  const data::Dataset train = data::load_idx_dataset(o.data_dir, "train");
  const data::Dataset test = data::load_idx_dataset(o.data_dir, "t10k");
  MIXPREC_CHECK(train.rows == test.rows && train.cols == test.cols, "train images are ", train.rows, "x", train.cols,
                " but test images are ", test.rows, "x", test.cols, " in ", o.data_dir);
  opt.model.image_rows = train.rows;
  opt.model.image_cols = train.cols;
  DataFacts facts;
  facts.train_samples = train.size;
  facts.rows = train.rows;
  facts.cols = train.cols;
  facts.norm = o.data_dir == data::kDefaultDataDir ? data::kFashionMnistNorm : data::compute_normalize(train);
  if (ckpt) {
    const DataFacts was = stored_data_facts(ckpt->metadata, resume);
    MIXPREC_CHECK(was.train_samples == facts.train_samples && was.rows == facts.rows && was.cols == facts.cols,
                  "--resume ", resume, ": its run trained on ", was.train_samples, " images of ", was.rows, "x",
                  was.cols, ", ", o.data_dir, " has ", facts.train_samples, " of ", facts.rows, "x", facts.cols,
                  ": a resumed run needs the same data");
    facts.norm = was.norm;
  }

  RunState start;
  Session s = start_session(opt, o.detect_anomaly, ckpt ? &*ckpt : nullptr, resume, start);
  if (ckpt) {
    const int64_t per_epoch = batches_per_epoch(train, opt);
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
  print_header(s, image_data_line(o.data_dir, train, test), o.detect_anomaly);
  if (ckpt)
    std::printf("resumed from %s: epoch %lld, step %lld\n", resume.c_str(), (long long)start.epochs_done + 1,
                (long long)start.step);
  EpochRun(s, o, train, test, facts.norm, metrics, start, checkpoint_metadata(opt, o, facts)).run();
  return 0;
}

}  // namespace mixprec::cli
