// GradScaler: PyTorch's call order and per-optimizer stages (torch/cuda/amp/grad_scaler.py) kept
// on the host; the scale, the counters and found_inf in tensors on the losses' device, changed
// only by kernels (the unscale-and-check pass, the update rule kernels::rule::next_scale).
#include "mixprec/grad_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "amp/scaler_detail.h"
#include "kernels/optim.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"

namespace mixprec::amp {

// ------------------------------------------------------------------------ unscale and check

namespace detail {

int64_t unscale_and_check(const std::vector<Tensor>& params, const Tensor& scale, Tensor& found_inf, bool check_only) {
  int64_t num_grads = 0;
  std::vector<Tensor> src, dst;
  for (const Tensor& param : params) {
    Tensor p = param;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ++num_grads;
    MIXPREC_CHECK(is_floating(g.dtype()), "GradScaler: a gradient is ", dtype_name(g.dtype()));
    if (!g.is_contiguous()) {
      MemoryScope scope(MemCategory::gradients);
      g = g.clone();
      p.set_grad(g);
    }
    Tensor d = check_only ? Tensor() : g;
    if (!check_only && g.dtype() == DType::f16) {
      MemoryScope scope(MemCategory::gradients);
      d = Tensor::empty(g.shape(), DType::f32, g.device());
      p.set_grad(d);
    }
    src.push_back(g);  // keeps a replaced f16 gradient alive until the kernel has read it
    dst.push_back(d);
  }
  kernels::unscale_and_check(src, dst, scale, found_inf);
  return num_grads;
}

kernels::rule::ScaleRule scale_rule(const GradScalerOptions& o) {
  return {o.growth_factor, o.backoff_factor, o.growth_interval, o.dynamic,
          o.hysteresis,    o.min_scale,      o.max_scale,       o.error_at_min_scale};
}

}  // namespace detail

// ------------------------------------------------------------------------------- GradScaler

GradScaler::GradScaler(GradScalerOptions o) : o_(o) {
  // PyTorch's checks, then ours.
  MIXPREC_CHECK(o.growth_factor > 1.0 || !o.dynamic, "GradScaler: the growth factor must be > 1.0, got ",
                o.growth_factor);
  MIXPREC_CHECK(o.backoff_factor < 1.0 || !o.dynamic, "GradScaler: the backoff factor must be < 1.0, got ",
                o.backoff_factor);
  MIXPREC_CHECK(o.backoff_factor > 0.0, "GradScaler: the backoff factor must be > 0, got ", o.backoff_factor);
  MIXPREC_CHECK(
      std::isfinite(o.init_scale) && o.init_scale > 0 && std::isfinite(float(o.init_scale)) && float(o.init_scale) > 0,
      "GradScaler: init_scale must be a finite f32 number > 0, got ", o.init_scale);
  MIXPREC_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval);
  MIXPREC_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", o.hysteresis);
  MIXPREC_CHECK(o.min_scale >= 0 && o.max_scale >= o.min_scale, "GradScaler: need 0 <= min_scale <= max_scale, got ",
                o.min_scale, " and ", o.max_scale);
  MIXPREC_CHECK(o.init_scale >= o.min_scale && o.init_scale <= o.max_scale, "GradScaler: init_scale ", o.init_scale,
                " is outside [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale, "]");
  // On the host until the first scale(loss) says where the losses are.
  scale_ = Tensor::scalar(o.init_scale, DType::f32, Device::cpu());
  std::vector<int64_t> c(kernels::kScaleCounters, 0);
  c[kernels::kHysteresisLeft] = o.hysteresis;
  counters_ = Tensor::from_vector(c, {kernels::kScaleCounters}, Device::cpu());
}

void GradScaler::to_device(const Device& d) {
  if (scale_.device() == d) return;
  scale_ = scale_.to(d);
  counters_ = counters_.to(d);
  for (auto& [opt, st] : per_opt_)
    if (st.found_inf.defined()) st.found_inf = st.found_inf.to(d);
}

void GradScaler::require_scale(const char* call) const {
  MIXPREC_CHECK(scaled_since_update_, "GradScaler.", call,
                "(): no scale(loss) since the last update(); expected scale(loss).backward() first");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!o_.enabled) return loss;
  MIXPREC_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler.scale(): the loss must be a floating tensor");
  scaled_since_update_ = true;
  to_device(loss.device());
  // An f32 factor, as PyTorch's _scale: a 16-bit loss is promoted, so the scale itself cannot overflow.
  return ops::mul(loss, scale_);
}

