// What a training checkpoint records of its run (the settings as flags, the data's shape and
// normalisation, where the run stopped) and the reading back that --resume does.
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "mixprec/error.h"
#include "train.h"

namespace mixprec::cli {
namespace {

constexpr const char* kFormatKey = "mixprec";
constexpr const char* kFormatValue = "training checkpoint 1";

// The shortest decimal that reads back as the same double (or float).
template <class T>
std::string shortest(T x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

// Flags beside the settings that a checkpoint records and a resumed run takes as its defaults.
constexpr const char* kRunFlags[] = {"threads", "data", "text"};

}  // namespace

Precision checkpoint_precision(const std::string& given, const Flags& metadata, const Device& device) {
  if (!given.empty()) return resolve_precision(given, device);
  const auto it = metadata.find("precision");
  const std::string name = it != metadata.end() ? it->second : "fp32";
  for (const std::string& c : precision_choices())
    if (c == name) return resolve_precision(name, device);
  throw Error(detail::concat("the checkpoint's metadata names precision '", name, "', which is no preset"));
}

const std::string& metadata_str(const Flags& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  MIXPREC_CHECK(it != m.end(), path, ": the metadata has no '", key, "'");
  return it->second;
}

int64_t metadata_int(const Flags& m, const std::string& key, const std::string& path) {
  const std::string& v = metadata_str(m, key, path);
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && x >= 0, path, ": metadata '", key, "' is '", v,
                "', expected an integer >= 0");
  return x;
}

namespace {

float meta_float(const Flags& m, const std::string& key, const std::string& path) {
  const std::string& v = metadata_str(m, key, path);
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  MIXPREC_CHECK(!v.empty() && *end == '\0' && std::isfinite(x), path, ": metadata '", key, "' is '", v,
                "', expected a number");
  return x;
}

}  // namespace

Flags setting_flags(const SessionOptions& s, const TrainOptions& o) {
  Flags f = model_setting_flags(s.model);
  if (s.model.is_gpt()) {
    f["beta2"] = shortest(s.beta2);
    f["steps"] = std::to_string(o.steps);
    f["eval-every"] = std::to_string(o.eval_every);
    f["eval-batches"] = std::to_string(o.eval_batches);
    f["min-lr"] = shortest(o.min_lr);
  } else {
    f["epochs"] = std::to_string(o.epochs);
  }
  f["precision"] = s.precision.name;  // resolved: never "auto"
  // Only the presets without a master copy accept the flag.
  if (s.precision.param_dtype != DType::f32 && !s.precision.master_weights)
    f["stochastic-rounding"] = s.precision.stochastic_rounding ? "true" : "false";
  const amp::GradScalerOptions& sc = s.scaler;
  f["loss-scale"] = !sc.enabled ? "none" : sc.dynamic ? "dynamic" : "static:" + shortest(sc.init_scale);
  if (sc.enabled && sc.dynamic) {
    f["init-scale"] = shortest(sc.init_scale);
    f["growth-interval"] = std::to_string(sc.growth_interval);
    f["hysteresis"] = std::to_string(sc.hysteresis);
  }
  f["optimizer"] = s.optimizer;
  f["lr"] = shortest(s.lr);
  f["weight-decay"] = shortest(s.weight_decay);
  f["momentum"] = shortest(s.momentum);
  f["batch-size"] = std::to_string(s.batch_size);
  f["accumulate"] = std::to_string(s.accumulate);
  f["clip-grad-norm"] = shortest(s.clip_grad_norm);
  f["clip-grad-value"] = shortest(s.clip_grad_value);
  f["loss-weight"] = shortest(s.loss_weight);
  f["seed"] = std::to_string(s.seed);
  f["lr-schedule"] = o.lr_schedule;
  f["lr-warmup"] = std::to_string(o.lr_warmup);
  return f;
}

Flags checkpoint_metadata(const SessionOptions& s, const TrainOptions& o, const DataFacts& d) {
  Flags m = setting_flags(s, o);
  m["threads"] = std::to_string(s.threads);
  m["format"] = "pt";  // the safetensors convention for tensors in PyTorch's names and layouts
  m[kFormatKey] = kFormatValue;
  if (s.model.is_gpt()) {
    m["text"] = o.text_path;
    m["text-chars"] = std::to_string(d.text_chars);
    m["vocab"] = d.vocab;
    return m;
  }
  m["data"] = o.data_dir;
  m["train-samples"] = std::to_string(d.train_samples);
  m["image-rows"] = std::to_string(d.rows);
  m["image-cols"] = std::to_string(d.cols);
  m["num-classes"] = std::to_string(s.model.num_classes);
  m["norm-mean"] = shortest(d.norm.mean);
  m["norm-std"] = shortest(d.norm.std);
  return m;
}

Flags stored_run_flags(const Flags& metadata, const std::string& path) {
  const auto it = metadata.find(kFormatKey);
  MIXPREC_CHECK(it != metadata.end() && it->second == kFormatValue, path,
                " is not a mixprec training checkpoint (its metadata has no '", kFormatKey, ": ", kFormatValue,
                "'): --resume needs a file written by train --save");
  // The setting names are those setting_flags writes for some run: take every metadata key that
  // a default run's settings, or the optional loss-scale and rounding ones, would name.
  Flags f;
  for (const auto& [k, v] : metadata) {
    static const Flags names = [] {
      SessionOptions s;
      s.scaler.enabled = true;
      s.precision.param_dtype = DType::bf16;
      Flags all = setting_flags(s, TrainOptions{});
      s.model.name = "gpt";
      all.merge(setting_flags(s, TrainOptions{}));
      return all;
    }();
    bool run_flag = false;
    for (const char* r : kRunFlags) run_flag = run_flag || k == r;
    if (names.count(k) || run_flag) f[k] = v;
  }
  return f;
}

DataFacts stored_data_facts(const Flags& metadata, const std::string& path) {
  DataFacts d;
  d.train_samples = metadata_int(metadata, "train-samples", path);
  d.rows = metadata_int(metadata, "image-rows", path);
  d.cols = metadata_int(metadata, "image-cols", path);
  d.norm.mean = meta_float(metadata, "norm-mean", path);
  d.norm.std = meta_float(metadata, "norm-std", path);
  MIXPREC_CHECK(d.norm.std > 0, path, ": metadata 'norm-std' must be > 0");
  return d;
}

void check_same_settings(const Flags& stored, const Flags& now, const Command& c, const std::string& path) {
  Flags keys = stored;
  keys.insert(now.begin(), now.end());
  for (const auto& entry : keys) {
    const std::string& k = entry.first;
    bool run_flag = false;
    for (const char* r : kRunFlags) run_flag = run_flag || k == r;
    if (run_flag) continue;
    const auto s = stored.find(k), n = now.find(k);
    const std::string sv = s == stored.end() ? "(unset)" : s->second, nv = n == now.end() ? "(unset)" : n->second;
    if (sv == nv) continue;
    if (c.given(k))
      throw Error(detail::concat("--", k, " ", nv, " differs from the checkpoint's ", sv, " (", path,
                                 "): a resumed run keeps the settings it started with"));
    throw Error(detail::concat("the flags given change --", k, " from the checkpoint's ", sv, " to ", nv, " (", path,
                               "): a resumed run keeps the settings it started with"));
  }
}

StateDict run_state_dict(const RunState& r) {
  return {{"run.epochs_done", state_i64(r.epochs_done)},
          {"run.batches_done", state_i64(r.batches_done)},
          {"run.step", state_i64(r.step)},
          {"run.samples", state_i64(r.samples)},
          {"run.epoch_loss_sum", Tensor::scalar(r.epoch_loss_sum, DType::f64)},
          {"run.train_seconds", Tensor::scalar(r.train_seconds, DType::f64)},
          {"run.test_accuracy", Tensor::scalar(r.test_accuracy, DType::f64)},
          {"run.test_loss", Tensor::scalar(r.test_loss, DType::f64)}};
}

RunState load_run_state(const StateDict& checkpoint, const std::string& path) {
  auto get = [&](const char* key, DType dtype) {
    const Tensor* t = find_state(checkpoint, key);
    MIXPREC_CHECK(t, path, ": no '", key, "' (a training checkpoint records where its run stopped)");
    MIXPREC_CHECK(t->dtype() == dtype && t->dim() == 0, path, ": '", key, "' is ", dtype_name(t->dtype()), " ",
                  shape_str(t->shape()), ", expected ", dtype_name(dtype), " []");
    return *t;
  };
  RunState r;
  r.epochs_done = state_to_i64(get("run.epochs_done", DType::i64));
  r.batches_done = state_to_i64(get("run.batches_done", DType::i64));
  r.step = state_to_i64(get("run.step", DType::i64));
  r.samples = state_to_i64(get("run.samples", DType::i64));
  r.epoch_loss_sum = get("run.epoch_loss_sum", DType::f64).item();
  r.train_seconds = get("run.train_seconds", DType::f64).item();
  r.test_accuracy = get("run.test_accuracy", DType::f64).item();
  r.test_loss = get("run.test_loss", DType::f64).item();
  MIXPREC_CHECK(r.epochs_done >= 0 && r.batches_done >= 0 && r.step >= 0 && r.samples >= 0, path,
                ": negative counts in run.*");
  return r;
}

}  // namespace mixprec::cli
