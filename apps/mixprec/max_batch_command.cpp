// `mixprec max-batch`: for each of --precisions the largest batch whose whole training step fits
// --memory-limit (the search: max_batch.h), its ratio to fp32's, and the memory by category at
// that batch's peak.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "max_batch.h"
#include "metrics.h"
#include "mixprec/error.h"
#include "mixprec/precision.h"
#include "progress.h"
#include "session.h"

namespace mixprec::cli {
namespace {

struct MaxBatchFlags {
  SessionFlags session;
  std::vector<std::string> precisions = {"fp32", "amp-bf16", "half-bf16"};
  int64_t max_batch = 1 << 16;
  int64_t vocab_size = 81;  // Moby Dick's vocabulary after preprocessing (mixprec/text.h)
  bool json = false;
};

std::string model_line(const ModelSpec& m) {
  std::string s = m.name;
  auto list = [](const std::vector<int64_t>& v) {
    std::string t;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) t += ',';
      t += std::to_string(v[i]);
    }
    return t;
  };
  if (m.name == "mlp") s += " (hidden " + list(m.hidden) + ")";
  if (m.name == "cnn") s += " (channels " + list(m.channels) + (m.channels_last ? ", channels-last" : "") + ")";
  if (m.is_gpt())
    s += detail::concat(" (", m.layers, " layers, ", m.heads, " heads, d-model ", m.d_model, ", block ", m.block_size,
                        ")");
  return s;
}

// Every step the search ran, in order: batch, fitted, peaks, and the refusal of one that did not fit.
Json trials_json(const std::vector<BatchTrial>& trials) {
  Json a = Json::array();
  for (const BatchTrial& t : trials) {
    Json o = {{"batch", t.batch},
              {"fitted", t.fitted},
              {"peak_bytes", t.peak_total},
              {"peak_reserved_bytes", t.peak_reserved_bytes}};
    if (!t.fitted) o["refusal"] = t.refusal;
    a.push_back(o);
  }
  return a;
}

int cmd_max_batch(const Command& c, const MaxBatchFlags& f) {
  MIXPREC_CHECK(!c.given("batch-size"), "--batch-size: max-batch searches the batch size (--max-batch bounds it)");
  // Every precision's settings first: a flag that does not fit one of them fails before any search.
  std::vector<SessionOptions> runs;
  for (const std::string& p : f.precisions) {
    SessionFlags s = f.session;
    s.precision = p;
    SessionOptions o = resolve_session(s, c);
    if (o.model.is_gpt()) o.model.vocab_size = f.vocab_size;
    o.memory_limit = 0;  // the search sets the budget itself, around each attempt
    runs.push_back(o);
  }
  std::vector<MaxBatchResult> results;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::fprintf(stderr, "max-batch: %s (%zu of %zu)\n", f.precisions[i].c_str(), i + 1, runs.size());
    results.push_back(find_max_batch(runs[i], f.session.memory_limit, f.max_batch));
  }
  size_t baseline = 0;  // fp32 where it ran, else the first
  for (size_t i = 0; i < f.precisions.size(); ++i)
    if (f.precisions[i] == "fp32") baseline = i;
  const int64_t base = results[baseline].batch;

  const SessionOptions& opt = runs[0];
  Json j = {{"model", opt.model.name},
            {"device", opt.device.str()},
            {"memory_limit_bytes", f.session.memory_limit},
            {"max_batch", f.max_batch},
            {"baseline", f.precisions[baseline]}};
  if (opt.model.name == "cnn") j["channels_last"] = opt.model.channels_last;
  for (size_t i = 0; i < results.size(); ++i) {
    const MaxBatchResult& r = results[i];
    j["precisions"].push_back({{"precision", f.precisions[i]},
                               {"batch", r.batch},
                               {"ratio", base > 0 ? Json(double(r.batch) / double(base)) : Json()},
                               {"peak_bytes", r.peak_bytes},
                               {"peak_by_category", r.peak_by_category},
                               {"attempts", r.attempts},
                               {"smallest_failed", r.smallest_failed > 0 ? Json(r.smallest_failed) : Json()},
                               {"trials", trials_json(r.trials)}});
  }
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("max-batch: model %s, optimizer %s, budget %s on %s; ratio to %s\n", model_line(opt.model).c_str(),
              opt.optimizer.c_str(), format_size(f.session.memory_limit).c_str(), opt.device.str().c_str(),
              f.precisions[baseline].c_str());
  // The memory columns: the categories with bytes at some precision's peak, in the allocator's order.
  std::vector<std::string> categories;
  for (const auto& [name, bytes] : results[0].peak_by_category.items()) {
    if (name == "total") continue;
    bool any = false;
    for (const MaxBatchResult& r : results) any = any || r.peak_by_category.value(name, int64_t(0)) > 0;
    if (any) categories.push_back(name);
  }
  std::printf("%-10s %8s %7s %10s", "precision", "batch", "ratio", "peak MiB");
  for (const std::string& cat : categories) std::printf(" %*s", int(std::max<size_t>(cat.size(), 8)), cat.c_str());
  std::printf("\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const MaxBatchResult& r = results[i];
    char ratio[16] = "-";
    if (base > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", double(r.batch) / double(base));
    std::printf("%-10s %8lld %7s %10.1f", f.precisions[i].c_str(), (long long)r.batch, ratio, mib(r.peak_bytes));
    for (const std::string& cat : categories)
      std::printf(" %*.1f", int(std::max<size_t>(cat.size(), 8)), mib(r.peak_by_category.value(cat, int64_t(0))));
    std::printf("\n");
  }
  std::printf("(memory in MiB at each batch's step peak, by category)\n");
  // Why not one more: the refusal of the smallest batch that did not fit.
  for (size_t i = 0; i < results.size(); ++i)
    for (const BatchTrial& t : results[i].trials)
      if (!t.fitted && t.batch == results[i].smallest_failed) {
        std::printf("%s at batch %lld: %s\n", f.precisions[i].c_str(), (long long)t.batch, t.refusal.c_str());
        break;
      }
  return 0;
}

}  // namespace

std::function<int()> declare_max_batch(Command& c) {
  auto f = std::make_shared<MaxBatchFlags>();
  c.choice_list("precisions", f->precisions, amp::precision_preset_names(), "the presets to search, in this order");
  c.integer("max-batch", f->max_batch, 1, 1 << 24, "the largest batch tried");
  c.flag("json", f->json, "print one JSON object: per precision its batch, ratio and memory");
  add_session_flags(c, f->session, /*with_precision=*/false);
  c.required("memory-limit");
  c.group("gpt model (--model gpt)", {"gpt"});
  c.integer("vocab-size", f->vocab_size, 1, 1 << 24, "random tokens below V (81: Moby Dick's vocabulary)");
  c.group("Options");
  return [f, &c] { return cmd_max_batch(c, *f); };
}

}  // namespace mixprec::cli