void GradScaler::check_opt(optim::Optimizer& opt, OptState& st, bool check_only) {
  to_device(opt.params()[0].device());
  st.found_inf = Tensor::zeros({}, DType::f32, scale_.device());
  st.checked = detail::unscale_and_check(opt.params(), scale_, st.found_inf, check_only) > 0;
  if (reduce_found_inf_) reduce_found_inf_(st.found_inf);
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!o_.enabled) return;
  require_scale("unscale_");
  OptState& st = state_of(opt);
  MIXPREC_CHECK(st.stage != Stage::unscaled,
                "GradScaler.unscale_(): unscale_() has already been called on this "
                "optimizer since the last update(); expected step(optimizer) next");
  MIXPREC_CHECK(st.stage != Stage::stepped,
                "GradScaler.unscale_(): unscale_() is being called after step(); expected update() first");
  check_opt(opt, st, /*check_only=*/false);
  st.stage = Stage::unscaled;
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!o_.enabled) {
    opt.step();
    return;
  }
  require_scale("step");
  OptState& st = state_of(opt);
  MIXPREC_CHECK(st.stage != Stage::stepped,
                "GradScaler.step(): step() has already been called on this optimizer "
                "since the last update(); expected update() next");
  const bool fused = st.stage == Stage::ready;
  if (fused) check_opt(opt, st, /*check_only=*/true);
  MIXPREC_CHECK(st.checked,
                "GradScaler.step(): no inf checks were recorded for this optimizer (none of its "
                "parameters has a gradient); expected scale(loss).backward() before step()");
  st.stage = Stage::stepped;
  kernels::count_skipped(counters_, st.found_inf);
  // Fused: the optimizer unscales as it reads; after unscale_() the gradients are real already.
  opt.step_scaled(st.found_inf, fused ? scale_ : Tensor());
}

bool GradScaler::stepped(const optim::Optimizer& opt) const {
  if (!o_.enabled) return true;
  auto it = per_opt_.find(&opt);
  MIXPREC_CHECK(it != per_opt_.end() && it->second.found_inf.defined(),
                "GradScaler.stepped(): step(optimizer) was never called for this optimizer");
  return !found_inf(opt);
}

void GradScaler::update() {
  if (!o_.enabled) return;
  std::vector<Tensor> found;
  for (const auto& [opt, st] : per_opt_)
    if (st.stage != Stage::ready && st.checked) found.push_back(st.found_inf);
  MIXPREC_CHECK(!found.empty(),
                "GradScaler.update(): no inf checks were recorded since the last update(); expected "
                "unscale_(optimizer) or step(optimizer) before update()");
  kernels::update_scale(scale_, counters_, found, detail::scale_rule(o_));
  if (scale_.device().is_cpu()) check();  // host memory: the error costs nothing to read at once
  for (auto& [opt, st] : per_opt_) st.stage = Stage::ready;
  scaled_since_update_ = false;
}

void GradScaler::update(double new_scale) {
  if (!o_.enabled) return;
  MIXPREC_CHECK(std::isfinite(new_scale) && new_scale > 0 && std::isfinite(float(new_scale)),
                "GradScaler.update(new_scale): new_scale must be a finite f32 number > 0, got ", new_scale);
  scale_.fill_(new_scale);
  for (auto& [opt, st] : per_opt_) st.stage = Stage::ready;
  scaled_since_update_ = false;
}

bool GradScaler::found_inf(const optim::Optimizer& opt) const {
  auto it = per_opt_.find(&opt);
  if (it == per_opt_.end() || !it->second.checked || !it->second.found_inf.defined()) return false;
  check();
  return it->second.found_inf.item() != 0;
}

std::vector<int64_t> GradScaler::read_counters() const {
  std::vector<int64_t> c = counters_.to_vector_i64();
  if (c[kernels::kMinScaleError] != 0) {
    counters_.slice(0, kernels::kMinScaleError, kernels::kMinScaleError + 1).fill_(0);  // reported once
    throw Error(mixprec::detail::concat(
        "GradScaler: gradients overflowed with the loss scale already at min_scale = ", o_.min_scale,
        ": the model produces inf/NaN at any scale (check the inputs, the lr, or train in bf16/fp32)"));
  }
  return c;
}

void GradScaler::check() const {
  if (o_.enabled) read_counters();
}

double GradScaler::get_scale() const {
  if (!o_.enabled) return 1.0;
  check();
  return scale_.item();
}

