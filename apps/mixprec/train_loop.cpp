// The per-step machinery of `mixprec train` that the image and gpt loops share.
#include "train_loop.h"

#include <cmath>
#include <memory>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/checkpoint.h"
#include "mixprec/error.h"

namespace mixprec::cli {

Session start_session(const SessionOptions& opt, bool detect_anomaly, const io::SafetensorsFile* ckpt,
                      const std::string& path, RunState& start) {
  autograd::set_anomaly_enabled(detect_anomaly);
  Session s = make_session(opt);
  start = RunState{};
  if (ckpt) {
    Checkpoint(*s.model, s.optimizer.get(), s.scaler.get(), &default_generator()).load_state_dict(ckpt->tensors, path);
    s.optimizer->set_lr(opt.lr);
    start = load_run_state(ckpt->tensors, path);
  }
  start_data_parallel(s);  // under mpirun: after the load, so every rank starts from the same state
  return s;
}

StepLoop::StepLoop(Session& s, const TrainOptions& o, MetricsWriter& metrics, int64_t total_steps, int64_t start_step,
                   ProgressPrinter progress, Flags checkpoint_metadata)
    : s_(s),
      o_(o),
      metrics_(metrics),
      lr_schedule_(*s.optimizer, o.lr_schedule, total_steps, o.lr_warmup, o.min_lr),
      progress_(progress),
      step_(start_step),
      named_params_(s.model->named_parameters()),
      metadata_(std::move(checkpoint_metadata)) {
  if (o_.diagnose > 0) {
    s_.optimizer->set_track_rounding(true);
    // After backward, while the gradients still carry the scale.
    s_.after_backward = [this] {
      if (diagnose_due()) diagnose_gradients();
    };
  }
}

StepLoop::~StepLoop() { s_.after_backward = nullptr; }

bool StepLoop::report_due(int64_t step, int64_t i) const {
  return s_.opt.device.is_cpu() || (metrics_.enabled() && step % o_.log_every == 0) || progress_.line_due(i) ||
         diagnose_due();
}

StepResult StepLoop::run_step(const Tensor& x, const Tensor& y, bool report) {
  const bool trace_autocast = o_.diagnose > 0 && step_ == 0;
  if (trace_autocast) amp::start_trace();
  s_.measure_grad_norm = metrics_.enabled() && (step_ + 1) % o_.log_every == 0;  // for the metrics line
  s_.host_values = report;
  StepResult r;
  try {
    lr_schedule_.apply(step_);
    r = train_step(s_, x, y);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    if (trace_autocast) amp::stop_trace();
    throw Error(detail::concat(e.what(), " (at step ", step_ + 1, ")"));
  }
  if (trace_autocast) print_autocast_trace(amp::stop_trace());
  if (report) scale_trace_.record(step_ + 1, r.scale, r.skipped);  // on a device: the reported steps
  if (diagnose_due()) report_rounding();
  return r;
}

void StepLoop::finish_step(int64_t epoch, int64_t i, int64_t epoch_samples, double seconds, StepResult r) {
  ++step_;
  unread_.push_back({step_, epoch, i, s_.optimizer->lr(), epoch_samples, seconds, std::move(r)});
}

void StepLoop::report_steps(double& loss_sum) {
  if (unread_.empty()) return;
  std::vector<const StepLoss*> pending;
  for (const UnreadStep& u : unread_) pending.push_back(&u.r.pending_loss);
  const std::vector<double> losses = read_losses(pending);
  for (size_t k = 0; k < unread_.size(); ++k) {
    UnreadStep& u = unread_[k];
    u.r.loss = losses[k];
    MIXPREC_CHECK(std::isfinite(u.r.loss), "training diverged: loss is ", u.r.loss, " at step ", u.step,
                  " (try a lower --lr, or --detect-anomaly to find the op)");
    loss_sum += u.r.loss;
    if (metrics_.enabled() && u.step % o_.log_every == 0) metrics_.write(step_event(u.step, u.epoch, u.lr, u.r));
    progress_.step(u.epoch, u.i, u.r.loss, u.epoch_samples, u.seconds);
  }
  unread_.clear();
}

void StepLoop::save(const RunState& r) {
  if (o_.save_path.empty()) return;
  // ZeRO-1: the optimizer state is sharded; every rank takes part in gathering it (a collective),
  // and rank 0 writes it through a whole optimizer of the same kind, so the checkpoint is the
  // unsharded one (it resumes on any number of ranks).
  std::unique_ptr<optim::Optimizer> whole;
#if MIXPREC_WITH_MPI
  if (s_.dp && s_.optimizer->handed_over()) {
    const StateDict sd = s_.dp->optimizer_state_dict();
    if (world_rank() == 0) {
      std::vector<optim::ParamGroup> groups;
      for (const optim::ParamGroupState& g : s_.optimizer->param_groups()) {
        groups.push_back({{}, {g.lr, g.weight_decay}});
        for (size_t i : g.params) groups.back().params.push_back(s_.optimizer->params()[i]);
      }
      whole = s_.optimizer->make_like(std::move(groups));
      whole->load_state_dict(sd);
    }
  }
#endif
  // Rank 0 writes: every replica holds the same weights.
  if (world_rank() != 0) return;
  metrics_.flush();
  Checkpoint(*s_.model, whole ? whole.get() : s_.optimizer.get(), s_.scaler.get(), &default_generator())
      .save(o_.save_path, metadata_, run_state_dict(r));
}

void StepLoop::diagnose_gradients() {
  const double scale = s_.scaler->get_scale();
  const std::vector<amp::GradStats> stats = amp::gradient_stats(named_params_, scale);
  print_gradient_stats(step_ + 1, stats, scale);
  metrics_.write(diagnose_event(step_ + 1, scale, stats));
}

void StepLoop::report_rounding() {
  const optim::Optimizer::RoundingStats r = s_.optimizer->take_rounding_stats();
  if (r.changed == 0) return;  // no 16-bit parameters (or no update)
  print_rounding(step_ + 1, r, s_.opt.precision);
  metrics_.write(rounding_event(step_ + 1, r, s_.opt.precision));
}

}  // namespace mixprec::cli
