// The commands on a gpt checkpoint: `mixprec sample` (text from the model, nanoGPT's generate:
// temperature, top-k, a seeded draw per token) and `mixprec eval` of a gpt checkpoint (the
// validation loss). The model comes from the checkpoint's metadata: its flags and vocabulary.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "evaluate.h"
#include "metrics.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/checkpoint.h"
#include "mixprec/deterministic.h"
#include "mixprec/error.h"
#include "mixprec/io.h"
#include "mixprec/random.h"
#include "mixprec/text.h"
#include "models.h"
#include "session.h"
#include "train.h"

namespace mixprec::cli {
namespace {

const char* const kGptModelKeys[] = {"model", "layers", "heads", "d-model", "block-size", "dropout"};

// A gpt checkpoint's model, on `device` in `precision`, in eval mode, with its vocabulary.
struct GptCheckpoint {
  ModelSpec spec;
  data::Vocabulary vocab;
  std::shared_ptr<nn::Module> model;
};

GptCheckpoint load_gpt(const io::SafetensorsFile& f, const std::string& path, const amp::Precision& precision,
                       const Device& device) {
  const auto model = f.metadata.find("model");
  MIXPREC_CHECK(model != f.metadata.end() && model->second == "gpt", path, " holds ",
                model == f.metadata.end() ? "no model named in its metadata" : "a " + model->second + " model",
                ": a gpt checkpoint (train --model gpt --save) is needed");
  Flags flags;
  for (const char* k : kGptModelKeys) flags[k] = metadata_str(f.metadata, k, path);
  GptCheckpoint g;
  g.spec = model_from_flags(flags, path);
  g.vocab = data::Vocabulary::from_utf8(metadata_str(f.metadata, "vocab", path), path + " (metadata 'vocab')");
  g.spec.vocab_size = g.vocab.size();
  g.model = build_model(g.spec);
  amp::apply_precision(*g.model, precision);
  Checkpoint::load_model(*g.model, Checkpoint::model_tensors(f.tensors), path);
  g.model->to(device);
  g.model->eval();
  return g;
}

// The next token from the last position's logits: divided by the temperature, cut to the top k
// (ties with the k-th kept, as nanoGPT's `logits < v[-1]`), softmax in f64, one uniform draw.
int64_t draw_token(const std::vector<float>& logits, double temperature, int64_t top_k, Generator& gen) {
  std::vector<double> z(logits.size());
  for (size_t i = 0; i < z.size(); ++i) z[i] = double(logits[i]) / temperature;
  double threshold = -INFINITY;
  if (top_k > 0 && size_t(top_k) < z.size()) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    threshold = sorted[size_t(top_k - 1)];
  }
  const double max = *std::max_element(z.begin(), z.end());
  std::vector<double> cumulative(z.size());
  double total = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    total += z[i] < threshold ? 0.0 : std::exp(z[i] - max);
    cumulative[i] = total;
  }
  const double u = gen.uniform() * total;
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  return it == cumulative.end() ? int64_t(z.size()) - 1 : int64_t(it - cumulative.begin());
}

struct SampleFlags {
  std::string checkpoint, prompt = "\n", device = "cpu", precision;
  int64_t tokens = 500, top_k = 200, seed = 1337, threads = 0;
  bool deterministic = false;
  double temperature = 0.8;
};

