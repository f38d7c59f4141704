// GradScaler: PyTorch's call order, per-optimizer stages and scale update rule
// (torch/cuda/amp/grad_scaler.py and _amp_update_scale_cpu_), with optional hysteresis
// (DeepSpeed's consecutive_hysteresis) and bounds; and the fused unscale-and-check pass.
#include "mixprec/grad_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "amp/scaler_detail.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"

namespace mixprec::amp {

// ------------------------------------------------------------------------ unscale and check

namespace {

constexpr int64_t kBlock = 4096;

struct Chunk {
  const void* src;
  void* dst;  // null: check only
  DType src_t, dst_t;
  int64_t len;
};

// Loads len values of src_t into f32 (f64 is narrowed only for the check, never stored).
bool check_and_scale(const Chunk& c, float inv_scale) {
  alignas(64) float buf[kBlock];
  if (c.src_t == DType::f64) {
    const double* s = static_cast<const double*>(c.src);
    bool ok = true;
    for (int64_t j = 0; j < c.len; ++j) ok &= std::fabs(s[j]) <= DBL_MAX;
    if (c.dst)
      for (int64_t j = 0; j < c.len; ++j) static_cast<double*>(c.dst)[j] = s[j] * double(inv_scale);
    return ok;
  }
  if (c.src_t == DType::f32)
    std::memcpy(buf, c.src, size_t(c.len) * 4);
  else if (c.src_t == DType::bf16)
    convert_bf16_to_f32(static_cast<const uint16_t*>(c.src), buf, size_t(c.len));
  else
    convert_f16_to_f32(static_cast<const uint16_t*>(c.src), buf, size_t(c.len));
  bool ok = true;
  for (int64_t j = 0; j < c.len; ++j) ok &= std::fabs(buf[j]) <= FLT_MAX;  // false for inf and NaN
  if (!c.dst) return ok;
  for (int64_t j = 0; j < c.len; ++j) buf[j] *= inv_scale;
  if (c.dst_t == DType::f32)
    std::memcpy(c.dst, buf, size_t(c.len) * 4);
  else if (c.dst_t == DType::bf16)
    convert_f32_to_bf16(buf, static_cast<uint16_t*>(c.dst), size_t(c.len));
  else
    convert_f32_to_f16(buf, static_cast<uint16_t*>(c.dst), size_t(c.len));
  return ok;
}

}  // namespace

namespace detail {

InfCheck unscale_and_check(const std::vector<Tensor>& params, float inv_scale, bool check_only) {
  InfCheck r;
  std::vector<Chunk> chunks;
  std::vector<Tensor> sources;  // keeps replaced f16 gradients alive until the pass has read them
  for (const Tensor& param : params) {
    Tensor p = param;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ++r.num_grads;
    MIXPREC_CHECK(is_floating(g.dtype()), "GradScaler: a gradient is ", dtype_name(g.dtype()));
    if (!g.is_contiguous()) {
      MemoryScope scope(MemCategory::gradients);
      g = g.clone();
      p.set_grad(g);
    }
    Tensor dst = check_only ? Tensor() : g;
    if (!check_only && g.dtype() == DType::f16) {
      MemoryScope scope(MemCategory::gradients);
      dst = Tensor::empty(g.shape(), DType::f32);
      p.set_grad(dst);
    }
    sources.push_back(g);
    const int64_t es = int64_t(dtype_size(g.dtype())), ds = dst.defined() ? int64_t(dtype_size(dst.dtype())) : 0;
    for (int64_t b = 0; b < g.numel(); b += kBlock)
      chunks.push_back({static_cast<const char*>(g.data_ptr()) + b * es,
                        dst.defined() ? static_cast<char*>(dst.data_ptr()) + b * ds : nullptr, g.dtype(),
                        dst.defined() ? dst.dtype() : g.dtype(), std::min(kBlock, g.numel() - b)});
  }
  // One pass over every block of every gradient (PyTorch's multi-tensor apply).
  bool ok = true;
  const int64_t nc = int64_t(chunks.size());
#pragma omp parallel for schedule(static) reduction(&& : ok) if (nc >= 8)
  for (int64_t c = 0; c < nc; ++c) ok = check_and_scale(chunks[size_t(c)], inv_scale) && ok;
  r.found_inf = !ok;
  return r;
}

// ------------------------------------------------------------------------------ update rule

ScaleState next_scale_state(const ScaleState& s, bool found_inf, const GradScalerOptions& o) {
  if (!o.dynamic) return s;
  ScaleState n = s;
  if (found_inf) {
    n.growth_tracker = 0;
    if (s.hysteresis_left > 1) {  // an overflow within the hysteresis: skip the step, keep the scale
      n.hysteresis_left = s.hysteresis_left - 1;
      return n;
    }
    if (o.error_at_min_scale && double(s.scale) <= o.min_scale)
      throw Error(mixprec::detail::concat(
          "GradScaler: gradients overflowed with the loss scale already at min_scale = ", o.min_scale,
          ": the model produces inf/NaN at any scale (check the inputs, the lr, "
          "or train in bf16/fp32)"));
    // PyTorch: the f32 scale times the (double) factor, stored as f32.
    n.scale = float(double(s.scale) * o.backoff_factor);
    if (o.min_scale > 0) n.scale = std::max(n.scale, float(o.min_scale));
    return n;
  }
  n.hysteresis_left = o.hysteresis;  // consecutive overflows only
  const int64_t successful = s.growth_tracker + 1;
  if (successful == o.growth_interval) {
    const float grown = float(double(s.scale) * o.growth_factor);
    if (std::isfinite(grown)) n.scale = std::min(grown, float(std::min<double>(o.max_scale, FLT_MAX)));
    n.growth_tracker = 0;
  } else {
    n.growth_tracker = successful;
  }
  return n;
}

}  // namespace detail

// ------------------------------------------------------------------------------- GradScaler

GradScaler::GradScaler(GradScalerOptions o) : o_(o), scale_(float(o.init_scale)), hysteresis_left_(o.hysteresis) {
  // PyTorch's checks, then ours.
  MIXPREC_CHECK(o.growth_factor > 1.0 || !o.dynamic, "GradScaler: the growth factor must be > 1.0, got ",
                o.growth_factor);
  MIXPREC_CHECK(o.backoff_factor < 1.0 || !o.dynamic, "GradScaler: the backoff factor must be < 1.0, got ",
                o.backoff_factor);
  MIXPREC_CHECK(o.backoff_factor > 0.0, "GradScaler: the backoff factor must be > 0, got ", o.backoff_factor);
  MIXPREC_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0 && std::isfinite(scale_) && scale_ > 0,
                "GradScaler: init_scale must be a finite f32 number > 0, got ", o.init_scale);
  MIXPREC_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval);
  MIXPREC_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", o.hysteresis);
  MIXPREC_CHECK(o.min_scale >= 0 && o.max_scale >= o.min_scale, "GradScaler: need 0 <= min_scale <= max_scale, got ",
                o.min_scale, " and ", o.max_scale);
  MIXPREC_CHECK(o.init_scale >= o.min_scale && o.init_scale <= o.max_scale, "GradScaler: init_scale ", o.init_scale,
                " is outside [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale, "]");
}

