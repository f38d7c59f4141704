// The text `mixprec train` prints on stdout (header, epochs, diagnostics, summary) and stderr
// (progress, warnings).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "mixprec/allocator.h"
#include "mixprec/error.h"

namespace mixprec::cli {

std::string image_data_line(const std::string& data_dir, const data::Dataset& train, const data::Dataset& test) {
  char line[512];
  std::snprintf(line, sizeof line, "data: %s, %lld train / %lld test images of %lldx%lld", data_dir.c_str(),
                (long long)train.size, (long long)test.size, (long long)train.rows, (long long)train.cols);
  return line;
}

void print_header(const Session& s, const std::string& data_line, bool detect_anomaly) {
  const SessionOptions& opt = s.opt;
  std::printf(
      "mixprec train: model %s (%lld parameters), precision %s%s%s, optimizer %s lr %g, batch %lld, %d threads, "
      "device %s%s%s\n",
      opt.model.name.c_str(), (long long)s.model->num_parameters(), opt.precision.name.c_str(),
      opt.precision.why.empty() ? "" : " (auto: ", opt.precision.why.empty() ? "" : (opt.precision.why + ")").c_str(),
      opt.optimizer.c_str(), opt.lr, (long long)opt.batch_size, opt.threads, opt.device.str().c_str(),
      opt.device_why.empty() ? "" : " (auto: ", opt.device_why.empty() ? "" : (opt.device_why + ")").c_str());
  std::printf("precision: %s; loss scale %s%s\n", opt.precision.summary.c_str(), describe_loss_scale(opt).c_str(),
              opt.accumulate > 1 ? (", " + std::to_string(opt.accumulate) + " micro-batches per step").c_str() : "");
  for (const std::string& w : amp::optimizer_warnings(*s.optimizer)) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (detect_anomaly && s.scaler->is_enabled())
    std::fprintf(stderr,
                 "warning: --detect-anomaly stops at the first inf/NaN gradient, including the overflows that "
                 "dynamic loss scaling would skip\n");
  std::printf("%s\n", data_line.c_str());
  std::fflush(stdout);
}

ProgressPrinter::ProgressPrinter(int64_t epochs, int64_t steps_per_epoch, bool quiet)
    : epochs_(epochs),
      steps_per_epoch_(steps_per_epoch),
      report_every_(std::max<int64_t>(1, steps_per_epoch / 5)),
      tty_(isatty(fileno(stderr))),
      quiet_(quiet) {}

void ProgressPrinter::step(int64_t epoch, int64_t i, double loss, int64_t samples, double seconds) const {
  if (quiet_) return;
  // A run of steps (epochs_ 0, the gpt) names no epoch.
  const std::string ep = epochs_ > 0 ? detail::concat("epoch ", epoch, "/", epochs_, " ") : std::string();
  if (tty_) {
    const int width = 30, filled = int(width * i / steps_per_epoch_);
    std::fprintf(stderr, "\r%s[%s%s] step %lld/%lld loss %.4f %.0f samples/s ", ep.c_str(),
                 std::string(size_t(filled), '#').c_str(), std::string(size_t(width - filled), '.').c_str(),
                 (long long)i, (long long)steps_per_epoch_, loss, double(samples) / seconds);
  } else if (line_due(i)) {
    std::fprintf(stderr, "%sstep %lld/%lld loss %.4f %.0f samples/s\n", ep.c_str(), (long long)i,
                 (long long)steps_per_epoch_, loss, double(samples) / seconds);
  }
}

void ProgressPrinter::end_epoch() const {
  if (tty_ && !quiet_) std::fprintf(stderr, "\n");
}

void print_epoch(int64_t epoch, double train_loss, double test_accuracy, double test_loss, double seconds,
                 double samples_per_s) {
  std::printf("epoch %lld: train loss %.4f, test accuracy %.2f%%, test loss %.4f, %.1f s (%.0f samples/s)\n",
              (long long)epoch, train_loss, 100 * test_accuracy, test_loss, seconds, samples_per_s);
  std::fflush(stdout);
}

void print_autocast_trace(const std::vector<amp::TraceEntry>& trace) {
  std::printf("autocast trace (step 1, forward):\n%s", amp::format_autocast_trace(trace).c_str());
}

void print_gradient_stats(int64_t step, const std::vector<amp::GradStats>& stats, double scale) {
  std::printf("diagnose step %lld (gradients in fp16 terms):\n%s", static_cast<long long>(step),
              amp::format_gradient_stats(stats, scale).c_str());
}

void print_rounding(int64_t step, const optim::Optimizer::RoundingStats& r, const amp::Precision& p) {
  const double frac = double(r.unchanged_16bit) / double(r.changed);
  std::printf("rounding up to step %lld: %.2f%% of %lld weight updates left the 16-bit weight unchanged (%s)\n",
              static_cast<long long>(step), 100 * frac, static_cast<long long>(r.changed),
              p.master_weights        ? "held in the f32 master copy"
              : p.stochastic_rounding ? "rounded stochastically: kept on average"
                                      : "lost: no master copy, round to nearest");
}

void print_done(const Session& s, int64_t steps, double wall_seconds, double train_seconds, double samples_per_s,
                const std::string& result, const amp::ScaleTrace& scale_trace, bool diagnose) {
  std::printf("done: %lld steps in %.1f s wall (%.1f s training), %.0f samples/s, %s\n", (long long)steps, wall_seconds,
              train_seconds, samples_per_s, result.c_str());
  std::printf("%s\n", peak_memory_table(s.opt.device).c_str());
  if (s.scaler->is_enabled() || diagnose) std::printf("loss %s\n", scale_trace.summary().c_str());
}

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

std::string peak_memory_table(const Device& device) {
  const MemoryStats st = allocator::stats(device);
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "peak memory %.1f MiB:", mib(st.peak_total));
  os << line;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    if (st.at_peak_bytes[i] == 0) continue;
    std::snprintf(line, sizeof line, " %s %.1f", std::string(mem_category_name(MemCategory(i))).c_str(),
                  mib(st.at_peak_bytes[i]));
    os << line;
  }
  return os.str();
}

}  // namespace mixprec::cli
