// The per-element and per-step rules of the optimizer family (kernels/optim.h), written once for
// the reference, CPU and CUDA kernels (host and device functions): the same operations in the
// same order everywhere, so the CPU kernels stay bit-identical to each other and the GPU's differ
// only by its FMA contraction and libm.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MIXPREC_HD __host__ __device__ inline
#else
#define MIXPREC_HD inline
#endif

namespace mixprec::kernels::rule {

// SGD (PyTorch's torch.optim.SGD): d = g + wd*w; with momentum buf = d on the first step, else
// mom*buf + (1 - dampening)*d; nesterov: d + mom*buf, else buf; w -= lr*d. T: f32 or f64.
template <class T>
struct Sgd {
  T lr, wd, mom, damp;
  bool first, nesterov;
};
template <class T>
MIXPREC_HD Sgd<T> sgd_consts(double lr, double wd, double momentum, double dampening, bool first, bool nesterov) {
  return {T(lr), T(wd), T(momentum), T(1 - dampening), first, nesterov};
}
template <class T>
MIXPREC_HD void sgd(T& w, T g, T* buf, const Sgd<T>& c) {
  T d = g + c.wd * w;
  if (buf) {
    *buf = c.first ? d : c.mom * *buf + c.damp * d;  // PyTorch: the first step copies d
    d = c.nesterov ? d + c.mom * *buf : *buf;
  }
  w -= c.lr * d;
}

// AdamW (PyTorch's torch.optim.AdamW, decoupled decay), with the bias corrections of step
// `step` (the count including this step) computed in f64.
template <class T>
struct AdamW {
  T decay, b1, b2, step_size, inv_sqrt_bc2, eps;
};
template <class T>
MIXPREC_HD AdamW<T> adamw_consts(double lr, double wd, double beta1, double beta2, double eps, int64_t step) {
  const double bc1 = 1 - std::pow(beta1, double(step)), bc2 = 1 - std::pow(beta2, double(step));
  return {T(1 - lr * wd), T(beta1), T(beta2), T(lr / bc1), T(1 / std::sqrt(bc2)), T(eps)};
}
template <class T>
MIXPREC_HD void adamw(T& w, T g, T& m, T& v, const AdamW<T>& c) {
  m = c.b1 * m + (T(1) - c.b1) * g;
  v = c.b2 * v + (T(1) - c.b2) * g * g;
  const T denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
  w = w * c.decay - c.step_size * m / denom;
}

// The loss-scale update: PyTorch's _amp_update_scale_ (the f32 scale times the f64 factor,
// stored as f32; growth that overflows f32 keeps the scale), with DeepSpeed's consecutive
// hysteresis and our bounds. Plain numbers, so the kernel's argument is trivially copyable.
struct ScaleRule {
  double growth_factor, backoff_factor;
  int64_t growth_interval;
  bool dynamic;
  int64_t hysteresis;
  double min_scale, max_scale;
  bool error_at_min_scale;
};
struct ScaleState {
  float scale;
  int64_t growth_tracker;
  int64_t hysteresis_left;
};
// The state after one update that saw `found_inf`; *min_scale_error is set (and the state left
// as it was) for an overflow at min_scale with error_at_min_scale.
MIXPREC_HD ScaleState next_scale(const ScaleState& s, bool found_inf, const ScaleRule& o, bool* min_scale_error) {
  *min_scale_error = false;
  if (!o.dynamic) return s;
  ScaleState n = s;
  if (found_inf) {
    n.growth_tracker = 0;
    if (s.hysteresis_left > 1) {  // an overflow within the hysteresis: skip the step, keep the scale
      n.hysteresis_left = s.hysteresis_left - 1;
      return n;
    }
    if (o.error_at_min_scale && double(s.scale) <= o.min_scale) {
      *min_scale_error = true;
      return s;
    }
    n.scale = float(double(s.scale) * o.backoff_factor);
    if (o.min_scale > 0 && n.scale < float(o.min_scale)) n.scale = float(o.min_scale);
    return n;
  }
  n.hysteresis_left = o.hysteresis;  // consecutive overflows only
  const int64_t successful = s.growth_tracker + 1;
  if (successful == o.growth_interval) {
    const float grown = float(double(s.scale) * o.growth_factor);
    const double cap = o.max_scale < 3.4028234663852886e38 ? o.max_scale : 3.4028234663852886e38;  // FLT_MAX
    if (std::isfinite(grown)) n.scale = float(cap) < grown ? float(cap) : grown;  // std::min(grown, cap)
    n.growth_tracker = 0;
  } else {
    n.growth_tracker = successful;
  }
  return n;
}

// 1/scale as PyTorch unscales: _scale.double().reciprocal().float().
MIXPREC_HD float inv_scale(float scale) { return float(1.0 / double(scale)); }

// clip_grad_norm_'s factor, PyTorch's: max_norm / (total + 1e-6), clamped to 1 (1e-6 guards a
// zero norm). std::min(1.0, c): a NaN norm gives 1 (the gradients are left as they are).
MIXPREC_HD double clip_coef(double total, double max_norm) {
  const double c = max_norm / (total + 1e-6);
  return c < 1.0 ? c : 1.0;
}

// The inf-norm's step: the larger of a and b, NaN if either is (std::max would drop a NaN in b).
// Host code: the reference and CPU gradient norms, which must agree bit for bit.
inline double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? b : a); }

// A norm block's sum (kernels/optim.h, grad_norm): element e of the block into f64 lane
// e % kNormLanes, each lane summed in element order, the lanes then added by lane_tree_sum
// (kernels/lane_tree.h). One chain of additions through the block made the sum wait on the
// adder's latency (the gpt's 0.8 M gradients: 0.66 ms of a 44 ms step on the AMX host); 16 chains
// run side by side, in two AVX-512 registers.
constexpr int kNormLanes = 16;

}  // namespace mixprec::kernels::rule
