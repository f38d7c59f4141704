// Shared flags and the training step of the CLI: presets, loss scaling, accumulation, clipping.
#include "session.h"

#include <omp.h>
#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/clip.h"
#include "mixprec/cpu.h"
#include "mixprec/error.h"

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
    const bool amx = cpu::has_amx_bf16(), avx = cpu::has_avx512_bf16();
    // Without AMX or AVX512-BF16, bf16 math is emulated and slower than f32: stay in f32.
    Precision p = resolve_precision(amx || avx ? "amp-bf16" : "fp32");
    p.why = amx   ? "the CPU has AMX-BF16"
            : avx ? "the CPU has AVX512-BF16"
                  : "the CPU has neither AMX-BF16 nor AVX512-BF16";
    return p;
  }
  Precision p;
  static_cast<amp::Precision&>(p) = amp::precision_preset(name);
  return p;
}

namespace {

std::vector<std::string> precision_choices() {
  std::vector<std::string> c = {"auto"};
  for (const auto& n : amp::precision_preset_names()) c.push_back(n);
  return c;
}

// --loss-scale dynamic | static:N | none, plus the dynamic scaler's knobs.
void parse_loss_scale(Args& a, SessionOptions& o) {
  const std::string def = o.precision.loss_scaling ? "dynamic" : "none";
  const std::string v = a.str("loss-scale", def);
  amp::GradScalerOptions& so = o.scaler;
  so = amp::GradScalerOptions{};
  so.init_scale = a.real("init-scale", so.init_scale, 0.0, 3.0e38, /*lo_open=*/true);
  so.growth_interval = a.integer("growth-interval", so.growth_interval, 1, INT64_MAX);
  so.hysteresis = a.integer("hysteresis", so.hysteresis, 1, 1000000);
  if (v == "dynamic") {
    so.enabled = true;
  } else if (v == "none") {
    so.enabled = false;
  } else if (v.rfind("static:", 0) == 0) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str() + 7, &end);
    MIXPREC_CHECK(v.size() > 7 && *end == '\0' && std::isfinite(x) && x > 0 && x < 3.0e38,
                  "--loss-scale static:N needs a number N > 0, got '", v, "'");
    MIXPREC_CHECK(!a.has("init-scale"), "--init-scale conflicts with --loss-scale ", v, " (the static scale)");
    so.enabled = true;
    so.dynamic = false;
    so.init_scale = x;
  } else {
    throw Error(detail::concat("--loss-scale must be dynamic, static:N or none, got '", v, "'"));
  }
  o.loss_scale = v;
  MIXPREC_CHECK(so.enabled || (!a.has("init-scale") && !a.has("growth-interval") && !a.has("hysteresis")),
                "--init-scale, --growth-interval and --hysteresis need a loss scale (--loss-scale dynamic)");
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

ModelSpec parse_model(Args& a) {
  ModelSpec m;
  m.name = a.choice("model", "mlp", model_names());
  m.hidden = a.int_list("hidden", m.hidden, 1, 1 << 16);
  m.channels = a.int_list("channels", m.channels, 1, 1 << 14);
  if (m.is_gpt()) {
    m.layers = a.integer("layers", m.layers, 1, 1024);
    m.heads = a.integer("heads", m.heads, 1, 1024);
    m.d_model = a.integer("d-model", m.d_model, 1, 1 << 16);
    m.block_size = a.integer("block-size", m.block_size, 1, 1 << 20);
    m.dropout = a.real("dropout", m.dropout, 0.0, 0.99);
    MIXPREC_CHECK(m.d_model % m.heads == 0, "--d-model ", m.d_model, " must be a multiple of --heads ", m.heads);
  }
  return m;
}

Precision parse_precision(Args& a, const std::string& def, const Device& device) {
  return resolve_precision(a.choice("precision", def, precision_choices()), device);
}

Device parse_device(Args& a, std::string* why) {
  const std::string v = a.str("device", "cpu");
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

SessionOptions parse_session(Args& a) {
  SessionOptions o;
  o.device = parse_device(a, &o.device_why);
  o.model = parse_model(a);
  o.precision = parse_precision(a, "auto", o.device);
  const bool half_params = o.precision.param_dtype != DType::f32;
  if (a.has("stochastic-rounding")) {
    const bool sr = a.flag("stochastic-rounding");
    MIXPREC_CHECK(half_params && !o.precision.master_weights,
                  "--stochastic-rounding applies to pure-bf16/pure-fp16 (16-bit weights without a master copy), not ",
                  o.precision.name);
    o.precision.stochastic_rounding = sr;
  }
  parse_loss_scale(a, o);
  o.optimizer = a.choice("optimizer", "adamw", {"adamw", "sgd"});
  const Recipe recipe = default_recipe(o.model.name);
  o.lr = a.real("lr", o.optimizer == "sgd" ? recipe.sgd_lr : recipe.adamw_lr, 0.0, 1e3, /*lo_open=*/true);
  o.weight_decay = a.real("weight-decay", recipe.weight_decay, 0.0, 1.0);
  // Only the gpt reads --beta2 (the image models' checkpoints do not record it).
  if (o.model.is_gpt()) o.beta2 = a.real("beta2", recipe.beta2, 0.0, 0.999999);
  o.momentum = a.real("momentum", 0.9, 0.0, 0.999999);
  o.batch_size = a.integer("batch-size", recipe.batch_size, 1, 1 << 20);
  o.accumulate = a.integer("accumulate", 1, 1, 1 << 20);
  MIXPREC_CHECK(o.accumulate <= o.batch_size, "--accumulate ", o.accumulate,
                " splits each batch into micro-batches: ", "it cannot exceed --batch-size ", o.batch_size);
  o.clip_grad_value = a.real("clip-grad-value", 0.0, 0.0, 1e30);
  // The recipe's norm clipping gives way to an explicit --clip-grad-value.
  o.clip_grad_norm = a.real("clip-grad-norm", a.has("clip-grad-value") ? 0.0 : recipe.clip_grad_norm, 0.0, 1e30);
  MIXPREC_CHECK(o.clip_grad_norm == 0 || o.clip_grad_value == 0, "--clip-grad-norm and --clip-grad-value: pick one");
  o.loss_weight = a.real("loss-weight", 1.0, 0.0, 1e30, /*lo_open=*/true);
  o.seed = uint64_t(a.integer("seed", 0, 0, INT64_MAX));
  o.threads = int(a.integer("threads", available_cores(), 1, 1024));
  return o;
}

Session make_session(const SessionOptions& opt) {
  omp_set_num_threads(opt.threads);
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
