// What train and bench share: model/optimizer/precision/loss-scale flags, and one training step
// (micro-batches, GradScaler, clipping).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "cli.h"
#include "mixprec/device.h"
#if MIXPREC_WITH_MPI
#include "mixprec/dist.h"
#endif
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/optim.h"
#include "mixprec/precision.h"
#include "models.h"

namespace mixprec::cli {

struct Precision : amp::Precision {
  std::string why;  // for auto: what was detected
};

struct SessionOptions {
  Device device;           // where the model trains (built on the CPU, then moved)
  std::string device_why;  // for --device auto: what was found
  ModelSpec model;
  Precision precision;
  std::string optimizer = "adamw";
  double lr = 1e-3, weight_decay = 0.0, momentum = 0.9;
  double beta2 = 0.999;  // AdamW's
  int64_t batch_size = 512;
  uint64_t seed = 0;
  int threads = 1;
  bool deterministic = false;  // use_deterministic_algorithms (make_session sets it)
  // ---- mixed precision ----
  std::string loss_scale = "none";  // dynamic | static:N | none (resolved from the preset)
  amp::GradScalerOptions scaler;    // enabled unless loss_scale is none
  int64_t accumulate = 1;           // micro-batches per optimizer step (each batch is split)
  double clip_grad_norm = 0;        // 0: off
  double clip_grad_value = 0;       // 0: off
  double loss_weight = 1;           // the loss is multiplied by this before backward (gradients shrink with it)
  int64_t memory_limit = 0;         // the allocator's budget on the device, bytes (make_session sets it); 0: none
  // ---- data parallelism (mpirun -np N; docs/distributed.md) ----
  std::string reduce_dtype = "f32";  // f32 | bf16: how gradients travel
  int zero = 0;                      // ZeRO stage: 0, or 1 (optimizer state sharded across ranks)
};

// The model flags as given: --model, --hidden (mlp), --channels (cnn), the gpt's shape.
struct ModelFlags {
  std::string model = "mlp";
  std::vector<int64_t> hidden = {1024, 1024};
  std::vector<int64_t> channels = {8, 16};
  bool channels_last = false;
  int64_t layers = 4, heads = 4, d_model = 128, block_size = 128;
  double dropout = 0;
};
// The flags train, bench, compare and max-batch share, as given: resolve_session fills in what
// depends on others (the preset's loss scale, the model's recipe).
struct SessionFlags {
  std::string device = "cpu";
  ModelFlags model;
  std::string precision = "auto";
  bool stochastic_rounding = true;
  std::string loss_scale;  // empty: the preset's
  double init_scale = 65536;
  int64_t growth_interval = 2000, hysteresis = 1;
  std::string optimizer = "adamw";
  double lr = 0, weight_decay = 0, momentum = 0.9, beta2 = 0.999;
  int64_t batch_size = 0, accumulate = 1;
  double clip_grad_value = 0, clip_grad_norm = 0, loss_weight = 1;
  int64_t seed = 0, threads = 0;
  int64_t memory_limit = 0;  // bytes; 0: none
  bool deterministic = false;
  std::string reduce_dtype = "f32";
  int64_t zero = 0;
};

// --model and the flags of each model's shape, each in its model's help group.
void add_model_flags(Command& c, ModelFlags& f);
// The shared flags (add_model_flags included); without_precision: the command declares its own
// (compare and max-batch: --precisions).
void add_session_flags(Command& c, SessionFlags& f, bool with_precision = true);
void add_device_flag(Command& c, std::string& device);
void add_threads_flag(Command& c, int64_t& threads);
// --deterministic (mixprec/deterministic.h); the command calls use_deterministic_algorithms.
void add_deterministic_flag(Command& c, bool& deterministic);
// The model the flags describe; a flag of another model is refused (check_model_flags).
ModelSpec resolve_model(const ModelFlags& f, const Command& c);
// The model a checkpoint's metadata names (its flags: model, hidden, channels, the gpt's shape).
ModelSpec model_from_flags(const Flags& flags, const std::string& source);
// The flags that give `m`, with canonical values: as a checkpoint records them.
Flags model_setting_flags(const ModelSpec& m);
// The session the flags describe, with the model's recipe where --batch-size, --lr and the like
// were not given (c.has).
SessionOptions resolve_session(const SessionFlags& f, const Command& c);
// --device cpu|cuda|cuda:N|auto (and the test-only fenced): auto takes GPU 0 where there is one.
// Throws one line when the device asked for is not there (cuda::require).
Device resolve_device(const std::string& name, std::string* why = nullptr);
// The precision names --precision takes: auto and the presets.
std::vector<std::string> precision_choices();
// A preset by name; auto picks what `device` runs fastest (on a GPU: amp-bf16 from compute
// capability 8.0 on, amp-fp16 before; on the CPU and the fenced device, whose kernels are the
// CPU's: amp-bf16 where the CPU has AMX-BF16 or AVX512-BF16, else fp32).
Precision resolve_precision(const std::string& name, const Device& device = Device::cpu());
int available_cores();
std::string describe_loss_scale(const SessionOptions& opt);  // "dynamic (init 65536, growth every 2000)", "none"

struct Session {
  SessionOptions opt;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<amp::GradScaler> scaler;  // always present; disabled for --loss-scale none
  // Called after the backward pass of a step, before unscale/clip/step (the gradients still
  // carry the scale): the diagnostics hook.
  std::function<void()> after_backward;
  bool measure_grad_norm = false;  // fill StepResult::grad_norm (a read from the device)
  // Fill StepResult::scale and skipped (reads from the device: a GPU syncs). The CLI turns it off
  // on a device for the steps no line reports, so a step never waits for the host.
  bool host_values = true;
#if MIXPREC_WITH_MPI
  // Under mpirun with more than one rank (start_data_parallel): keeps the replicas in step; each
  // rank trains on its rows of every global batch. Null alone, and in a build without MPI.
  std::unique_ptr<dist::DataParallel> dp;
#endif
  // The optimizer that steps: the session's, or with --zero 1 this rank's shard of it.
  optim::Optimizer& stepping_optimizer();
};
// Sets the device allocator's budget (--memory-limit), seeds the generator, builds the model on the CPU (the same
// weights on every device), converts it to the preset's parameter dtype, moves it to the device, then builds the
// optimizer (which takes its f32 master copies there) and the GradScaler. The gpt's AdamW has nanoGPT's two parameter
// groups: weight decay on the parameters of dim >= 2 (embeddings, Linear weights), none on biases
// and LayerNorms.
Session make_session(const SessionOptions& opt);
// Under mpirun with more than one rank: wraps the model and optimizer in dist::DataParallel (rank
// 0's weights to every rank; --reduce-dtype, --zero) and makes the scaler agree across ranks. Call
// it after a checkpoint is loaded (every rank loads the same file). Alone: nothing.
void start_data_parallel(Session& s);
// This process's rank and the number of ranks (0 and 1 alone, or without MPI).
int world_rank();
int world_size();
// `values` summed over the ranks, in place (a collective under mpirun: every rank calls it with as
// many values; alone, nothing). In f64: sharded evaluation's counts and loss sums.
void sum_over_ranks(std::vector<double>& values);
// Under mpirun, on every rank but 0: stdout goes to /dev/null (rank 0 prints the job's output; an
// error still reaches stderr from any rank). Returns whether this process is such a follower.
bool silence_follower_rank();

// A step's loss as the device left it: each micro-batch's loss (a detached f32 scalar) with its
// weight. Reading it is a sync on a GPU, so the training loop reads a run of steps at once, at its
// logging interval (read_losses).
struct StepLoss {
  std::vector<std::pair<Tensor, double>> parts;
};
// The losses of `steps`, each the f64 sum of its parts' values times their weights (what the step
// always reported), read from the device in one copy.
std::vector<double> read_losses(const std::vector<const StepLoss*>& steps);

struct StepResult {
  StepLoss pending_loss;  // the loss, still on the device
  double loss = 0;        // mean over the batch (micro-batch losses weighted by their size), once read
  double scale = 1;       // the factor this step's loss was multiplied by (before update()); with host_values
  bool skipped = false;   // the optimizer step was skipped for inf/NaN gradients; with host_values
  double grad_norm = -1;  // L2 norm of the unscaled gradients (before clipping); -1 if not measured
};
// The dtype a step's image batches are stored in: under a preset with autocast, its 16-bit dtype,
// because the first layer of every image model (a Linear after Flatten, a Conv2d: lower-class ops)
// casts its input to that dtype before anything else reads it, so a step computes exactly the same
// from half the bytes (and backward saves the batch itself instead of a cast copy); f32 otherwise.
DType batch_dtype(const SessionOptions& opt);

// zero_grad; per micro-batch forward under the precision's autocast, cross-entropy and
// scaler.scale(loss).backward(); then unscale + clip (if asked), scaler.step, scaler.update.
StepResult train_step(Session& s, const Tensor& x, const Tensor& y);

}  // namespace mixprec::cli
