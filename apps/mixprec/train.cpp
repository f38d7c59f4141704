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
#include "mixprec/allocator.h"
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

void add_train_flags(Command& c, TrainOptions& o, std::string* resume) {
  c.group("image models (--model mlp, cnn, cnn-bn)", {"mlp", "cnn", "cnn-bn"});
  c.integer("epochs", o.epochs, 1, 100000, "passes over the training set");
  c.text("data", o.data_dir, "DIR", "Fashion-MNIST-style idx files (train-*, t10k-*, .gz or not)");
  c.group("gpt model (--model gpt)", {"gpt"});
  c.integer("steps", o.steps, 1, INT64_MAX / 2, "training steps");
  c.integer("eval-every", o.eval_every, 1, INT64_MAX, "the validation loss every N steps (and at the last)");
  c.integer("eval-batches", o.eval_batches, 1, 1 << 20, "fixed validation batches of 32 x block size");
  c.text("text", o.text_path, "FILE", "the corpus, any UTF-8 text (the default comes from scripts/dev.sh)");
  c.real("min-lr", o.min_lr, 0.0, 1e3, "where the cosine schedule ends", false, "model's recipe: gpt 1e-4");
  c.group("Options");
  if (resume)
    c.text("metrics", o.metrics_path, "FILE", "JSON lines: a step line every --log-every steps, epochs, a summary",
           "none");
  c.integer("log-every", o.log_every, 1, INT64_MAX, "a metrics line every N steps");
  c.flag("detect-anomaly", o.detect_anomaly, "stop at the first op that makes an inf/NaN, naming it");
  c.integer("diagnose", o.diagnose, 0, INT64_MAX,
            "every N steps: the share of gradient values fp16 flushes to zero or overflows, at the loss scale and "
            "without; the autocast trace; the scale trace. 0: off");
  // Cosine annealing by default: the last epochs take small steps, so the final accuracy is
  // the model's, not the luck of where a constant-lr walk stopped.
  c.choice("lr-schedule", o.lr_schedule, {"cosine", "constant"}, "cosine: anneal to --min-lr over the run");
  c.integer("lr-warmup", o.lr_warmup, 0, INT64_MAX, "steps of linear warm-up", "model's recipe: gpt 100, else 0");
  if (!resume) return;
  c.group("checkpoints");
  c.text("save", o.save_path, "FILE", "a checkpoint (safetensors) at each epoch end (gpt: each evaluation)", "none");
  c.integer("save-every", o.save_every, 0, INT64_MAX, "also every N steps; 0: off");
  c.text("resume", *resume, "FILE",
         "continue a checkpoint's run bit-exactly: its settings are the defaults, an explicit flag must agree", "none");
  c.integer("stop-after-steps", o.stop_after_steps, 0, INT64_MAX,
            "stop after step N (saving first with --save), as a preempted job would; 0: off");
  c.group("Options");
}

