// The flags of `mixprec train` beyond the ones it shares with bench (session.h), and what a
// checkpoint records of a run: its settings as flags, and where it stopped.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "cli.h"
#include "mixprec/data.h"
#include "mixprec/io.h"
#include "mixprec/state_dict.h"
#include "mixprec/text.h"
#include "session.h"

namespace mixprec::cli {

struct TrainOptions {
  int64_t epochs = 5;  // the image models' run
  std::string data_dir = data::kDefaultDataDir, metrics_path;
  // ---- gpt: a run of steps on a text, evaluated every eval_every steps and at the last ----
  int64_t steps = 2000;
  int64_t eval_every = 250;
  int64_t eval_batches = 50;  // validation batches of data::kValBatchSize rows
  std::string text_path = data::kDefaultTextPath;
  double min_lr = 0;      // where the cosine schedule ends
  int64_t log_every = 1;  // a metrics line every K steps
  bool detect_anomaly = false;
  int64_t diagnose = 0;  // gradient statistics every K steps; 0: off
  std::string lr_schedule = "cosine";
  int64_t lr_warmup = 0;
  // ---- checkpoints ----
  std::string save_path;         // --save: a checkpoint at each epoch end (and every save_every steps)
  int64_t save_every = 0;        // 0: at epoch ends only
  int64_t stop_after_steps = 0;  // stop (after saving) at this step, as a preempted job; 0: run to the end
  bool quiet = false;            // compare: no header, progress, epoch or closing lines
};

// How a run ended: what compare tabulates.
struct TrainResult {
  int64_t steps = 0;  // optimizer steps over the run
  int64_t epochs = 0;
  double wall_seconds = 0, train_seconds = 0;  // train: without the evaluations (this process's part)
  double samples_per_s = 0;
  double test_accuracy = 0, test_loss = 0;  // the image models' last evaluation
  double val_loss = 0;                      // the gpt's
  int64_t skipped_steps = 0;
  double final_scale = 1;
  int64_t peak_bytes = 0, peak_activation_bytes = 0;  // the device's peak, and the activations' share at it
  bool stopped = false;                               // --stop-after-steps
};
// The flags of a run: --epochs and --data for the image models, --steps, --eval-every,
// --eval-batches, --text and --min-lr for the gpt, the rest for every model. With `resume` (one
// run, train's): --metrics, --save, --save-every, --resume (into *resume), --stop-after-steps.
void add_train_flags(Command& c, TrainOptions& o, std::string* resume);
// The model's recipe where --lr-warmup and --min-lr were not given; the flags' consistency.
TrainOptions resolve_train_options(const TrainOptions& given, const std::string& model, const Command& c);

// A run's settings as the flags that give them, with canonical values (a shortest round-trip
// number, a resolved preset name), so that two runs' settings compare as strings. These are the
// settings a resumed run must keep: everything but threads and data.
Flags setting_flags(const SessionOptions& s, const TrainOptions& o);

// Where a run stopped (the "run." entries of its checkpoint; the rest is the Checkpoint's).
struct RunState {
  int64_t epochs_done = 0;   // whole epochs trained and evaluated
  int64_t batches_done = 0;  // batches of epoch epochs_done + 1 already trained
  int64_t step = 0;          // optimizer steps over the run (= batches trained)
  int64_t samples = 0;
  double epoch_loss_sum = 0;                // the losses of the batches_done batches, for the epoch's train loss
  double train_seconds = 0;                 // training time so far (without the evaluations)
  double test_accuracy = 0, test_loss = 0;  // the latest evaluation
};
StateDict run_state_dict(const RunState& r);
RunState load_run_state(const StateDict& checkpoint, const std::string& path);

// What a training checkpoint's metadata holds: the setting flags, threads and data, the data's
// shape and normalisation, and the format's name. A gpt checkpoint records the text and its
// vocabulary instead ("vocab": the characters in order, as UTF-8; "text-chars": the text's length).
struct DataFacts {
  int64_t train_samples = 0, rows = 28, cols = 28;
  data::Normalize norm;
  std::string vocab;       // gpt
  int64_t text_chars = 0;  // gpt
};
Flags checkpoint_metadata(const SessionOptions& s, const TrainOptions& o, const DataFacts& d);

// The image data of a run: the train and test sets of `dir` (the same image size), and their
// shape and normalisation (Fashion-MNIST's own for the default directory, else the train set's).
struct ImageData {
  data::Dataset train, test;
  DataFacts facts;
};
ImageData load_image_data(const std::string& dir);
// A run of an image model on `d` (facts: the normalisation to use), from the start or from a
// --resume checkpoint (`ckpt`, read from `resume`, whose settings the caller has checked).
TrainResult train_images(const SessionOptions& opt, const TrainOptions& o, const data::Dataset& train,
                         const data::Dataset& test, const DataFacts& facts, const io::SafetensorsFile* ckpt,
                         const std::string& resume);

// For --resume: the flags of the checkpoint's metadata (settings, threads, data; throws when the
// file is no training checkpoint), the data facts it recorded, and the check that the resumed
// run's settings are the stored ones (an explicit flag that differs is named in the error).
Flags stored_run_flags(const Flags& metadata, const std::string& path);
DataFacts stored_data_facts(const Flags& metadata, const std::string& path);
void check_same_settings(const Flags& stored, const Flags& now, const Command& c, const std::string& path);
// Metadata `key` as an integer >= 0; throws naming the file when it is absent or malformed.
int64_t metadata_int(const Flags& metadata, const std::string& key, const std::string& path);
// --precision (`given`, when the command line gives it), by default the one a checkpoint's
// metadata names (fp32 where it names none): eval and sample evaluate the weights as they
// trained, or another way when asked.
Precision checkpoint_precision(const std::string& given, const Flags& metadata, const Device& device);
// Metadata `key`; throws naming the file when it is absent.
const std::string& metadata_str(const Flags& metadata, const std::string& key, const std::string& path);

}  // namespace mixprec::cli

namespace mixprec::cli {
// `train --model gpt`: the step loop on a text (train_gpt.cpp), from the start or from a --resume
// checkpoint (`ckpt`, read from `resume`, whose settings the caller has checked).
TrainResult train_gpt(SessionOptions opt, const TrainOptions& o, const std::string& resume,
                      const io::SafetensorsFile* ckpt);
// The run's result from the session's end state (scaler, the device's peak memory).
TrainResult finish_result(const Session& s, TrainResult r);
}  // namespace mixprec::cli
