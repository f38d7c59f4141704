// Reference kernels of the optimizer family: one element at a time with the shared rules
// (optim_rules.h); the norm and range reductions keep their block order (the definition), run in
// parallel over blocks.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "kernels/lane_tree.h"
#include "kernels/optim.h"
#include "kernels/ref/optim_scalars.h"
#include "mixprec/convert.h"
#include "optim/rounding.h"

namespace mixprec::kernels::ref {
namespace {

// Element e of a contiguous tensor as T (f32 or f64), and back rounded once to its dtype. The
// floating dtypes are read and written here directly (the same roundings convert() makes):
// convert() per element would open an OpenMP region per element, inside these kernels' own
// parallel loops (GPT clipping spent most of its step there).
template <class T>
T load(const Tensor& t, int64_t e) {
  const char* p = static_cast<const char*>(t.data_ptr()) + e * int64_t(dtype_size(t.dtype()));
  switch (t.dtype()) {
    case DType::f32:
      return T(*reinterpret_cast<const float*>(p));
    case DType::f64:
      return T(*reinterpret_cast<const double*>(p));  // to f32: one RNE rounding, as convert's
    case DType::bf16:
      return T(bf16_to_f32(*reinterpret_cast<const uint16_t*>(p)));
    case DType::f16:
      return T(f16_to_f32(*reinterpret_cast<const uint16_t*>(p)));
    default:
      break;
  }
  T v{};
  convert(p, t.dtype(), &v, std::is_same_v<T, double> ? DType::f64 : DType::f32, 1);
  return v;
}
template <class T>
void store(const Tensor& t, int64_t e, T v) {
  char* p = static_cast<char*>(t.data_ptr()) + e * int64_t(dtype_size(t.dtype()));
  const DType d = t.dtype();
  if (d == DType::f32) {
    *reinterpret_cast<float*>(p) = float(v);
  } else if (d == DType::f64) {
    *reinterpret_cast<double*>(p) = double(v);
  } else if (std::is_same_v<T, float> && d == DType::bf16) {
    *reinterpret_cast<uint16_t*>(p) = f32_to_bf16(float(v));
  } else if (std::is_same_v<T, float> && d == DType::f16) {
    *reinterpret_cast<uint16_t*>(p) = f32_to_f16(float(v));
  } else {
    // f64 into 16 bits: convert rounds through an f32 rounded to odd (one correct rounding).
    convert(&v, std::is_same_v<T, double> ? DType::f64 : DType::f32, p, d, 1);
  }
}

// Runs rule(w, g, p, e) (T& w, T g) over every element of every parameter, as the fused update
// defines it: g read and unscaled, w the f32 (f64) weight (the parameter, its master, or the
// 16-bit value widened), the 16-bit parameter written back rounded once (stochastically when
// asked). Counts the rounding statistics when s.rounding is defined.
template <class Rule>
void update_all(const std::vector<OptimParam>& ps, const OptimStep& s, int64_t step, Rule&& rule) {
  const float inv = s.scale.defined() ? rule::inv_scale(scalar<float>(s.scale)) : 1.0f;
  int64_t changed = 0, stuck = 0;
  for (const OptimParam& p : ps) {
    const DType pt = p.param.dtype();
    const bool sr = s.stochastic && is_half(pt) && !p.master.defined();
    const Generator stream = optim::rounding_stream(s.seed, uint64_t(step), p.index);
    for (int64_t e = 0; e < p.param.numel(); ++e) {
      if (pt == DType::f64) {
        double w = load<double>(p.param, e);
        rule(w, load<double>(p.grad, e) * double(inv), p, e);
        store(p.param, e, w);
        continue;
      }
      float g = load<float>(p.grad, e);
      if (s.scale.defined()) g *= inv;
      float w = p.master.defined() ? load<float>(p.master, e) : load<float>(p.param, e);
      const float w_before = w, h_before = load<float>(p.param, e);
      rule(w, g, p, e);
      if (p.master.defined()) store(p.master, e, w);
      if (!is_half(pt)) {
        store(p.param, e, w);
        continue;
      }
      auto* dst = static_cast<uint16_t*>(p.param.data_ptr()) + e;
      if (sr) {
        const uint32_t r = stream.block(uint64_t(e) / 4)[size_t(e % 4)];
        *dst = pt == DType::bf16 ? optim::f32_to_bf16_stochastic(w, r) : optim::f32_to_f16_stochastic(w, r);
      } else {
        *dst = pt == DType::bf16 ? f32_to_bf16(w) : f32_to_f16(w);
      }
      const bool moved = w != w_before;
      changed += moved;
      stuck += moved && load<float>(p.param, e) == h_before;
    }
  }
  if (s.rounding.defined()) {
    static_cast<int64_t*>(s.rounding.data_ptr())[0] += changed;
    static_cast<int64_t*>(s.rounding.data_ptr())[1] += stuck;
  }
}

}  // namespace

void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf) {
  const float inv = rule::inv_scale(scalar<float>(scale));
  bool ok = true;
  for (size_t i = 0; i < src.size(); ++i) {
    for (int64_t e = 0; e < src[i].numel(); ++e) {
      if (src[i].dtype() == DType::f64) {
        const double v = load<double>(src[i], e);
        ok &= std::fabs(v) <= DBL_MAX;
        if (dst[i].defined()) store(dst[i], e, v * double(inv));
        continue;
      }
      const float v = load<float>(src[i], e);
      ok &= std::fabs(v) <= FLT_MAX;  // false for inf and NaN
      if (dst[i].defined()) store(dst[i], e, v * inv);
    }
  }
  if (!ok) scalar<float>(found_inf) = 1.0f;
}

