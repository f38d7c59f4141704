// Gradient range statistics against the f16 limits, the scale trace, the autocast trace table,
// and the optimizer-settings check.
#include "mixprec/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kernels/optim.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::amp {
namespace {

struct Counts {
  int64_t zero = 0, underflow = 0, underflow_unscaled = 0, subnormal = 0, overflow = 0, overflow_unscaled = 0;
  double max_abs = 0, sum_sq = 0;
  int64_t finite = 0;
  void add(const Counts& o) {
    zero += o.zero, underflow += o.underflow, underflow_unscaled += o.underflow_unscaled;
    subnormal += o.subnormal, overflow += o.overflow, overflow_unscaled += o.overflow_unscaled;
    max_abs = std::max(max_abs, o.max_abs);
    sum_sq += o.sum_sq, finite += o.finite;
  }
};

// The counts of one gradient, reduced on its device and copied here (diagnostics are asked for).
Counts count(const Tensor& g, double scale) {
  const Tensor c = g.is_contiguous() ? g : g.clone();
  const std::vector<double> k = kernels::grad_range_counts(c, scale).to_vector_f64();
  Counts total;
  total.zero = int64_t(k[kernels::kZero]);
  total.underflow = int64_t(k[kernels::kUnderflow]);
  total.underflow_unscaled = int64_t(k[kernels::kUnderflowUnscaled]);
  total.subnormal = int64_t(k[kernels::kSubnormal]);
  total.overflow = int64_t(k[kernels::kOverflow]);
  total.overflow_unscaled = int64_t(k[kernels::kOverflowUnscaled]);
  total.max_abs = k[kernels::kMaxAbs] / scale;  // sum_sq is accumulated unscaled already
  total.sum_sq = k[kernels::kSumSq];
  total.finite = int64_t(k[kernels::kFinite]);
  return total;
}

GradStats to_stats(const std::string& name, DType dtype, int64_t n, const Counts& k) {
  const double d = double(std::max<int64_t>(n, 1));
  return {name,
          dtype,
          n,
          double(k.zero) / d,
          double(k.underflow) / d,
          double(k.underflow_unscaled) / d,
          double(k.subnormal) / d,
          double(k.overflow) / d,
          double(k.overflow_unscaled) / d,
          k.max_abs,
          std::sqrt(k.sum_sq / double(std::max<int64_t>(k.finite, 1)))};
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

std::vector<GradStats> gradient_stats(const std::vector<std::pair<std::string, Tensor>>& params, double scale) {
  MIXPREC_CHECK(scale > 0 && std::isfinite(scale), "gradient_stats: scale must be a finite number > 0, got ", scale);
  std::vector<GradStats> out;
  Counts all;
  int64_t all_n = 0;
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const Counts k = count(g, scale);
    out.push_back(to_stats(name, g.dtype(), g.numel(), k));
    all.add(k);
    all_n += g.numel();
  }
  out.push_back(to_stats("(all)", DType::f32, all_n, all));
  return out;
}

std::string format_gradient_stats(const std::vector<GradStats>& stats, double scale) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %5s %10s %7s | %-28s | %-19s | %-19s\n", "gradient", "dtype", "numel", "zero",
                ("in f16 at scale " + fmt("%g", scale) + ":").c_str(), "in f16 unscaled:", "unscaled |g|:");
  os << line;
  std::snprintf(line, sizeof line, "%-24s %5s %10s %7s | %9s %8s %9s | %9s %9s | %9s %9s\n", "", "", "", "",
                "underflow", "subnorm", "overflow", "underflow", "overflow", "rms", "max");
  os << line;
  for (const GradStats& s : stats) {
    std::snprintf(
        line, sizeof line, "%-24s %5s %10lld %6.2f%% | %8.2f%% %7.2f%% %8.4f%% | %8.2f%% %8.4f%% | %9.2e %9.2e\n",
        s.name.c_str(), std::string(dtype_name(s.dtype)).c_str(), (long long)s.numel, 100 * s.zero, 100 * s.underflow,
        100 * s.subnormal, 100 * s.overflow, 100 * s.underflow_unscaled, 100 * s.overflow_unscaled, s.rms, s.max_abs);
    os << line;
  }
  return os.str();
}

void ScaleTrace::record(int64_t step, double scale, bool skipped) {
  if (changes_.empty() || changes_.back().second != scale) changes_.emplace_back(step, scale);
  if (skipped) skipped_.push_back(step);
}