void GradScaler::require_scale(const char* call) const {
  MIXPREC_CHECK(scaled_since_update_, "GradScaler.", call,
                "(): no scale(loss) since the last update(); expected scale(loss).backward() first");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!o_.enabled) return loss;
  MIXPREC_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler.scale(): the loss must be a floating tensor");
  scaled_since_update_ = true;
  // An f32 factor, as PyTorch's _scale: a 16-bit loss is promoted, so the scale itself cannot overflow.
  return ops::mul(loss, Tensor::scalar(double(scale_), DType::f32));
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
  const float inv_scale = float(1.0 / double(scale_));  // PyTorch: _scale.double().reciprocal().float()
  const detail::InfCheck r = detail::unscale_and_check(opt.params(), inv_scale, /*check_only=*/false);
  st.checked = r.num_grads > 0;
  st.found_inf = r.found_inf;
  st.stage = Stage::unscaled;
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!o_.enabled) {
    opt.step();
    return true;
  }
  require_scale("step");
  OptState& st = state_of(opt);
  MIXPREC_CHECK(st.stage != Stage::stepped,
                "GradScaler.step(): step() has already been called on this optimizer "
                "since the last update(); expected update() next");
  const float inv_scale = float(1.0 / double(scale_));
  const bool fused = st.stage == Stage::ready;
  if (fused) {
    const detail::InfCheck r = detail::unscale_and_check(opt.params(), inv_scale, /*check_only=*/true);
    st.checked = r.num_grads > 0;
    st.found_inf = r.found_inf;
  }
  MIXPREC_CHECK(st.checked,
                "GradScaler.step(): no inf checks were recorded for this optimizer (none of its "
                "parameters has a gradient); expected scale(loss).backward() before step()");
  st.stage = Stage::stepped;
  if (st.found_inf) {
    ++skipped_steps_;
    return false;
  }
  if (fused)
    opt.step_unscale(inv_scale);
  else
    opt.step();
  return true;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  bool any = false, found = false;
  for (const auto& [opt, st] : per_opt_) {
    any = any || st.checked;
    found = found || (st.checked && st.found_inf);
  }
  MIXPREC_CHECK(any,
                "GradScaler.update(): no inf checks were recorded since the last update(); expected "
                "unscale_(optimizer) or step(optimizer) before update()");
  const detail::ScaleState n = detail::next_scale_state({scale_, growth_tracker_, hysteresis_left_}, found, o_);
  scale_ = n.scale;
  growth_tracker_ = n.growth_tracker;
  hysteresis_left_ = n.hysteresis_left;
  ++updates_;
  overflows_ += found ? 1 : 0;
  per_opt_.clear();
  scaled_since_update_ = false;
}

