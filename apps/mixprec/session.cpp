// Shared flags and the training step of the CLI: presets, loss scaling, accumulation, clipping.
#include "session.h"

#include <omp.h>
#include <sched.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/clip.h"
#include "mixprec/cpu.h"
#include "mixprec/deterministic.h"
#include "mixprec/error.h"
#include "mixprec/profile.h"

namespace mixprec::cli {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

Precision resolve_precision(const std::string& name, const Device& device) {
  if (name == "auto" && device.is_cuda()) {
    const auto gpus = cuda::devices();
    MIXPREC_CHECK(device.index < int(gpus.size()), "--precision auto: no GPU ", device.str());
    const cuda::DeviceProperties& g = gpus[size_t(device.index)];
    // bf16 tensor cores from Ampere (sm_80) on; before, fp16 is the fast 16-bit type.
    const bool bf16 = g.major >= 8;
    Precision p = resolve_precision(bf16 ? "amp-bf16" : "amp-fp16");
    p.why = detail::concat(g.name, ", compute capability ", g.major, ".", g.minor,
                           bf16 ? ": bf16 tensor cores" : ": fp16 tensor cores, no bf16 ones");
    return p;
  }
  if (name == "auto") {
    // bf16 only where its products outrun f32's (AMX, or AVX512-BF16 on AMD): elsewhere a bf16 step
    // computes its products in f32 and adds the casts, so f32 is the faster step.
    const bool fast = cpu::bf16_products_outrun_f32();
    Precision p = resolve_precision(fast ? "amp-bf16" : "fp32");
    p.why = cpu::has_amx_bf16()      ? "the CPU has AMX-BF16"
            : fast                   ? "the CPU has AVX512-BF16 (AMD: bf16 products at twice f32's rate)"
            : cpu::has_avx512_bf16() ? "the CPU's AVX512-BF16 without AMX (Intel) runs bf16 products no faster than f32"
                                     : "the CPU has neither AMX-BF16 nor AVX512-BF16";
    return p;
  }
  Precision p;
  static_cast<amp::Precision&>(p) = amp::precision_preset(name);
  return p;
}

std::vector<std::string> precision_choices() {
  std::vector<std::string> c = {"auto"};
  for (const auto& n : amp::precision_preset_names()) c.push_back(n);
  return c;
}

namespace {

// --loss-scale dynamic | static:N | none (the preset's by default), plus the dynamic scaler's knobs.
void resolve_loss_scale(const SessionFlags& f, const Command& c, SessionOptions& o) {
  const std::string v = f.loss_scale.empty() ? (o.precision.loss_scaling ? "dynamic" : "none") : f.loss_scale;
  amp::GradScalerOptions& so = o.scaler;
  so = amp::GradScalerOptions{};
  so.init_scale = f.init_scale;
  so.growth_interval = f.growth_interval;
  so.hysteresis = f.hysteresis;
  if (v == "dynamic") {
    so.enabled = true;
  } else if (v == "none") {
    so.enabled = false;
  } else if (v.rfind("static:", 0) == 0) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str() + 7, &end);
    MIXPREC_CHECK(v.size() > 7 && *end == '\0' && std::isfinite(x) && x > 0 && x < 3.0e38,
                  "--loss-scale static:N needs a number N > 0, got '", v, "'");
    MIXPREC_CHECK(!c.has("init-scale"), "--init-scale conflicts with --loss-scale ", v, " (the static scale)");
    so.enabled = true;
    so.dynamic = false;
    so.init_scale = x;
  } else {
    throw Error(detail::concat("--loss-scale must be dynamic, static:N or none, got '", v, "'"));
  }
  o.loss_scale = v;
  MIXPREC_CHECK(so.enabled || (!c.has("init-scale") && !c.has("growth-interval") && !c.has("hysteresis")),
                "--init-scale, --growth-interval and --hysteresis need a loss scale (--loss-scale dynamic)");
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// The shortest decimal that reads back as the same double.
std::string shortest(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

// "mlp 512, cnn 64, cnn-bn 128, gpt 32": a recipe's value for each model, for --help.
template <class F>
std::string per_model(F value) {
  std::string s = "model's recipe: ";
  for (const std::string& m : model_names()) {
    if (m != model_names().front()) s += ", ";
    s.append(m).append(" ").append(value(m));
  }
  return s;
}

}  // namespace

std::string describe_loss_scale(const SessionOptions& o) {
  if (!o.scaler.enabled) return "none";
  std::ostringstream os;
  if (!o.scaler.dynamic) {
    os << "static " << o.scaler.init_scale;
  } else {
    os << "dynamic (init " << o.scaler.init_scale << ", x" << o.scaler.growth_factor << " every "
       << o.scaler.growth_interval << " finite steps, x" << o.scaler.backoff_factor << " on overflow";
    if (o.scaler.hysteresis > 1) os << " after " << o.scaler.hysteresis << " in a row";
    os << ")";
  }
  return os.str();
}

void add_model_flags(Command& c, ModelFlags& f) {
  c.choice("model", f.model, model_names(),
           "the model: mlp (784-hidden...-10, ReLU), cnn (the PyTorch tutorial's two conv/ReLU/max-pool stages), "
           "cnn-bn (conv-BN-ReLU stages, dropout), gpt (nanoGPT's decoder: pre-norm blocks, embedding tied to the "
           "head)");
  c.group("mlp model (--model mlp)", {"mlp"});
  c.int_list("hidden", f.hidden, 1, 1 << 16, "the hidden layers' widths");
  c.group("cnn model (--model cnn)", {"cnn"});
  c.int_list("channels", f.channels, 1, 1 << 14, "the two conv stages' widths (420,1000: the wide one)");
  c.flag("channels-last", f.channels_last,
         "the convolutions, pools and ReLUs on channels-last (NHWC) activations, the layout of cuDNN's tensor-core "
         "kernels (PyTorch's channels_last); the same values (on a GPU cuDNN's engines differ, so not the same bits); "
         "on the CPU only copies more");
  c.group("gpt model (--model gpt)", {"gpt"});
  c.integer("layers", f.layers, 1, 1024, "transformer blocks");
  c.integer("heads", f.heads, 1, 1024, "attention heads (--d-model must be a multiple)");
  c.integer("d-model", f.d_model, 1, 1 << 16, "embedding width");
  c.integer("block-size", f.block_size, 1, 1 << 20, "context length in characters");
  c.real("dropout", f.dropout, 0.0, 0.99, "dropout probability");
  c.group("Options");
}

void add_device_flag(Command& c, std::string& device) {
  c.text("device", device, "cpu|cuda|cuda:N|auto",
         "where to run; auto: GPU 0 where there is one, else the CPU. The model is built on the CPU (the same "
         "weights everywhere), then moved");
}

void add_threads_flag(Command& c, int64_t& threads) {
  c.integer("threads", threads, 1, 1024, "CPU threads", "the available cores, " + std::to_string(available_cores()));
}

void add_deterministic_flag(Command& c, bool& deterministic) {
  c.flag("deterministic", deterministic,
         "the same bits on every rerun: on a GPU each convolution takes cuDNN's first deterministic engine instead of "
         "the fastest timed one (cudnn.benchmark off); the CPU is deterministic at a fixed --threads either way");
}

void add_session_flags(Command& c, SessionFlags& f, bool with_precision) {
  add_device_flag(c, f.device);
  if (with_precision)
    c.choice("precision", f.precision, precision_choices(),
             "auto: on a GPU amp-bf16 from compute capability 8.0 on, else amp-fp16; on the CPU amp-bf16 where it "
             "has AMX-BF16 or AVX512-BF16, else fp32. amp-*: autocast, f32 parameters; half-*: 16-bit parameters, "
             "f32 master weights and optimizer state; pure-bf16: no master copy, stochastic rounding; pure-fp16: "
             "the naive baseline");
  c.boolean("stochastic-rounding", f.stochastic_rounding,
            "pure-bf16/pure-fp16 only: round weight updates stochastically (false: to nearest)",
            "pure-bf16 true, pure-fp16 false");
  c.text("loss-scale", f.loss_scale, "dynamic|static:N|none", "loss scaling",
         "dynamic for the fp16 presets, else none");
  c.real("init-scale", f.init_scale, 0.0, 3.0e38, "the dynamic scale's start", /*lo_open=*/true);
  c.integer("growth-interval", f.growth_interval, 1, INT64_MAX, "finite steps before the scale doubles");
  c.integer("hysteresis", f.hysteresis, 1, 1000000, "overflows in a row before the scale backs off");
  c.choice("optimizer", f.optimizer, {"adamw", "sgd"}, "the optimizer");
  c.real("lr", f.lr, 0.0, 1e3, "learning rate", /*lo_open=*/true,
         "adamw: " + per_model([](const std::string& m) { return shortest(default_recipe(m).adamw_lr); }) +
             "; sgd: " + shortest(default_recipe("mlp").sgd_lr));
  c.real("weight-decay", f.weight_decay, 0.0, 1.0, "weight decay", false,
         per_model([](const std::string& m) { return shortest(default_recipe(m).weight_decay); }) +
             " (gpt: on the parameters of dim >= 2 only)");
  c.real("momentum", f.momentum, 0.0, 0.999999, "SGD's momentum");
  c.integer("batch-size", f.batch_size, 1, 1 << 20, "samples per optimizer step",
            per_model([](const std::string& m) { return std::to_string(default_recipe(m).batch_size); }));
  c.integer("accumulate", f.accumulate, 1, 1 << 20, "split each batch into N micro-batches (one optimizer step)");
  c.real("clip-grad-norm", f.clip_grad_norm, 0.0, 1e30, "clip the unscaled gradients' L2 norm; 0: off", false,
         per_model([](const std::string& m) { return shortest(default_recipe(m).clip_grad_norm); }) +
             ", 0 with --clip-grad-value");
  c.real("clip-grad-value", f.clip_grad_value, 0.0, 1e30, "clip each unscaled gradient to [-X, X]; 0: off");
  c.real("loss-weight", f.loss_weight, 0.0, 1e30,
         "multiply the loss by W before backward (an auxiliary loss's weight; 1e-5 shows fp16 gradient underflow)",
         /*lo_open=*/true);
  c.integer("seed", f.seed, 0, INT64_MAX, "seeds the weights, the shuffling and dropout");
  add_threads_flag(c, f.threads);
  add_deterministic_flag(c, f.deterministic);
  c.size("memory-limit", f.memory_limit,
         "the allocator's budget on the device: an allocation past it fails with out of memory");
  c.group("data parallelism (under mpirun -np N; docs/distributed.md)");
  c.choice("reduce-dtype", f.reduce_dtype, {"f32", "bf16"}, "the dtype the gradients travel in between ranks");
  c.integer("zero", f.zero, 0, 1, "ZeRO stage: 1 shards the optimizer state across the ranks");
  c.group("Options");
  add_model_flags(c, f.model);
  c.group("gpt model (--model gpt)", {"gpt"});
  c.real("beta2", f.beta2, 0.0, 0.999999, "AdamW's second beta", false,
         shortest(default_recipe("gpt").beta2) + ", nanoGPT's");
  c.group("Options");
}

ModelSpec resolve_model(const ModelFlags& f, const Command& c) {
  c.check_model_flags(f.model);
  ModelSpec m;
  m.name = f.model;
  m.hidden = f.hidden;
  m.channels = f.channels;
  m.channels_last = f.channels_last;
  m.layers = f.layers;
  m.heads = f.heads;
  m.d_model = f.d_model;
  m.block_size = f.block_size;
  m.dropout = f.dropout;
  if (m.is_gpt())
    MIXPREC_CHECK(m.d_model % m.heads == 0, "--d-model ", m.d_model, " must be a multiple of --heads ", m.heads);
  return m;
}

ModelSpec model_from_flags(const Flags& flags, const std::string& source) {
  Command c(nullptr, "metadata", "a model's flags");
  ModelFlags f;
  add_model_flags(c, f);
  Flags model_only;
  for (const auto& [k, v] : flags)
    if (k == "model" || k == "hidden" || k == "channels" || k == "layers" || k == "heads" || k == "d-model" ||
        k == "block-size" || k == "dropout")
      model_only[k] = v;
  c.take_defaults(model_only, source);
  return resolve_model(f, c);
}

Flags model_setting_flags(const ModelSpec& m) {
  Flags f;
  f["model"] = m.name;
  if (m.is_gpt()) {
    f["layers"] = std::to_string(m.layers);
    f["heads"] = std::to_string(m.heads);
    f["d-model"] = std::to_string(m.d_model);
    f["block-size"] = std::to_string(m.block_size);
    f["dropout"] = shortest(m.dropout);
  } else {
    f["hidden"] = join(m.hidden);
    f["channels"] = join(m.channels);
  }
  return f;
}

Device resolve_device(const std::string& v, std::string* why) {
  if (v == "auto") {
    const bool gpu = cuda::device_count() > 0;
    if (why) *why = gpu ? "a GPU is present" : "no GPU: " + cuda::unavailable_reason();
    return gpu ? Device::cuda(0) : Device::cpu();
  }
  Device d;
  try {
    d = Device::parse(v);
  } catch (const Error&) {
    throw Error(detail::concat("--device must be cpu, cuda, cuda:N or auto, got '", v, "'"));
  }
  cuda::require(d);
  return d;
}

SessionOptions resolve_session(const SessionFlags& f, const Command& c) {
  SessionOptions o;
  o.device = resolve_device(f.device, &o.device_why);
  o.model = resolve_model(f.model, c);
  o.precision = resolve_precision(f.precision, o.device);
  const bool half_params = o.precision.param_dtype != DType::f32;
  if (c.has("stochastic-rounding")) {
    MIXPREC_CHECK(half_params && !o.precision.master_weights,
                  "--stochastic-rounding applies to pure-bf16/pure-fp16 (16-bit weights without a master copy), not ",
                  o.precision.name);
    o.precision.stochastic_rounding = f.stochastic_rounding;
  }
  resolve_loss_scale(f, c, o);
  o.optimizer = f.optimizer;
  const Recipe recipe = default_recipe(o.model.name);
  o.lr = c.has("lr") ? f.lr : o.optimizer == "sgd" ? recipe.sgd_lr : recipe.adamw_lr;
  o.weight_decay = c.has("weight-decay") ? f.weight_decay : recipe.weight_decay;
  o.beta2 = c.has("beta2") ? f.beta2 : recipe.beta2;
  o.momentum = f.momentum;
  o.batch_size = c.has("batch-size") ? f.batch_size : recipe.batch_size;
  o.accumulate = f.accumulate;
  MIXPREC_CHECK(o.accumulate <= o.batch_size, "--accumulate ", o.accumulate,
                " splits each batch into micro-batches: ", "it cannot exceed --batch-size ", o.batch_size);
  o.clip_grad_value = f.clip_grad_value;
  // The recipe's norm clipping gives way to an explicit --clip-grad-value.
  o.clip_grad_norm = c.has("clip-grad-norm")    ? f.clip_grad_norm
                     : c.has("clip-grad-value") ? 0.0
                                                : recipe.clip_grad_norm;
  MIXPREC_CHECK(o.clip_grad_norm == 0 || o.clip_grad_value == 0, "--clip-grad-norm and --clip-grad-value: pick one");
  o.loss_weight = f.loss_weight;
  o.seed = uint64_t(f.seed);
  o.threads = int(c.has("threads") ? f.threads : available_cores());
  o.memory_limit = f.memory_limit;
  o.deterministic = f.deterministic;
  o.reduce_dtype = f.reduce_dtype;
  o.zero = int(f.zero);
  return o;
}

Session make_session(const SessionOptions& opt) {
  if (opt.memory_limit > 0) allocator::set_budget(opt.memory_limit, opt.device);
  omp_set_num_threads(opt.threads);
  use_deterministic_algorithms(opt.deterministic);
  default_generator().manual_seed(opt.seed);
  Session s;
  s.opt = opt;
  s.model = build_model(opt.model);  // on the CPU: default_device() is the CPU here
  amp::apply_precision(*s.model, opt.precision);
  s.model->to(opt.device);
  const optim::HalfParamOptions half = amp::half_param_options(opt.precision, opt.seed);
  // One group, or for the gpt nanoGPT's two (configure_optimizers): decay on the matrices (dim >= 2),
  // none on biases and norms.
  std::vector<optim::ParamGroup> groups;
  if (opt.model.is_gpt()) {
    groups = {{{}, {.weight_decay = opt.weight_decay}}, {{}, {.weight_decay = 0.0}}};
    for (const Tensor& p : s.model->parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  } else {
    groups = {{s.model->parameters()}};
  }
  if (opt.optimizer == "sgd") {
    optim::SGDOptions so;
    so.lr = opt.lr;
    so.momentum = opt.momentum;
    so.weight_decay = opt.weight_decay;
    so.half = half;
    s.optimizer = std::make_unique<optim::SGD>(std::move(groups), so);
  } else {
    optim::AdamWOptions ao;
    ao.lr = opt.lr;
    ao.weight_decay = opt.weight_decay;
    ao.beta2 = opt.beta2;
    ao.half = half;
    s.optimizer = std::make_unique<optim::AdamW>(std::move(groups), ao);
  }
  s.scaler = std::make_unique<amp::GradScaler>(opt.scaler);
  return s;
}

optim::Optimizer& Session::stepping_optimizer() {
#if MIXPREC_WITH_MPI
  if (dp) return dp->optimizer();
#endif
  return *optimizer;
}

int world_rank() {
#if MIXPREC_WITH_MPI
  return dist::ProcessGroup::world().rank();
#else
  return 0;
#endif
}

int world_size() {
#if MIXPREC_WITH_MPI
  return dist::ProcessGroup::world().size();
#else
  return 1;
#endif
}

void sum_over_ranks(std::vector<double>& values) {
#if MIXPREC_WITH_MPI
  dist::ProcessGroup& pg = dist::ProcessGroup::world();
  if (!pg.is_distributed() || values.empty()) return;
  Tensor t = Tensor::from_vector(values, {int64_t(values.size())});
  pg.all_reduce(t, dist::ReduceOp::sum);
  values = t.to_vector_f64();
#else
  (void)values;
#endif
}

bool silence_follower_rank() {
  if (world_rank() == 0) return false;
  std::fflush(stdout);
  MIXPREC_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "rank ", world_rank(),
                ": cannot send its stdout to /dev/null");
  return true;
}

void start_data_parallel(Session& s) {
#if MIXPREC_WITH_MPI
  if (!dist::ProcessGroup::world().is_distributed()) return;
  MIXPREC_CHECK(s.opt.device.is_cpu(), "data parallelism (mpirun) runs on the CPU; got --device ", s.opt.device.str());
  MIXPREC_CHECK(s.opt.batch_size % world_size() == 0, "--batch-size ", s.opt.batch_size,
                " is the global batch: it must be a multiple of the ", world_size(), " ranks");
  s.dp = std::make_unique<dist::DataParallel>(
      *s.model, *s.optimizer,
      dist::DataParallelOptions{
          .reduce_dtype = s.opt.reduce_dtype == "bf16" ? dist::WireDType::bf16 : dist::WireDType::f32,
          .zero = s.opt.zero});
  s.dp->attach(*s.scaler);
#else
  (void)s;
#endif
}

DType batch_dtype(const SessionOptions& opt) {
  return opt.precision.autocast && !opt.model.is_gpt() ? opt.precision.autocast_dtype : DType::f32;
}

StepResult train_step(Session& s, const Tensor& x_global, const Tensor& y_global) {
  StepResult r;
  Tensor x = x_global, y = y_global;
#if MIXPREC_WITH_MPI
  if (s.dp) {  // this rank's rows of the global batch (a short last batch splits as evenly as it can)
    const int64_t rows = x.size(0), rank = world_rank(), size = world_size();
    MIXPREC_CHECK(rows >= size, "a batch of ", rows, " rows for ", size, " ranks");
    x = x.slice(0, rows * rank / size, rows * (rank + 1) / size);
    y = y.slice(0, rows * rank / size, rows * (rank + 1) / size);
  }
#endif
  optim::Optimizer& opt = s.stepping_optimizer();
  s.optimizer->zero_grad();
  if (s.host_values || s.measure_grad_norm) r.scale = s.scaler->get_scale();
  const int64_t n = x.size(0), parts = std::min<int64_t>(s.opt.accumulate, n);
  for (int64_t k = 0; k < parts; ++k) {
    // Micro-batch k of the batch; each loss is weighted by its share so the gradients (and the
    // reported loss) sum to the full batch's mean, with the scale constant across them.
    const int64_t lo = k * n / parts, hi = (k + 1) * n / parts;
    const Tensor xk = parts == 1 ? x : x.slice(0, lo, hi), yk = parts == 1 ? y : y.slice(0, lo, hi);
    Tensor loss;
    {
      amp::Autocast ac(s.opt.device.type, s.opt.precision.autocast_dtype, s.opt.precision.autocast);
      loss = ops::cross_entropy((*s.model)(xk), yk);
    }
    const double share = double(hi - lo) / double(n), weight = share * s.opt.loss_weight;
    Tensor reported = loss.detach();
#if MIXPREC_WITH_MPI
    if (s.dp) {  // the global batch's loss: the mean of the ranks' (every rank, every step: a collective)
      reported = reported.to(DType::f32).clone();
      s.dp->group().all_reduce(reported, dist::ReduceOp::avg);
      s.dp->set_grad_sync(k == parts - 1);  // micro-batches: reduce once, after the last
    }
#endif
    r.pending_loss.parts.emplace_back(reported, share);
    if (weight != 1.0) loss = ops::affine(loss, weight);
    s.scaler->scale(loss).backward();
  }
  // The kernels from here on are the step's (unscale, clip, optimizer, scale update): a profile
  // (bench --profile) shows them as their own phase.
  const profile::PhaseScope phase("optimizer");
#if MIXPREC_WITH_MPI
  if (s.dp) s.dp->sync_gradients();  // averaged: the norms below are the global batch's
#endif
  if (s.after_backward) s.after_backward();
  const std::vector<Tensor>& params = s.optimizer->params();
  if (s.opt.clip_grad_norm > 0 || s.opt.clip_grad_value > 0) {
    // ZeRO-1's shard optimizer would unscale its shard again at the step.
    MIXPREC_CHECK(&opt == s.optimizer.get() || !s.scaler->is_enabled(),
                  "--zero 1 with a loss scale cannot clip yet (the shard optimizer would unscale twice)");
    s.scaler->unscale_(opt);  // clip the real gradients
    if (s.opt.clip_grad_norm > 0) {
      const Tensor norm = nn::clip_grad_norm_(params, s.opt.clip_grad_norm);
      if (s.measure_grad_norm) r.grad_norm = norm.item();
    } else {
      if (s.measure_grad_norm) r.grad_norm = nn::grad_norm(params).item();
      nn::clip_grad_value_(params, s.opt.clip_grad_value);
    }
  } else if (s.measure_grad_norm) {
    // The gradients still carry the scale; the norm divides it out in f64 (exact up to rounding,
    // and without unscaling 16-bit gradients in place).
    r.grad_norm = nn::grad_norm(params).item() / r.scale;
  }
#if MIXPREC_WITH_MPI
  if (s.dp)
    s.dp->step(*s.scaler);  // the scaler's found_inf is reduced with MAX: every rank skips or steps
  else
#endif
    s.scaler->step(opt);
  s.scaler->update();
  if (s.host_values) r.skipped = !s.scaler->stepped(opt);  // reads the device's answer (a GPU syncs)
  return r;
}

std::vector<double> read_losses(const std::vector<const StepLoss*>& steps) {
  std::vector<Tensor> all;
  for (const StepLoss* st : steps)
    for (const auto& [t, share] : st->parts) all.push_back(t.reshape({1}));
  if (all.empty()) return std::vector<double>(steps.size(), 0.0);
  std::vector<float> values;
  {
    autograd::NoGradGuard no_grad;
    // One copy to the host (one sync on a GPU) for the whole run of steps.
    values = (all.size() == 1 ? all[0] : ops::cat(all, 0)).to_vector();
  }
  std::vector<double> out;
  size_t k = 0;
  for (const StepLoss* st : steps) {
    double loss = 0;  // summed in f64 in micro-batch order, as the step always did
    for (const auto& part : st->parts) loss += double(values[k++]) * part.second;
    out.push_back(loss);
  }
  return out;
}

}  // namespace mixprec::cli
