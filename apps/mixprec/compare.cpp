// `mixprec compare`: the same run (model, seed, data, flags) in each of --precisions, one after
// the other in this process, and one table of what mixed precision changes: accuracy and loss,
// time per epoch, throughput and speed-up, peak memory, skipped steps. --out DIR keeps each run's
// metrics, the table as JSON and the chart (chart.h).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chart.h"
#include "commands.h"
#include "metrics.h"
#include "mixprec/allocator.h"
#include "mixprec/error.h"
#include "mixprec/precision.h"
#include "progress.h"
#include "train.h"

namespace mixprec::cli {
namespace {

namespace fs = std::filesystem;

struct CompareFlags {
  SessionFlags session;
  TrainOptions train;
  std::vector<std::string> precisions = {"fp32", "amp-bf16", "amp-fp16"};
  bool json = false;
  std::string out;
};

// The table as one object: the runs' shared settings, then a row per precision.
Json table_json(const SessionOptions& opt, const TrainOptions& o, const std::vector<std::string>& precisions,
                const std::vector<TrainResult>& results, size_t baseline) {
  const bool gpt = opt.model.is_gpt();
  Json j = {{"model", opt.model.name}, {"device", opt.device.str()}, {"batch_size", opt.batch_size},
            {"seed", opt.seed},        {"threads", opt.threads},     {"baseline", precisions[baseline]}};
  if (gpt)
    j["steps"] = o.steps;
  else
    j["epochs"] = o.epochs;
  for (size_t i = 0; i < results.size(); ++i) {
    const TrainResult& r = results[i];
    Json row = {{"precision", precisions[i]}};
    if (gpt) {
      row["val_loss"] = r.val_loss;
      row["ms_per_step"] = 1000.0 * r.train_seconds / double(r.steps);
    } else {
      row["test_accuracy"] = r.test_accuracy;
      row["test_loss"] = r.test_loss;
      row["seconds_per_epoch"] = r.train_seconds / double(r.epochs);
    }
    row["samples_per_s"] = r.samples_per_s;
    row["speedup"] = r.samples_per_s / results[baseline].samples_per_s;
    row["peak_bytes"] = r.peak_bytes;
    row["peak_activation_bytes"] = r.peak_activation_bytes;
    row["skipped_steps"] = r.skipped_steps;
    row["final_scale"] = r.final_scale;
    j["runs"].push_back(row);
  }
  return j;
}

void print_table(const Json& t) {
  const bool gpt = t.at("model") == "gpt";
  if (gpt)
    std::printf("%-10s %10s %10s %10s %9s %10s %12s %8s\n", "precision", "val loss", "ms/step", "samples/s", "speed-up",
                "peak MiB", "activations", "skipped");
  else
    std::printf("%-10s %10s %10s %10s %10s %9s %10s %12s %8s\n", "precision", "test acc", "test loss", "s/epoch",
                "samples/s", "speed-up", "peak MiB", "activations", "skipped");
  for (const Json& r : t.at("runs")) {
    std::printf("%-10s", r.at("precision").get<std::string>().c_str());
    if (gpt)
      std::printf(" %10.4f %10.1f", r.at("val_loss").get<double>(), r.at("ms_per_step").get<double>());
    else
      std::printf(" %9.2f%% %10.4f %10.2f", 100 * r.at("test_accuracy").get<double>(), r.at("test_loss").get<double>(),
                  r.at("seconds_per_epoch").get<double>());
    std::printf(" %10.0f %8.2fx %10.1f %12.1f %8lld\n", r.at("samples_per_s").get<double>(),
                r.at("speedup").get<double>(), mib(r.at("peak_bytes").get<int64_t>()),
                mib(r.at("peak_activation_bytes").get<int64_t>()), (long long)r.at("skipped_steps").get<int64_t>());
  }
}

// `text` into path, through a temporary beside it: a failed write leaves no half-written file.
void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    MIXPREC_CHECK(f.good(), "--out: cannot write ", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MIXPREC_CHECK(!ec, "--out: cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message());
}

int cmd_compare(const Command& c, const CompareFlags& f) {
  // Every run's settings first: a flag that does not fit one of the presets fails before any training.
  std::vector<SessionOptions> runs;
  for (const std::string& p : f.precisions) {
    SessionFlags s = f.session;
    s.precision = p;
    runs.push_back(resolve_session(s, c));
  }
  TrainOptions o = resolve_train_options(f.train, runs[0].model.name, c);
  o.quiet = true;
  const bool gpt = runs[0].model.is_gpt();
  if (!f.out.empty()) {
    std::error_code ec;
    fs::create_directories(f.out, ec);
    MIXPREC_CHECK(!ec, "--out ", f.out, ": cannot create the directory: ", ec.message());
  }
  ImageData data;
  if (!gpt) data = load_image_data(o.data_dir);  // once, for every run

  std::vector<TrainResult> results;
  std::vector<std::string> metrics_files;
  for (size_t i = 0; i < runs.size(); ++i) {
    TrainOptions oi = o;
    if (!f.out.empty()) {
      oi.metrics_path = (fs::path(f.out) / (f.precisions[i] + ".jsonl")).string();
      metrics_files.push_back(oi.metrics_path);
    }
    std::fprintf(stderr, "compare: %s (%zu of %zu)\n", f.precisions[i].c_str(), i + 1, runs.size());
    // Each run's peak from its own start: the previous run's session is gone, its blocks cached.
    allocator::empty_cache(runs[i].device);
    allocator::reset_peak(runs[i].device);
    results.push_back(gpt ? train_gpt(runs[i], oi, "", nullptr)
                          : train_images(runs[i], oi, data.train, data.test, data.facts, nullptr, ""));
  }
  size_t baseline = 0;  // fp32 where it ran, else the first
  for (size_t i = 0; i < f.precisions.size(); ++i)
    if (f.precisions[i] == "fp32") baseline = i;
  const Json table = table_json(runs[0], o, f.precisions, results, baseline);

  std::string chart_message;
  if (!f.out.empty()) {
    write_file(fs::path(f.out) / "compare.json", table.dump(2) + "\n");
    chart_message = write_chart(metrics_files, f.precisions, (fs::path(f.out) / "chart.png").string()).message;
  }
  if (f.json) {
    std::printf("%s\n", table.dump(2).c_str());
    if (!chart_message.empty()) std::fprintf(stderr, "%s\n", chart_message.c_str());
    return 0;
  }
  const SessionOptions& opt = runs[0];
  std::printf("compare: model %s, %s, batch %lld, seed %llu, device %s, %d threads; speed-up over %s\n",
              opt.model.name.c_str(),
              gpt ? (std::to_string(o.steps) + " steps").c_str()
                  : (std::to_string(o.epochs) + " epochs of " + std::to_string(data.train.size) + " images").c_str(),
              (long long)opt.batch_size, (unsigned long long)opt.seed, opt.device.str().c_str(), opt.threads,
              f.precisions[baseline].c_str());
  print_table(table);
  if (!f.out.empty())
    std::printf("wrote %s: the runs' metrics, compare.json; %s\n", f.out.c_str(), chart_message.c_str());
  return 0;
}

}  // namespace

std::function<int()> declare_compare(Command& c) {
  auto f = std::make_shared<CompareFlags>();
  c.choice_list("precisions", f->precisions, amp::precision_preset_names(), "the presets to run, in this order");
  c.flag("json", f->json, "print the table as one JSON object");
  c.text("out", f->out, "DIR",
         "write each run's metrics (PRECISION.jsonl), the table (compare.json) and chart.png there", "none");
  add_session_flags(c, f->session, /*with_precision=*/false);
  add_train_flags(c, f->train, nullptr);
  return [f, &c] { return cmd_compare(c, *f); };
}

}  // namespace mixprec::cli
