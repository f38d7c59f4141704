// `mixprec train --model gpt`: a character-level GPT trained for --steps steps on a text (Moby Dick
// by default), batches drawn by the seeded offsets of mixprec/text.h, the validation loss every
// --eval-every steps and at the last; checkpoints at each evaluation (and --save-every) that
// --resume continues bit-exactly.
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "evaluate.h"
#include "metrics.h"
#include "mixprec/autograd.h"
#include "mixprec/checkpoint.h"
#include "mixprec/error.h"
#include "mixprec/text.h"
#include "progress.h"
#include "train.h"
#include "train_loop.h"

namespace mixprec::cli {
namespace {

class GptRun : StepLoop {
 public:
  GptRun(Session& s, const TrainOptions& o, const data::TextCorpus& text, MetricsWriter& metrics, const RunState& start,
         Flags checkpoint_metadata)
      : StepLoop(s, o, metrics, o.steps, start.step, ProgressPrinter(0, o.steps, o.quiet),
                 std::move(checkpoint_metadata)),
        text_(text),
        samples_(start.samples),
        train_seconds_(start.train_seconds),
        val_loss_(start.test_loss) {}

  TrainResult run() {
    const auto t_start = Clock::now();
    TrainResult result;
    const int64_t B = s_.opt.batch_size, T = s_.opt.model.block_size;
    int64_t process_samples = 0;
    double process_seconds = 0, loss_sum = 0;
    while (step_ < o_.steps) {
      const auto t_step = Clock::now();
      const int64_t i = step_ + 1;
      const bool report = report_due(i, i);
      // Training step s (0-based) takes rows s * B .. s * B + B - 1 of the seed's sequence.
      const data::TextBatch b =
          data::text_batch(text_, data::TextSplit::train, s_.opt.seed, uint64_t(step_ * B), B, T, s_.opt.device);
      StepResult r = run_step(b.x, b.y, report);
      process_seconds += seconds_since(t_step);
      samples_ += B, process_samples += B;
      finish_step(0, i, process_samples, process_seconds, std::move(r));
      if (report) report_steps(loss_sum);
      train_seconds_ += seconds_since(t_step);
      const bool eval = step_ % o_.eval_every == 0 || step_ == o_.steps;
      if (eval) evaluate_now();
      const bool stop = step_ == o_.stop_after_steps && step_ < o_.steps;
      if (eval || stop || (o_.save_every > 0 && step_ % o_.save_every == 0)) {
        report_steps(loss_sum);
        save_now();
      }
      if (stop) {
        std::printf("stopped after step %lld (--stop-after-steps)%s%s\n", (long long)step_,
                    o_.save_path.empty() ? "" : "; resume with --resume ", o_.save_path.c_str());
        metrics_.check();
        result.stopped = true;
        return result;
      }
    }
    report_steps(loss_sum);
    const double wall = seconds_since(t_start);
    const double sps = double(samples_) / train_seconds_;
    char line[64];
    std::snprintf(line, sizeof line, "final validation loss %.4f", val_loss_);
    if (!o_.quiet) print_done(s_, step_, wall, train_seconds_, sps, line, scale_trace_, o_.diagnose > 0);
    Json summary = summary_event(s_, step_, wall, sps, 0.0);
    summary.erase("test_accuracy");
    summary["val_loss"] = val_loss_;
    metrics_.write(summary);
    metrics_.check();
    result.steps = step_;
    result.wall_seconds = wall;
    result.train_seconds = train_seconds_;
    result.samples_per_s = sps;
    result.val_loss = val_loss_;
    return finish_result(s_, result);
  }

 private:
  void evaluate_now() {
    const auto t0 = Clock::now();
    val_loss_ =
        validation_loss(*s_.model, s_.opt.precision, text_, s_.opt.model.block_size, o_.eval_batches, s_.opt.device);
    if (!o_.quiet) {
      std::printf("step %lld: validation loss %.4f (%lld batches, %.1f s)\n", (long long)step_, val_loss_,
                  (long long)o_.eval_batches, seconds_since(t0));
      std::fflush(stdout);
    }
    metrics_.write(eval_event(step_, val_loss_));
    metrics_.flush();
  }

  void save_now() {
    RunState r;
    r.step = step_;
    r.samples = samples_;
    r.train_seconds = train_seconds_;
    r.test_loss = val_loss_;  // the latest validation loss
    save(r);
  }

  const data::TextCorpus& text_;
  int64_t samples_;       // over the whole run
  double train_seconds_;  // without the evaluations
  double val_loss_;       // the latest evaluation's
};

}  // namespace

TrainResult train_gpt(SessionOptions opt, const TrainOptions& o, const std::string& resume,
                      const io::SafetensorsFile* ckpt) {
  // Data first: a missing or broken file fails before any model is built.
  const data::TextCorpus text = data::load_text(o.text_path);
  text.check_block_size(opt.model.block_size);
  opt.model.vocab_size = text.vocab.size();
  DataFacts facts;
  facts.vocab = text.vocab.to_utf8();
  facts.text_chars = int64_t(text.tokens.size());
  if (ckpt) {
    const std::string& vocab = metadata_str(ckpt->metadata, "vocab", resume);
    const int64_t chars = metadata_int(ckpt->metadata, "text-chars", resume);
    MIXPREC_CHECK(vocab == facts.vocab && chars == facts.text_chars, "--resume ", resume,
                  ": its run trained on a text of ", chars, " characters over ",
                  data::decode_utf8(vocab, resume).size(), " distinct ones, ", o.text_path, " has ", facts.text_chars,
                  " over ", text.vocab.size(), ": a resumed run needs the same text");
  }
  MIXPREC_CHECK(o.lr_warmup < o.steps, "--lr-warmup ", o.lr_warmup, " must be shorter than the run of --steps ",
                o.steps);

  RunState start;
  Session s = start_session(opt, o.detect_anomaly, ckpt ? &*ckpt : nullptr, resume, start);
  if (ckpt) {
    MIXPREC_CHECK(start.step <= o.steps, resume, ": run.step ", start.step, " is past the run of --steps ", o.steps);
    MIXPREC_CHECK(o.stop_after_steps == 0 || o.stop_after_steps > start.step, "--stop-after-steps ", o.stop_after_steps,
                  ": ", resume, " is at step ", start.step, " already");
  }
  // Last, as it rewrites the metrics file: a resumed run keeps the lines up to its checkpoint.
  MetricsWriter metrics(o.metrics_path, ckpt ? std::optional<MetricsWriter::KeepUpTo>({start.step, 0}) : std::nullopt);
  char data_line[512];
  std::snprintf(data_line, sizeof data_line,
                "data: %s, %zu characters (vocabulary %lld), %lld train / %lld validation; %lld steps of %lld x %lld",
                o.text_path.c_str(), text.tokens.size(), (long long)text.vocab.size(), (long long)text.train_size,
                (long long)text.split_size(data::TextSplit::val), (long long)o.steps, (long long)opt.batch_size,
                (long long)opt.model.block_size);
  if (!o.quiet) print_header(s, data_line, o.detect_anomaly);
  if (ckpt) std::printf("resumed from %s: step %lld\n", resume.c_str(), (long long)start.step);
  return GptRun(s, o, text, metrics, start, checkpoint_metadata(opt, o, facts)).run();
}

}  // namespace mixprec::cli