TrainOptions resolve_train_options(const TrainOptions& given, const std::string& model, const Command& c) {
  TrainOptions o = given;
  const Recipe recipe = default_recipe(model);
  if (!c.has("min-lr")) o.min_lr = recipe.min_lr;
  if (!c.has("lr-warmup")) o.lr_warmup = recipe.lr_warmup;
  MIXPREC_CHECK(o.save_every == 0 || !o.save_path.empty(), "--save-every needs --save FILE");
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
                 ProgressPrinter(o.epochs, batches_per_epoch(train, s.opt), o.quiet), std::move(checkpoint_metadata)),
        train_(train),
        test_(test),
        norm_(norm),
        loader_(train, train_loader_options(s.opt, norm)),
        start_(start),
        samples_(start.samples),
        train_seconds_(start.train_seconds),
        last_{start.test_accuracy, start.test_loss} {}

  TrainResult run() {
    const auto t_start = Clock::now();
    TrainResult result;
    for (int64_t epoch = start_.epochs_done + 1; epoch <= o_.epochs; ++epoch)
      if (!run_epoch(epoch)) {
        std::printf("stopped after step %lld (--stop-after-steps)%s%s\n", (long long)step_,
                    o_.save_path.empty() ? "" : "; resume with --resume ", o_.save_path.c_str());
        metrics_.check();
        result.stopped = true;
        return result;
      }
    const double wall = seconds_since(t_start);
    const double sps = double(samples_) / train_seconds_;
    char line[64];
    std::snprintf(line, sizeof line, "final test accuracy %.2f%%", 100 * last_.accuracy);
    if (!o_.quiet) print_done(s_, step_, wall, train_seconds_, sps, line, scale_trace_, o_.diagnose > 0);
    metrics_.write(summary_event(s_, step_, wall, sps, last_.accuracy));
    metrics_.check();
    result.steps = step_;
    result.epochs = o_.epochs;
    result.wall_seconds = wall;
    result.train_seconds = train_seconds_;
    result.samples_per_s = sps;
    result.test_accuracy = last_.accuracy;
    result.test_loss = last_.loss;
    return finish_result(s_, result);
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
    if (!o_.quiet)
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

ImageData load_image_data(const std::string& dir) {
  ImageData d;
  d.train = data::load_idx_dataset(dir, "train");
  d.test = data::load_idx_dataset(dir, "t10k");
  MIXPREC_CHECK(d.train.rows == d.test.rows && d.train.cols == d.test.cols, "train images are ", d.train.rows, "x",
                d.train.cols, " but test images are ", d.test.rows, "x", d.test.cols, " in ", dir);
  d.facts.train_samples = d.train.size;
  d.facts.rows = d.train.rows;
  d.facts.cols = d.train.cols;
  d.facts.norm = dir == data::kDefaultDataDir ? data::kFashionMnistNorm : data::compute_normalize(d.train);
  return d;
}

TrainResult finish_result(const Session& s, TrainResult r) {
  const MemoryStats st = allocator::stats(s.opt.device);
  r.skipped_steps = s.scaler->num_skipped_steps();
  r.final_scale = s.scaler->get_scale();
  r.peak_bytes = st.peak_total;
  r.peak_activation_bytes = st.at_peak_bytes[size_t(MemCategory::activations)];
  return r;
}

TrainResult train_images(const SessionOptions& opt_in, const TrainOptions& o, const data::Dataset& train,
                         const data::Dataset& test, const DataFacts& facts, const io::SafetensorsFile* ckpt,
                         const std::string& resume) {
  SessionOptions opt = opt_in;
  opt.model.image_rows = train.rows;
  opt.model.image_cols = train.cols;
  RunState start;
  Session s = start_session(opt, o.detect_anomaly, ckpt, resume, start);
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
  if (!o.quiet) print_header(s, image_data_line(o.data_dir, train, test), o.detect_anomaly);
  if (ckpt)
    std::printf("resumed from %s: epoch %lld, step %lld\n", resume.c_str(), (long long)start.epochs_done + 1,
                (long long)start.step);
  return EpochRun(s, o, train, test, facts.norm, metrics, start, checkpoint_metadata(opt, o, facts)).run();
}

namespace {

struct TrainFlags {
  SessionFlags session;
  TrainOptions train;
  std::string resume;
};

int cmd_train(Command& c, const TrainFlags& f) {
  // --resume: the checkpoint's settings are the defaults, and an explicit flag must agree with them.
  const std::string& resume = f.resume;
  std::optional<io::SafetensorsFile> ckpt;
  Flags stored;
  if (!resume.empty()) {
    ckpt = io::load_safetensors(resume);
    stored = stored_run_flags(ckpt->metadata, resume);
    c.take_defaults(stored, resume);
  }
  SessionOptions opt = resolve_session(f.session, c);
  TrainOptions o = resolve_train_options(f.train, opt.model.name, c);
  if (silence_follower_rank()) {  // under mpirun: rank 0 prints, writes the metrics and the checkpoints
    o.quiet = true;
    o.metrics_path.clear();
  }
  if (ckpt) check_same_settings(stored, setting_flags(opt, o), c, resume);
  if (opt.model.is_gpt()) {
    train_gpt(opt, o, resume, ckpt ? &*ckpt : nullptr);
    return 0;
  }

  // Data first: a missing or broken file fails before any model is built.
  const ImageData d = load_image_data(o.data_dir);
  DataFacts facts = d.facts;
  if (ckpt) {
    const DataFacts was = stored_data_facts(ckpt->metadata, resume);
    MIXPREC_CHECK(was.train_samples == facts.train_samples && was.rows == facts.rows && was.cols == facts.cols,
                  "--resume ", resume, ": its run trained on ", was.train_samples, " images of ", was.rows, "x",
                  was.cols, ", ", o.data_dir, " has ", facts.train_samples, " of ", facts.rows, "x", facts.cols,
                  ": a resumed run needs the same data");
    facts.norm = was.norm;
  }
  train_images(opt, o, d.train, d.test, facts, ckpt ? &*ckpt : nullptr, resume);
  return 0;
}

}  // namespace

std::function<int()> declare_train(Command& c) {
  auto f = std::make_shared<TrainFlags>();
  add_session_flags(c, f->session);
  add_train_flags(c, f->train, &f->resume);
  return [f, &c] { return cmd_train(c, *f); };
}

}  // namespace mixprec::cli