void GradScaler::update(double new_scale) {
  if (!o_.enabled) return;
  MIXPREC_CHECK(std::isfinite(new_scale) && new_scale > 0 && std::isfinite(float(new_scale)),
                "GradScaler.update(new_scale): new_scale must be a finite f32 number > 0, got ", new_scale);
  scale_ = float(new_scale);
  per_opt_.clear();
  scaled_since_update_ = false;
}

bool GradScaler::found_inf(const optim::Optimizer& opt) const {
  auto it = per_opt_.find(&opt);
  return it != per_opt_.end() && it->second.checked && it->second.found_inf;
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
  const double values[] = {double(scale_),
                           o_.growth_factor,
                           o_.backoff_factor,
                           double(o_.growth_interval),
                           double(growth_tracker_),
                           o_.dynamic ? 1.0 : 0.0,
                           double(o_.hysteresis),
                           double(hysteresis_left_),
                           o_.min_scale,
                           o_.max_scale,
                           o_.error_at_min_scale ? 1.0 : 0.0,
                           double(skipped_steps_),
                           double(overflows_),
                           double(updates_)};
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
  GradScaler check(o);  // validates the loaded options with the constructor's checks
  o_ = o;
  scale_ = float(get("scale", 1.0));
  growth_tracker_ = int64_t(get("_growth_tracker", 0));
  hysteresis_left_ = int64_t(get("_hysteresis_left", double(o.hysteresis)));
  skipped_steps_ = int64_t(get("_skipped_steps", 0));
  overflows_ = int64_t(get("_overflows", 0));
  updates_ = int64_t(get("_updates", 0));
}

}  // namespace mixprec::amp