std::string ScaleTrace::summary() const {
  std::ostringstream os;
  os << "scale";
  const size_t show = 12;  // the first and last changes; the metrics file has every step
  for (size_t i = 0; i < changes_.size(); ++i) {
    if (changes_.size() > 2 * show && i == show) os << " -> ... (" << changes_.size() - 2 * show << " more)";
    if (changes_.size() > 2 * show && i >= show && i < changes_.size() - show) continue;
    os << (i ? " -> " : " ") << changes_[i].second << " (step " << changes_[i].first << ")";
  }
  if (changes_.empty()) os << " (no steps)";
  os << "; " << skipped_.size() << " skipped step" << (skipped_.size() == 1 ? "" : "s");
  for (size_t i = 0; i < std::min<size_t>(skipped_.size(), 20); ++i) os << (i ? ", " : ": ") << skipped_[i];
  if (skipped_.size() > 20) os << ", ...";
  return os.str();
}

std::string format_autocast_trace(const std::vector<TraceEntry>& trace) {
  std::ostringstream os;
  if (trace.empty()) return "autocast trace: no op ran under autocast (every op ran in its input dtype)\n";
  char line[200];
  std::snprintf(line, sizeof line, "%-16s %-20s %s\n", "op", "input dtypes", "ran in");
  os << line;
  for (const TraceEntry& e : trace) {
    std::snprintf(line, sizeof line, "%-16s %-20s %s\n", e.op.c_str(), e.input_dtypes.c_str(), e.run_dtype.c_str());
    os << line;
  }
  return os.str();
}

std::vector<std::string> optimizer_warnings(const optim::Optimizer& opt) {
  std::vector<std::string> out;
  // 16-bit dtypes whose parameters this optimizer rounds into 16 bits after every update.
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < opt.params().size(); ++i)
      if (opt.params()[i].dtype() == t && !opt.master(i).defined()) idx.push_back(i);
    if (idx.empty()) continue;
    const std::string tn(dtype_name(t));
    const int mant = t == DType::bf16 ? 7 : 10;
    const double half_ulp = std::ldexp(1.0, -(mant + 1));  // relative, at best (just above a power of 2)
    const bool sr = opt.half_options().stochastic_rounding;
    const std::string where =
        std::to_string(idx.size()) + " " + tn + " parameter" + (idx.size() == 1 ? "" : "s") + " without a master copy";
    const double eps = opt.eps();
    if (eps > 0) {
      uint16_t h = 0;
      convert(&eps, DType::f64, &h, t, 1);
      float back = 0;
      convert(&h, t, &back, DType::f32, 1);
      if (back == 0)
        out.push_back(detail::concat(
            opt.name(), " eps=", eps, " cannot be represented in ", tn, " (it rounds to 0; the ", "smallest ", tn,
            " is ", t == DType::f16 ? "6.0e-08" : "9.2e-41", ") for ", where, ": an update computed in ", tn,
            " divides by sqrt(v) alone. mixprec adds eps in "
            "f32 with f32 state; keep it that way, or use eps >= ",
            t == DType::f16 ? "1e-4 in f16 arithmetic" : "its smallest normal"));
    }
    // Per parameter group (each has its own lr and weight decay), over the group's parameters in idx.
    for (size_t g = 0; g < opt.param_groups().size(); ++g) {
      const double lr = opt.lr(g);
      std::vector<size_t> in_group;
      for (size_t i : idx)
        if (opt.group_of(i) == g) in_group.push_back(i);
      if (in_group.empty()) continue;
      const std::string group = opt.param_groups().size() > 1 ? detail::concat(" (group ", g, ")") : "";
      const double decay_step = lr * opt.weight_decay(g);
      if (decay_step > 0 && decay_step < half_ulp && !sr)
        out.push_back(detail::concat(opt.name(), group, " weight decay lr*weight_decay = ", decay_step,
                                     " per step is below half ", "an ulp of any ", tn, " weight (", half_ulp,
                                     " relative) for ", where,
                                     ": rounded to nearest, the decay never changes a weight (use master weights or "
                                     "stochastic rounding)"));
      if (opt.name() == "AdamW" && !sr && lr > 0) {
        // An Adam step moves a weight by about lr; it is lost where |w| * half_ulp > lr.
        const double bound = lr / half_ulp;
        int64_t lost = 0, n = 0;
        for (size_t i : in_group) {
          for (float w : opt.params()[i].to_vector()) lost += std::fabs(w) > bound;
          n += opt.params()[i].numel();
        }
        if (lost > 0)
          out.push_back(
              detail::concat(opt.name(), group, " lr=", lr, ": ", fmt("%.2f", 100.0 * double(lost) / double(n)),
                             "% of the weights of ", where, " exceed |w| = ", bound, ", where a step of lr is ",
                             "below half an ulp and rounds away (use master weights or stochastic rounding)"));
      }
    }
  }
  return out;
}

}  // namespace mixprec::amp
