// amp::GradScaler: dynamic loss scaling with PyTorch's exact semantics (torch.cuda.amp.GradScaler),
// plus what PyTorch lacks: hysteresis, min/max scale, an error at the minimum, skip counters. Its
// state lives in tensors on the device of the losses it scales, and no call of the training loop
// (scale, unscale_, step, update) copies anything to the host: the skip and the scale update are
// decided on the device. Only the accessors that return host values read it (a GPU syncs there).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mixprec/optim.h"
#include "mixprec/state_dict.h"
#include "mixprec/tensor.h"

namespace mixprec::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16: PyTorch's default
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // finite steps in a row before growing
  bool enabled = true;             // false: every call passes through (scale 1, step = optimizer.step())
  // ---- beyond PyTorch (the defaults reproduce PyTorch exactly) ----
  bool dynamic = true;     // false: a static scale: inf/NaN steps are still skipped, the scale never changes
  int64_t hysteresis = 1;  // back off only after this many overflows in a row (DeepSpeed); 1 = at once
  double min_scale = 0.0;  // the scale never backs off below this (0: no bound)
  double max_scale = std::numeric_limits<double>::infinity();  // nor grows above this
  bool error_at_min_scale = false;  // throw when an overflow happens with the scale already at min_scale
};

// The PyTorch loop, line for line:
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);             // optional, e.g. before clip_grad_norm
//   scaler.step(opt);                 // skipped (on the device) when opt's gradients hold inf/NaN
//   scaler.update();
//   if (log_now) scaler.stepped(opt); // host answers only when asked
// Each optimizer goes READY -> (unscale) UNSCALED -> (step) STEPPED between two update() calls;
// one scale is shared by every optimizer and loss. Calls out of that order throw mixprec::Error
// naming the call that was expected.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});

  // loss * scale (a recorded op, so backward() yields scaled gradients); loss itself when disabled.
  Tensor scale(const Tensor& loss);
  // One fused pass over the gradients of opt's parameters: multiplies them by 1/scale and
  // records whether any was inf/NaN. f32 and bf16 gradients are unscaled in place; an f16
  // gradient becomes an f32 one (f16 cannot hold what the scale protected: PyTorch refuses
  // with "Attempting to unscale FP16 gradients").
  void unscale_(optim::Optimizer& opt);
  // Steps opt unless its gradients held inf/NaN, decided on the device (the optimizer's kernel
  // reads the flag). Without a prior unscale_(), the gradients are checked (read-only) and the
  // optimizer unscales them on the fly inside its fused update. Returns nothing, so the loop
  // never waits for the device: stepped(opt) says whether the step was taken.
  void step(optim::Optimizer& opt);
  // Whether the last step(opt) updated opt (false: skipped for inf/NaN); valid after update()
  // too, until opt's next unscale_/step. Reads the flag from the device (a GPU syncs here).
  bool stepped(const optim::Optimizer& opt) const;
  // Adjusts the scale from the steps since the last update() (PyTorch's rule; hysteresis and
  // bounds when set) and makes every optimizer READY again.
  void update();
  void update(double new_scale);  // sets the scale (PyTorch's update(new_scale))

  // The accessors below read the device (a GPU syncs), and each first throws the error of an
  // overflow at min_scale (error_at_min_scale) if one happened since the last read: update()
  // throws it at once only where the state is host memory (the CPU); on a device it is recorded
  // there and surfaces at the next of these calls, or at check().
  bool is_enabled() const { return o_.enabled; }
  double get_scale() const;
  int64_t growth_tracker() const { return counter(0); }
  int64_t hysteresis_left() const { return counter(1); }
  const GradScalerOptions& options() const { return o_; }
  // True when the last unscale_/step(opt) found inf/NaN in opt's gradients.
  bool found_inf(const optim::Optimizer& opt) const;
  void check() const;  // throws a pending error at min_scale
  // Data parallelism: fn(found_inf) runs on each optimizer's inf/NaN flag (0-d f32 on the
  // scaler's device) right after this scaler checked the local gradients and before any step reads
  // it, so a wrapper reduces it across ranks with MAX (dist::DataParallel does): every rank then
  // skips or steps together and the scale stays identical. Kept here as a plain callback, so amp
  // needs no MPI. Empty (the default): the local check decides alone.
  using FoundInfReducer = std::function<void(Tensor& found_inf)>;
  void set_found_inf_reducer(FoundInfReducer fn) { reduce_found_inf_ = std::move(fn); }

  // The scale as a 0-d f32 tensor on the scaler's device (no copy: e.g. to log it lazily).
  const Tensor& scale_tensor() const { return scale_; }

  // Counters over the scaler's life (kept in state_dict).
  int64_t num_skipped_steps() const { return counter(2); }  // optimizer steps skipped
  int64_t num_overflows() const { return counter(3); }      // update() calls that saw inf/NaN
  int64_t num_updates() const { return counter(4); }

  // 0-d tensors: "scale" (f32, as PyTorch's _scale), "growth_factor", "backoff_factor",
  // "growth_interval", "_growth_tracker" (PyTorch's keys), then ours: "dynamic",
  // "hysteresis", "_hysteresis_left", "min_scale", "max_scale", "error_at_min_scale" and the
  // counters "_skipped_steps", "_overflows", "_updates" (f64 for reals, i64 for counts, u8 for
  // flags). Empty when disabled, as PyTorch. load_state_dict needs "scale" and
  // "_growth_tracker" (the others keep this scaler's values when absent), refuses an unknown key
  // or a wrong dtype/shape naming the key, and continues the same sequence of scales.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct OptState {
    Stage stage = Stage::ready;
    bool checked = false;  // the last inf check saw at least one gradient
    Tensor found_inf;      // 0-d f32 on the device: the last check's result (kept for stepped())
  };
  OptState& state_of(const optim::Optimizer& opt) { return per_opt_[&opt]; }
  void require_scale(const char* call) const;
  void to_device(const Device& d);  // moves the state tensors (once: where the losses are)
  void check_opt(optim::Optimizer& opt, OptState& st, bool check_only);  // the unscale/inf check
  std::vector<int64_t> read_counters() const;                            // throws a pending error at min_scale
  int64_t counter(size_t k) const { return read_counters()[k]; }

  GradScalerOptions o_;
  Tensor scale_;             // f32 0-d, as PyTorch's _scale
  mutable Tensor counters_;  // i64 [kernels::kScaleCounters]: growth tracker, hysteresis left, counts, error
  bool scaled_since_update_ = false;
  std::unordered_map<const optim::Optimizer*, OptState> per_opt_;
  FoundInfReducer reduce_found_inf_;
};

}  // namespace mixprec::amp
