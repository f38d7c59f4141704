// `mixprec eval` (a checkpoint's test accuracy and loss) and `mixprec export` (its model tensors
// alone, for other tools). Both read a training checkpoint, an export, or a PyTorch state_dict
// saved as safetensors (whose model then comes from --model/--hidden/--channels).
#include <omp.h>

#include <cstdio>
#include <string>

#include "commands.h"
#include "evaluate.h"
#include "metrics.h"
#include "mixprec/checkpoint.h"
#include "mixprec/deterministic.h"
#include "mixprec/error.h"
#include "mixprec/io.h"
#include "mixprec/text.h"
#include "models.h"
#include "session.h"
#include "train.h"

namespace mixprec::cli {
namespace {

// What a file's metadata says about its model: the flags that build it, and the data it expects.
const char* const kModelKeys[] = {"model", "hidden", "channels", "layers", "heads", "d-model", "block-size", "dropout"};
const char* const kExportKeys[] = {"model",     "hidden",     "channels",  "image-rows", "image-cols", "num-classes",
                                   "norm-mean", "norm-std",   "precision", "data",       "layers",     "heads",
                                   "d-model",   "block-size", "dropout",   "vocab",      "text"};

Flags model_flags(const Flags& metadata) {
  Flags f;
  for (const char* k : kModelKeys)
    if (metadata.count(k)) f[k] = metadata.at(k);
  return f;
}

// The model a file's metadata names.
ModelSpec stored_model(const Flags& metadata, const std::string& path) {
  ModelSpec spec = model_from_flags(model_flags(metadata), path);
  if (metadata.count("image-rows")) spec.image_rows = metadata_int(metadata, "image-rows", path);
  if (metadata.count("image-cols")) spec.image_cols = metadata_int(metadata, "image-cols", path);
  if (spec.is_gpt() && metadata.count("vocab"))
    spec.vocab_size = data::Vocabulary::from_utf8(metadata.at("vocab"), path).size();
  return spec;
}

struct EvalFlags {
  std::string checkpoint, data, precision, device = "cpu";
  ModelFlags model;
  GptEvalFlags gpt;
  bool json = false;
  int64_t threads = 0;
  bool deterministic = false;
};

int cmd_eval(Command& c, const EvalFlags& e) {
  silence_follower_rank();  // under mpirun the batches are shared out (evaluate.h); rank 0 prints
  use_deterministic_algorithms(e.deterministic);
  const std::string& path = e.checkpoint;
  const io::SafetensorsFile f = io::load_safetensors(path);
  if (f.metadata.count("model") && f.metadata.at("model") == "gpt")
    return eval_gpt(c, e.gpt, e.device, e.precision, e.json, e.threads, f, path);
  // The model the flags (over the file's metadata) describe; an explicit flag that contradicts
  // the metadata is refused, naming both.
  const Flags stored = model_flags(f.metadata);
  c.take_defaults(stored, path);
  ModelSpec spec = resolve_model(e.model, c);
  const Flags now = model_setting_flags(spec);
  for (const auto& [k, v] : stored)
    if (c.given(k) && now.count(k))
      MIXPREC_CHECK(now.at(k) == v, "--", k, " ", now.at(k), ": ", path, " holds a model with ", k, " ", v);
  // The device is this command's choice (CPU by default), whatever the training ran on.
  const Device device = resolve_device(e.device);
  // The precision it trained in by default; another one evaluates the same weights that way.
  const Precision precision = checkpoint_precision(e.precision, f.metadata, device);
  const std::string data_dir = c.has("data")              ? e.data
                               : f.metadata.count("data") ? f.metadata.at("data")
                                                          : std::string(data::kDefaultDataDir);
  const bool json = e.json;
  const int threads = int(c.has("threads") ? e.threads : available_cores());

  const data::Dataset test = data::load_idx_dataset(data_dir, "t10k");
  spec.image_rows = test.rows;
  spec.image_cols = test.cols;
  // The training run's normalisation where the file records it, else the data set's.
  data::Normalize norm = data::kFashionMnistNorm;
  if (f.metadata.count("norm-mean") && f.metadata.count("norm-std"))
    norm = {std::stof(f.metadata.at("norm-mean")), std::stof(f.metadata.at("norm-std"))};
  else if (data_dir != data::kDefaultDataDir)
    norm = data::compute_normalize(data::load_idx_dataset(data_dir, "train"));

  omp_set_num_threads(threads);
  std::shared_ptr<nn::Module> model = build_model(spec);
  amp::apply_precision(*model, precision);
  Checkpoint::load_model(*model, Checkpoint::model_tensors(f.tensors), path);
  model->to(device);
  const EvalResult r = evaluate(*model, precision, test, norm, device);
  if (json) {
    const Json j = {{"checkpoint", path},          {"model", spec.name}, {"precision", precision.name},
                    {"device", device.str()},      {"data", data_dir},   {"test_samples", test.size},
                    {"test_accuracy", r.accuracy}, {"test_loss", r.loss}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: test accuracy %.2f %% (%lld images), loss %.4f; model %s, precision %s, data %s\n", path.c_str(),
                100 * r.accuracy, (long long)test.size, r.loss, spec.name.c_str(), precision.name.c_str(),
                data_dir.c_str());
  }
  return 0;
}

int cmd_export(const std::string& path, const std::string& out, const std::string& dtype_name) {
  const io::SafetensorsFile f = io::load_safetensors(path);
  StateDict tensors = Checkpoint::model_tensors(f.tensors);
  MIXPREC_CHECK(!tensors.empty(), path, " holds no model tensors");
  // A file that names its model must hold that model: checked before anything is written.
  if (f.metadata.count("model")) Checkpoint::load_model(*build_model(stored_model(f.metadata, path)), tensors, path);
  if (dtype_name != "as-stored") {
    const DType dtype = dtype_name == "f32" ? DType::f32 : dtype_name == "bf16" ? DType::bf16 : DType::f16;
    for (auto& [name, t] : tensors)
      if (is_floating(t.dtype())) t = t.to(dtype);  // integer buffers (num_batches_tracked) stay
  }
  Flags metadata = {{"format", "pt"}};
  for (const char* k : kExportKeys)
    if (f.metadata.count(k)) metadata[k] = f.metadata.at(k);
  io::save_safetensors(out, tensors, metadata);
  std::printf("%s: %zu model tensors%s from %s\n", out.c_str(), tensors.size(),
              dtype_name == "as-stored" ? "" : (" as " + dtype_name).c_str(), path.c_str());
  return 0;
}

}  // namespace

std::function<int()> declare_eval(Command& c) {
  auto e = std::make_shared<EvalFlags>();
  c.text("checkpoint", e->checkpoint, "FILE",
         "a training checkpoint (train --save), an export, or a PyTorch state_dict in safetensors");
  c.required("checkpoint");
  c.text("data", e->data, "DIR", "the test set's idx files", "the run's, else " + std::string(data::kDefaultDataDir));
  c.choice("precision", e->precision, precision_choices(), "evaluate the weights in this precision",
           "the checkpoint's");
  add_device_flag(c, e->device);
  c.flag("json", e->json, "print one JSON object");
  add_threads_flag(c, e->threads);
  add_deterministic_flag(c, e->deterministic);
  c.group("the model, for a file that does not name it (a PyTorch state_dict)");
  add_model_flags(c, e->model);
  c.group("gpt model (--model gpt)", {"gpt"});
  c.text("text", e->gpt.text, "FILE", "the validation text", "the run's");
  c.integer("eval-batches", e->gpt.eval_batches, 1, 1 << 20, "validation batches of 32 x block size", "the run's");
  c.group("Options");
  return [e, &c] { return cmd_eval(c, *e); };
}

std::function<int()> declare_export(Command& c) {
  struct ExportFlags {
    std::string checkpoint, out, dtype = "as-stored";
  };
  auto e = std::make_shared<ExportFlags>();
  c.text("checkpoint", e->checkpoint, "FILE", "a checkpoint, an export or a PyTorch state_dict");
  c.required("checkpoint");
  c.text("out", e->out, "FILE", "the safetensors file to write");
  c.required("out");
  c.choice("dtype", e->dtype, {"as-stored", "f32", "bf16", "f16"}, "the floating tensors' dtype");
  return [e] { return cmd_export(e->checkpoint, e->out, e->dtype); };
}

}  // namespace mixprec::cli
