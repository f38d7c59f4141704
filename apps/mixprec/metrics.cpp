// The JSON events of `mixprec train` and `bench`, and the JSON-lines metrics file.
#include "metrics.h"

#include <cmath>
#include <utility>

#include "mixprec/allocator.h"
#include "mixprec/dtype.h"
#include "mixprec/error.h"

namespace mixprec::cli {

Json peak_memory_json(const Device& device) { return peak_memory_json(allocator::stats(device)); }

Json peak_memory_json(const MemoryStats& st) {
  Json j;
  j["total"] = st.peak_total;
  for (size_t i = 0; i < kNumMemCategories; ++i)
    j[std::string(mem_category_name(MemCategory(i)))] = st.at_peak_bytes[i];
  return j;
}

Json category_peak_json(const Device& device) {
  const MemoryStats st = allocator::stats(device);
  Json j;
  for (size_t i = 0; i < kNumMemCategories; ++i) j[std::string(mem_category_name(MemCategory(i)))] = st.peak_bytes[i];
  return j;
}

Json step_event(int64_t step, int64_t epoch, double lr, const StepResult& r) {
  Json j = {{"event", "step"}, {"step", step}};
  if (epoch > 0) j["epoch"] = epoch;  // a run of steps (gpt) has no epochs
  j["loss"] = r.loss;
  j["lr"] = lr;
  j["scale"] = r.scale;
  j["skipped"] = r.skipped;
  j["grad_norm"] = std::isfinite(r.grad_norm) ? Json(r.grad_norm) : Json();
  return j;
}

Json eval_event(int64_t step, double val_loss) { return {{"event", "eval"}, {"step", step}, {"val_loss", val_loss}}; }

Json epoch_event(int64_t epoch, double test_accuracy, double test_loss, double train_loss, double seconds) {
  return {{"event", "epoch"},       {"epoch", epoch},           {"test_accuracy", test_accuracy},
          {"test_loss", test_loss}, {"train_loss", train_loss}, {"seconds", seconds}};
}

Json diagnose_event(int64_t step, double scale, const std::vector<amp::GradStats>& stats) {
  Json j = {{"event", "diagnose"}, {"step", step}, {"scale", scale}};
  for (const amp::GradStats& g : stats)
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
  return j;
}

Json rounding_event(int64_t step, const optim::Optimizer::RoundingStats& r, const amp::Precision& p) {
  return {{"event", "rounding"},        {"step", step},
          {"updates", r.changed},       {"unchanged_16bit", r.unchanged_16bit},
          {"master", p.master_weights}, {"stochastic_rounding", p.stochastic_rounding}};
}

Json summary_event(const Session& s, int64_t steps, double wall_seconds, double samples_per_s, double test_accuracy) {
  Json j = {{"event", "summary"},
            {"precision", s.opt.precision.name},
            {"model", s.opt.model.name},
            {"device", s.opt.device.str()},
            {"steps", steps},
            {"wall_seconds", wall_seconds},
            {"samples_per_s", samples_per_s},
            {"test_accuracy", test_accuracy}};
  j["deterministic"] = s.opt.deterministic;
  j["world_size"] = world_size();  // the ranks of an mpirun job (samples_per_s is the job's); 1 alone
  j["skipped_steps"] = s.scaler->num_skipped_steps();
  j["final_scale"] = s.scaler->get_scale();
  j["peak_bytes"] = peak_memory_json(s.opt.device);
  return j;
}

MetricsWriter::MetricsWriter(std::string path, std::optional<KeepUpTo> keep) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::string kept;
  if (keep) {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("event")) break;  // a line cut by a kill, and all after it
      const bool before = j.contains("step")    ? j["step"].get<int64_t>() <= keep->step
                          : j.contains("epoch") ? j["epoch"].get<int64_t>() <= keep->epoch
                                                : false;
      if (before) kept += line + "\n";
    }
  }
  file_.open(path_, std::ios::trunc);
  MIXPREC_CHECK(file_.good(), "--metrics: cannot write ", path_);
  file_ << kept;
}

void MetricsWriter::write(const Json& event) {
  if (enabled()) file_ << event.dump() << "\n";
}

void MetricsWriter::flush() {
  if (enabled()) file_.flush();
}

void MetricsWriter::check() const {
  MIXPREC_CHECK(!enabled() || file_.good(), "--metrics: writing ", path_, " failed");
}

}  // namespace mixprec::cli