int cmd_sample(const Command& c, const SampleFlags& s) {
  silence_follower_rank();  // under mpirun every rank draws the same text; rank 0 prints it
  const std::string& path = s.checkpoint;
  const std::string& prompt = s.prompt;
  const int64_t tokens = s.tokens, top_k = s.top_k;
  const double temperature = s.temperature;
  const uint64_t seed = uint64_t(s.seed);
  const Device device = resolve_device(s.device);
  const io::SafetensorsFile f = io::load_safetensors(path);
  const Precision precision = checkpoint_precision(s.precision, f.metadata, device);
  const int threads = int(c.has("threads") ? s.threads : available_cores());

  omp_set_num_threads(threads);
  use_deterministic_algorithms(s.deterministic);
  const GptCheckpoint g = load_gpt(f, path, precision, device);
  std::vector<int64_t> idx = g.vocab.encode(data::decode_utf8(prompt, "--prompt"), "--prompt");
  MIXPREC_CHECK(!idx.empty(), "--prompt is empty: the model needs at least one character to continue");
  Generator gen(seed);
  autograd::NoGradGuard no_grad;
  std::fputs(prompt.c_str(), stdout);
  for (int64_t n = 0; n < tokens; ++n) {
    // The context cropped to the model's block size, as nanoGPT's generate does.
    const int64_t T = std::min<int64_t>(int64_t(idx.size()), g.spec.block_size);
    const std::vector<int64_t> context(idx.end() - T, idx.end());
    Tensor logits;
    {
      amp::Autocast ac(device.type, precision.autocast_dtype, precision.autocast);
      logits = (*g.model)(Tensor::from_vector(context, {1, T}).to(device));  // [1, T, V]
    }
    const int64_t next = draw_token(logits.slice(1, T - 1, T).to_vector(), temperature, top_k, gen);
    idx.push_back(next);
    std::fputs(g.vocab.decode({next}).c_str(), stdout);
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace

int eval_gpt(const Command& c, const GptEvalFlags& e, const std::string& device_name, const std::string& precision_name,
             bool json, int64_t threads_flag, const io::SafetensorsFile& f, const std::string& path) {
  for (const char* k : {"model", "hidden", "channels", "layers", "heads", "d-model", "block-size", "dropout"})
    MIXPREC_CHECK(!c.given(k), "--", k, ": ", path, " is a gpt checkpoint, whose model comes from its metadata");
  const Device device = resolve_device(device_name);
  const Precision precision = checkpoint_precision(precision_name, f.metadata, device);
  const std::string text_path = c.has("text")              ? e.text
                                : f.metadata.count("text") ? f.metadata.at("text")
                                                           : std::string(data::kDefaultTextPath);
  const int64_t batches = c.has("eval-batches")              ? e.eval_batches
                          : f.metadata.count("eval-batches") ? metadata_int(f.metadata, "eval-batches", path)
                                                             : 50;
  const int threads = int(c.has("threads") ? threads_flag : available_cores());

  const data::TextCorpus text = data::load_text(text_path);
  omp_set_num_threads(threads);
  const GptCheckpoint g = load_gpt(f, path, precision, device);
  MIXPREC_CHECK(text.vocab == g.vocab, text_path, " has another vocabulary (", text.vocab.size(),
                " characters) than the model of ", path, " (", g.vocab.size(), "): evaluate it on its own text");
  text.check_block_size(g.spec.block_size);
  const double loss = validation_loss(*g.model, precision, text, g.spec.block_size, batches, device);
  if (json) {
    const Json j = {
        {"checkpoint", path}, {"model", "gpt"},          {"precision", precision.name},     {"device", device.str()},
        {"text", text_path},  {"eval_batches", batches}, {"block_size", g.spec.block_size}, {"val_loss", loss}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: validation loss %.4f (%lld batches of %lld x %lld); model gpt, precision %s, text %s\n",
                path.c_str(), loss, (long long)batches, (long long)data::kValBatchSize, (long long)g.spec.block_size,
                precision.name.c_str(), text_path.c_str());
  }
  return 0;
}

std::function<int()> declare_sample(Command& c) {
  auto s = std::make_shared<SampleFlags>();
  c.text("checkpoint", s->checkpoint, "FILE", "a gpt checkpoint (train --model gpt --save)");
  c.required("checkpoint");
  c.text("prompt", s->prompt, "TEXT", "the text to continue", "a newline");
  c.integer("tokens", s->tokens, 0, 1 << 24, "characters to generate");
  c.real("temperature", s->temperature, 0.0, 1e6, "divides the logits", /*lo_open=*/true);
  c.integer("top-k", s->top_k, 0, INT64_MAX, "draw from the N likeliest characters; 0: all");
  c.integer("seed", s->seed, 0, INT64_MAX, "the same seed gives the same text");
  add_device_flag(c, s->device);
  c.choice("precision", s->precision, precision_choices(), "run the model in this precision", "the checkpoint's");
  add_threads_flag(c, s->threads);
  add_deterministic_flag(c, s->deterministic);
  return [s, &c] { return cmd_sample(c, *s); };
}

}  // namespace mixprec::cli