// The keys of state_dict, in order, with their dtypes.
namespace {
struct StateKey {
  const char* name;
  DType dtype;
};
constexpr StateKey kStateKeys[] = {
    {"scale", DType::f32},           {"growth_factor", DType::f64},     {"backoff_factor", DType::f64},
    {"growth_interval", DType::i64}, {"_growth_tracker", DType::i64},   {"dynamic", DType::u8},
    {"hysteresis", DType::i64},      {"_hysteresis_left", DType::i64},  {"min_scale", DType::f64},
    {"max_scale", DType::f64},       {"error_at_min_scale", DType::u8}, {"_skipped_steps", DType::i64},
    {"_overflows", DType::i64},      {"_updates", DType::i64}};
}  // namespace

StateDict GradScaler::state_dict() const {
  if (!o_.enabled) return {};
  const std::vector<int64_t> c = read_counters();
  const double values[] = {scale_.item(),
                           o_.growth_factor,
                           o_.backoff_factor,
                           double(o_.growth_interval),
                           double(c[kernels::kGrowthTracker]),
                           o_.dynamic ? 1.0 : 0.0,
                           double(o_.hysteresis),
                           double(c[kernels::kHysteresisLeft]),
                           o_.min_scale,
                           o_.max_scale,
                           o_.error_at_min_scale ? 1.0 : 0.0,
                           double(c[kernels::kSkippedSteps]),
                           double(c[kernels::kOverflows]),
                           double(c[kernels::kUpdates])};
  StateDict sd;
  for (size_t k = 0; k < std::size(kStateKeys); ++k) {
    const StateKey& key = kStateKeys[k];
    sd.emplace_back(key.name,
                    key.dtype == DType::i64 ? state_i64(int64_t(values[k])) : Tensor::scalar(values[k], key.dtype));
  }
  return sd;
}

void GradScaler::load_state_dict(const StateDict& sd) {
  if (!o_.enabled) return;
  MIXPREC_CHECK(!sd.empty(),
                "GradScaler.load_state_dict: the source state dict is empty, possibly because it "
                "was saved from a disabled GradScaler");
  for (const auto& entry : sd) {
    // Not a structured binding: clang (tidy) cannot capture one in the lambda below.
    const std::string& k = entry.first;
    const Tensor& t = entry.second;
    const auto it =
        std::find_if(std::begin(kStateKeys), std::end(kStateKeys), [&](const StateKey& n) { return k == n.name; });
    MIXPREC_CHECK(it != std::end(kStateKeys), "GradScaler.load_state_dict: unexpected key '", k, "'");
    check_state("GradScaler", k, t, it->dtype, {});
  }
  for (const char* key : {"scale", "_growth_tracker"})
    MIXPREC_CHECK(find_state(sd, key), "GradScaler.load_state_dict: missing key '", key, "'");
  auto get = [&](const char* k, double def) {
    const Tensor* t = find_state(sd, k);
    return !t ? def : t->dtype() == DType::i64 ? double(state_to_i64(*t)) : t->item();
  };
  GradScalerOptions o = o_;
  o.growth_factor = get("growth_factor", o.growth_factor);
  o.backoff_factor = get("backoff_factor", o.backoff_factor);
  o.growth_interval = int64_t(get("growth_interval", double(o.growth_interval)));
  o.dynamic = get("dynamic", o.dynamic ? 1 : 0) != 0;
  o.hysteresis = int64_t(get("hysteresis", double(o.hysteresis)));
  o.min_scale = get("min_scale", o.min_scale);
  o.max_scale = get("max_scale", o.max_scale);
  o.error_at_min_scale = get("error_at_min_scale", o.error_at_min_scale ? 1 : 0) != 0;
  o.init_scale = get("scale", 1.0);
  GradScaler validate(o);  // validates the loaded options with the constructor's checks
  o_ = o;
  scale_.fill_(get("scale", 1.0));  // rounded to f32 as PyTorch's _scale
  std::vector<int64_t> c(kernels::kScaleCounters, 0);
  c[kernels::kGrowthTracker] = int64_t(get("_growth_tracker", 0));
  c[kernels::kHysteresisLeft] = int64_t(get("_hysteresis_left", double(o.hysteresis)));
  c[kernels::kSkippedSteps] = int64_t(get("_skipped_steps", 0));
  c[kernels::kOverflows] = int64_t(get("_overflows", 0));
  c[kernels::kUpdates] = int64_t(get("_updates", 0));
  counters_ = Tensor::from_vector(c, {kernels::kScaleCounters}).to(counters_.device());
}

}  // namespace mixprec::amp