void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s) {
  if (skipped(s)) return;
  const int64_t step = scalar<int64_t>(s.step) + 1;
  uint8_t* ready = o.momentum != 0 ? static_cast<uint8_t*>(o.momentum_ready.data_ptr()) : nullptr;
  update_all(params, s, step, [&](auto& w, auto g, const OptimParam& p, int64_t e) {
    using T = std::remove_reference_t<decltype(w)>;
    const bool first = ready && !ready[p.index];
    const auto c =
        rule::sgd_consts<T>(scalar<double>(p.lr), p.weight_decay, o.momentum, o.dampening, first, o.nesterov);
    T* buf = ready ? static_cast<T*>(p.state1.data_ptr()) + e : nullptr;
    rule::sgd(w, g, buf, c);
  });
  if (ready)
    for (const OptimParam& p : params) ready[p.index] = 1;
  scalar<int64_t>(s.step) = step;
}

void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s) {
  if (skipped(s)) return;
  const int64_t step = scalar<int64_t>(s.step) + 1;
  update_all(params, s, step, [&](auto& w, auto g, const OptimParam& p, int64_t e) {
    using T = std::remove_reference_t<decltype(w)>;
    const auto c = rule::adamw_consts<T>(scalar<double>(p.lr), p.weight_decay, o.beta1, o.beta2, o.eps, step);
    rule::adamw(w, g, static_cast<T*>(p.state1.data_ptr())[e], static_cast<T*>(p.state2.data_ptr())[e], c);
  });
  scalar<int64_t>(s.step) = step;
}

void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r) {
  bool found = false;
  for (const Tensor& f : found_infs) found = found || scalar<float>(f) != 0;
  int64_t* c = static_cast<int64_t*>(counters.data_ptr());
  bool error = false;
  const rule::ScaleState n =
      rule::next_scale({scalar<float>(scale), c[kGrowthTracker], c[kHysteresisLeft]}, found, r, &error);
  if (error) {  // the state stays as it was; the host reads the flag when asked
    c[kMinScaleError] = 1;
    return;
  }
  scalar<float>(scale) = n.scale;
  c[kGrowthTracker] = n.growth_tracker;
  c[kHysteresisLeft] = n.hysteresis_left;
  c[kUpdates] += 1;
  c[kOverflows] += found ? 1 : 0;
}

void count_skipped(Tensor& counters, const Tensor& found_inf) {
  static_cast<int64_t*>(counters.data_ptr())[kSkippedSteps] += scalar<float>(found_inf) != 0 ? 1 : 0;
}

