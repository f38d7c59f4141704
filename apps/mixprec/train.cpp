// `mixprec train`: train a model on an idx data set, evaluate after each epoch, write metrics;
// with --diagnose K, report the gradients' fp16 range, the loss-scale trace and the autocast trace.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/data.h"
#include "mixprec/diagnostics.h"
#include "mixprec/error.h"
#include "mixprec/schedule.h"
#include "session.h"

namespace mixprec::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Tensor batch_images(const data::HostBatch& b, int64_t rows, int64_t cols) {
  MemoryScope scope(MemCategory::data);
  Tensor x = Tensor::empty({b.n, 1, rows, cols});
  std::copy(b.x.begin(), b.x.end(), x.data<float>());
  return x;
}
Tensor batch_labels(const data::HostBatch& b) {
  MemoryScope scope(MemCategory::data);
  return Tensor::from_vector(b.y, {b.n});
}

struct EvalResult {
  double accuracy = 0, loss = 0;
};

EvalResult evaluate(Session& s, const data::Dataset& test, data::Normalize norm) {
  data::LoaderOptions lo;
  lo.batch_size = 1000;
  lo.shuffle = false;
  lo.norm = norm;
  data::BatchLoader loader(test, lo);
  loader.begin_epoch(0);
  s.model->eval();
  autograd::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  data::HostBatch b;
  while (loader.next(b)) {
    Tensor x = batch_images(b, test.rows, test.cols), y = batch_labels(b);
    Tensor logits, loss;
    {
      amp::Autocast ac(s.opt.precision.autocast_dtype, s.opt.precision.autocast);
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

// The updates since the last report that moved a weight in f32 but not its 16-bit copy.
void report_rounding(Session& s, int64_t step, std::ofstream& metrics) {
  const optim::Optimizer::RoundingStats r = s.optimizer->take_rounding_stats();
  if (r.changed == 0) return;  // no 16-bit parameters (or no update)
  const bool master = s.opt.precision.master_weights;
  const double frac = double(r.unchanged_16bit) / double(r.changed);
  std::printf("rounding up to step %lld: %.2f%% of %lld weight updates left the 16-bit weight unchanged (%s)\n",
              static_cast<long long>(step), 100 * frac, static_cast<long long>(r.changed),
              master                                ? "held in the f32 master copy"
              : s.opt.precision.stochastic_rounding ? "rounded stochastically: kept on average"
                                                    : "lost: no master copy, round to nearest");
  if (metrics.is_open()) {
    nlohmann::ordered_json j = {{"event", "rounding"},  {"step", step},
                                {"updates", r.changed}, {"unchanged_16bit", r.unchanged_16bit},
                                {"master", master},     {"stochastic_rounding", s.opt.precision.stochastic_rounding}};
    metrics << j.dump() << "\n";
  }
}

}  // namespace

int cmd_train(Args& a) {
  SessionOptions opt = parse_session(a);
  const int64_t epochs = a.integer("epochs", 5, 1, 100000);
  const std::string dir = a.str("data", data::kDefaultDataDir);
  const std::string metrics_path = a.str("metrics", "");
  const int64_t log_every = a.integer("log-every", 1, 1, INT64_MAX);
  const bool detect_anomaly = a.flag("detect-anomaly");
  const int64_t diagnose = a.integer("diagnose", 0, 0, INT64_MAX);
  // Cosine annealing by default: the last epochs take small steps, so the final accuracy is
  // the model's, not the luck of where a constant-lr walk stopped.
  const std::string lr_schedule_kind = a.choice("lr-schedule", "cosine", {"cosine", "constant"});
  const int64_t lr_warmup = a.integer("lr-warmup", 0, 0, INT64_MAX);
  a.finish();

  // Data first: a missing or broken file fails before any model is built.
  const data::Dataset train = data::load_idx_dataset(dir, "train");
  const data::Dataset test = data::load_idx_dataset(dir, "t10k");
  MIXPREC_CHECK(train.rows == test.rows && train.cols == test.cols, "train images are ", train.rows, "x", train.cols,
                " but test images are ", test.rows, "x", test.cols, " in ", dir);
  opt.model.image_rows = train.rows;
  opt.model.image_cols = train.cols;
  const data::Normalize norm = dir == data::kDefaultDataDir ? data::kFashionMnistNorm : data::compute_normalize(train);

  std::ofstream metrics;
  if (!metrics_path.empty()) {
    metrics.open(metrics_path, std::ios::trunc);
    MIXPREC_CHECK(metrics.good(), "--metrics: cannot write ", metrics_path);
  }
  autograd::set_anomaly_enabled(detect_anomaly);

  Session s = make_session(opt);
  std::printf(
      "mixprec train: model %s (%lld parameters), precision %s%s%s, optimizer %s lr %g, batch %lld, %d threads\n",
      opt.model.name.c_str(), (long long)s.model->num_parameters(), opt.precision.name.c_str(),
      opt.precision.why.empty() ? "" : " (auto: ", opt.precision.why.empty() ? "" : (opt.precision.why + ")").c_str(),
      opt.optimizer.c_str(), opt.lr, (long long)opt.batch_size, opt.threads);
  std::printf("precision: %s; loss scale %s%s\n", opt.precision.summary.c_str(), describe_loss_scale(opt).c_str(),
              opt.accumulate > 1 ? (", " + std::to_string(opt.accumulate) + " micro-batches per step").c_str() : "");
  for (const std::string& w : amp::optimizer_warnings(*s.optimizer)) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (detect_anomaly && s.scaler->is_enabled())
    std::fprintf(stderr,
                 "warning: --detect-anomaly stops at the first inf/NaN gradient, including the overflows that "
                 "dynamic loss scaling would skip\n");
  std::printf("data: %s, %lld train / %lld test images of %lldx%lld\n", dir.c_str(), (long long)train.size,
              (long long)test.size, (long long)train.rows, (long long)train.cols);
  std::fflush(stdout);

  data::LoaderOptions lo;
  lo.batch_size = opt.batch_size;
  lo.shuffle = true;
  lo.seed = opt.seed;
  lo.norm = norm;
  data::BatchLoader loader(train, lo);
  const bool tty = isatty(fileno(stderr));
  const int64_t steps_per_epoch = loader.num_batches();
  optim::LrSchedule lr_schedule(*s.optimizer, lr_schedule_kind, epochs * steps_per_epoch, lr_warmup);
  const int64_t report_every = std::max<int64_t>(1, steps_per_epoch / 5);

  // Diagnostics: gradient statistics every `diagnose` steps (taken after backward, while the
  // gradients still carry the scale), the autocast trace of the first step, the scale trace.
  amp::ScaleTrace scale_trace;
  const auto named_params = s.model->named_parameters();
  int64_t step = 0, samples = 0;
  if (diagnose > 0) {
    s.optimizer->set_track_rounding(true);
    s.after_backward = [&] {
      if ((step + 1) % diagnose != 0 && step != 0) return;
      const double scale = s.scaler->get_scale();
      const auto stats = amp::gradient_stats(named_params, scale);
      std::printf("diagnose step %lld (gradients in fp16 terms):\n%s", static_cast<long long>(step) + 1,
                  amp::format_gradient_stats(stats, scale).c_str());
      if (metrics.is_open()) {
        nlohmann::ordered_json j = {{"event", "diagnose"}, {"step", step + 1}, {"scale", scale}};
        for (const auto& g : stats)
          j["gradients"].push_back({{"name", g.name},
                                    {"dtype", dtype_name(g.dtype)},
                                    {"numel", g.numel},
                                    {"zero", g.zero},
                                    {"underflow", g.underflow},
                                    {"underflow_unscaled", g.underflow_unscaled},
                                    {"subnormal", g.subnormal},
                                    {"overflow", g.overflow},
                                    {"overflow_unscaled", g.overflow_unscaled},
                                    {"rms", g.rms},
                                    {"max_abs", g.max_abs}});
        metrics << j.dump() << "\n";
      }
    };
  }

  const auto t_start = Clock::now();
  double train_seconds = 0;
  EvalResult last;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    loader.begin_epoch(int(epoch - 1));
    const auto t_epoch = Clock::now();
    data::HostBatch b;
    int64_t i = 0, epoch_samples = 0;
    double loss_sum = 0;
    while (loader.next(b)) {
      Tensor x = batch_images(b, train.rows, train.cols), y = batch_labels(b);
      const bool trace_autocast = diagnose > 0 && step == 0;
      if (trace_autocast) amp::start_trace();
      s.measure_grad_norm = metrics.is_open() && (step + 1) % log_every == 0;  // for the metrics line
      StepResult r;
      try {
        lr_schedule.apply(step);
        r = train_step(s, x, y);
      } catch (const OutOfMemory&) {
        throw;
      } catch (const Error& e) {
        if (trace_autocast) amp::stop_trace();
        throw Error(detail::concat(e.what(), " (at step ", step + 1, ")"));
      }
      if (trace_autocast)
        std::printf("autocast trace (step 1, forward):\n%s", amp::format_autocast_trace(amp::stop_trace()).c_str());
      const double loss = r.loss;
      MIXPREC_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", step + 1,
                    " (try a lower --lr, or --detect-anomaly to find the op)");
      scale_trace.record(step + 1, r.scale, r.skipped);
      if (diagnose > 0 && ((step + 1) % diagnose == 0 || step == 0)) report_rounding(s, step + 1, metrics);
      ++step, ++i;
      samples += b.n, epoch_samples += b.n;
      loss_sum += loss;
      if (metrics.is_open() && (step % log_every == 0)) {
        nlohmann::ordered_json j = {
            {"event", "step"},         {"step", step},     {"epoch", epoch},      {"loss", loss},
            {"lr", s.optimizer->lr()}, {"scale", r.scale}, {"skipped", r.skipped}};
        // null when the gradients held inf/NaN (JSON has no inf)
        j["grad_norm"] = std::isfinite(r.grad_norm) ? nlohmann::ordered_json(r.grad_norm) : nlohmann::ordered_json();
        metrics << j.dump() << "\n";
      }
      const double el = seconds_since(t_epoch);
      if (tty) {
        const int width = 30, filled = int(width * i / steps_per_epoch);
        std::fprintf(stderr, "\repoch %lld/%lld [%s%s] step %lld/%lld loss %.4f %.0f samples/s ", (long long)epoch,
                     (long long)epochs, std::string(size_t(filled), '#').c_str(),
                     std::string(size_t(width - filled), '.').c_str(), (long long)i, (long long)steps_per_epoch, loss,
                     double(epoch_samples) / el);
      } else if (i % report_every == 0 || i == steps_per_epoch) {
        std::fprintf(stderr, "epoch %lld/%lld step %lld/%lld loss %.4f %.0f samples/s\n", (long long)epoch,
                     (long long)epochs, (long long)i, (long long)steps_per_epoch, loss, double(epoch_samples) / el);
      }
    }
    const double epoch_train_s = seconds_since(t_epoch);
    train_seconds += epoch_train_s;
    if (tty) std::fprintf(stderr, "\n");
    last = evaluate(s, test, norm);
    const double epoch_s = seconds_since(t_epoch);
    std::printf("epoch %lld: train loss %.4f, test accuracy %.2f%%, test loss %.4f, %.1f s (%.0f samples/s)\n",
                (long long)epoch, loss_sum / double(std::max<int64_t>(i, 1)), 100 * last.accuracy, last.loss, epoch_s,
                double(epoch_samples) / epoch_train_s);
    std::fflush(stdout);
    if (metrics.is_open()) {
      nlohmann::ordered_json j = {{"event", "epoch"},
                                  {"epoch", epoch},
                                  {"test_accuracy", last.accuracy},
                                  {"test_loss", last.loss},
                                  {"train_loss", loss_sum / double(std::max<int64_t>(i, 1))},
                                  {"seconds", epoch_s}};
      metrics << j.dump() << "\n";
      metrics.flush();
    }
  }
  const double wall = seconds_since(t_start);
  const double sps = double(samples) / train_seconds;
  std::printf("done: %lld steps in %.1f s wall (%.1f s training), %.0f samples/s, final test accuracy %.2f%%\n",
              (long long)step, wall, train_seconds, sps, 100 * last.accuracy);
  std::printf("%s\n", peak_memory_table().c_str());
  if (s.scaler->is_enabled() || diagnose > 0) std::printf("loss %s\n", scale_trace.summary().c_str());
  if (metrics.is_open()) {
    nlohmann::ordered_json j = {{"event", "summary"},
                                {"precision", opt.precision.name},
                                {"model", opt.model.name},
                                {"steps", step},
                                {"wall_seconds", wall},
                                {"samples_per_s", sps},
                                {"test_accuracy", last.accuracy}};
    j["skipped_steps"] = s.scaler->num_skipped_steps();
    j["final_scale"] = s.scaler->get_scale();
    j["peak_bytes"] = nlohmann::ordered_json::parse(peak_memory_json());
    metrics << j.dump() << "\n";
    MIXPREC_CHECK(metrics.good(), "--metrics: writing ", metrics_path, " failed");
  }
  return 0;
}

}  // namespace mixprec::cli