void increment(Tensor& counter) { scalar<int64_t>(counter) += 1; }

Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  const bool is_inf = std::isinf(norm_type);
  auto combine = [is_inf](double acc, double s) { return is_inf ? rule::nan_max(acc, s) : acc + s; };
  double acc = 0;
  for (const Tensor& g : grads) {
    const int64_t n = g.numel(), nb = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(size_t(nb), 0.0);
#pragma omp parallel for schedule(static) if (nb >= 8)
    for (int64_t b = 0; b < nb; ++b) {
      double s = 0, lanes[rule::kNormLanes] = {};
      for (int64_t e = b * kNormBlock; e < std::min(n, (b + 1) * kNormBlock); ++e) {
        const double v = load<double>(g, e);
        double& lane = lanes[(e - b * kNormBlock) % rule::kNormLanes];
        if (is_inf)
          s = rule::nan_max(s, std::fabs(v));
        else if (norm_type == 2.0)
          lane += v * v;
        else
          lane += std::pow(std::fabs(v), norm_type);
      }
      partial[size_t(b)] = is_inf ? s : lane_tree_sum<rule::kNormLanes>(lanes);
    }
    for (double s : partial) acc = combine(acc, s);
  }
  const double total = is_inf ? acc : norm_type == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / norm_type);
  Tensor out = Tensor::empty({}, DType::f64);
  scalar<double>(out) = total;
  return out;
}

namespace {
template <class Op>
void transform(const std::vector<Tensor>& grads, Op&& op) {
  for (const Tensor& g : grads) {
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n >= 8 * kNormBlock)
    for (int64_t e = 0; e < n; ++e) store(g, e, op(load<double>(g, e)));
  }
}
}  // namespace

void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm) {
  const double coef = rule::clip_coef(scalar<double>(total), max_norm);
  if (coef == 1.0) return;  // multiplying by 1 changes nothing
  transform(grads, [coef](double v) { return v * coef; });
}

void clip_by_value(const std::vector<Tensor>& grads, double clip_value) {
  transform(grads, [clip_value](double v) { return std::isnan(v) ? v : std::clamp(v, -clip_value, clip_value); });
}

Tensor grad_range_counts(const Tensor& g, double scale) {
  // The f16 bounds of mixprec/diagnostics.h (not included: kernels do not see amp's headers).
  constexpr double kZeroBound = 0x1p-25, kMinNormal = 0x1p-14, kOverflowBound = 65520.0;
  const int64_t n = g.numel(), nb = (n + kNormBlock - 1) / kNormBlock;
  const double zero_unscaled = kZeroBound * scale, over_unscaled = kOverflowBound * scale, inv_scale = 1 / scale;
  std::vector<std::array<double, kRangeCounts>> parts(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (nb >= 8)
  for (int64_t b = 0; b < nb; ++b) {
    std::array<double, kRangeCounts> k{};
    int64_t zero = 0, under = 0, under_u = 0, sub = 0, over = 0, over_u = 0, finite = 0;
    for (int64_t e = b * kNormBlock; e < std::min(n, (b + 1) * kNormBlock); ++e) {
      const double a = std::fabs(load<double>(g, e));
      zero += a == 0;
      under += a <= kZeroBound;
      under_u += a <= zero_unscaled;
      sub += a > kZeroBound && a < kMinNormal;
      over += !(a < kOverflowBound);  // NaN counts
      over_u += !(a < over_unscaled);
      if (std::isfinite(a)) {
        k[kMaxAbs] = std::max(k[kMaxAbs], a);
        k[kSumSq] += (a * inv_scale) * (a * inv_scale);
        ++finite;
      }
    }
    k[kZero] = double(zero), k[kUnderflow] = double(under), k[kUnderflowUnscaled] = double(under_u);
    k[kSubnormal] = double(sub), k[kOverflow] = double(over), k[kOverflowUnscaled] = double(over_u);
    k[kFinite] = double(finite);
    parts[size_t(b)] = k;
  }
  std::array<double, kRangeCounts> total{};
  for (const auto& k : parts)
    for (int64_t j = 0; j < kRangeCounts; ++j)
      total[size_t(j)] = j == kMaxAbs ? std::max(total[size_t(j)], k[size_t(j)]) : total[size_t(j)] + k[size_t(j)];
  Tensor out = Tensor::empty({kRangeCounts}, DType::f64);
  std::copy(total.begin(), total.end(), static_cast<double*>(out.data_ptr()));
  return out;
}

}  // namespace mixprec::kernels::ref
