// SGD and AdamW: PyTorch's update rules as one fused pass per parameter. Blocks of the
// gradient are loaded to f32 (and unscaled on the fly), the f32 weights (the parameter, its
// master copy, or a buffer for a 16-bit parameter without one) are updated with the f32 state,
// and a 16-bit parameter is written back rounded once. f64 parameters update in f64.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>

#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "mixprec/error.h"
#include "mixprec/optim.h"
#include "optim/rounding.h"

namespace mixprec::optim {
namespace {

using kernels::cpu::load_f32;

constexpr int64_t kBlock = 2048;  // elements per block: a few 8 KiB f32 buffers stay in L1/L2

// Writes len f32 weights into a 16-bit parameter: round-to-nearest-even, or stochastically with
// the words of `stream` (element e of the parameter takes word e; begin is a multiple of 4).
void store_half(void* dst, DType t, int64_t begin, int64_t len, const float* src, const Generator* stream) {
  uint16_t* p = static_cast<uint16_t*>(dst) + begin;
  if (!stream) {
    if (t == DType::bf16)
      convert_f32_to_bf16(src, p, size_t(len));
    else
      convert_f32_to_f16(src, p, size_t(len));
    return;
  }
  for (int64_t j = 0; j < len; j += 4) {
    const std::array<uint32_t, 4> r = stream->block(uint64_t(begin + j) / 4);
    for (int64_t k = j; k < std::min(len, j + 4); ++k)
      p[k] = t == DType::bf16 ? f32_to_bf16_stochastic(src[k], r[size_t(k - j)])
                              : f32_to_f16_stochastic(src[k], r[size_t(k - j)]);
  }
}

// Runs rule(w, g, begin, len) over the blocks of one parameter: w are len weights to update in
// place (f32, or f64 for an f64 parameter), g the len gradients already multiplied by inv_scale.
// With `track`, counts for a 16-bit parameter the updates that changed the f32 weight but left
// the 16-bit one as it was (rounded away without a master; deferred into the master with one).
template <class Rule>
void fused_update(const Tensor& p, const Tensor& grad, const Tensor& master, float inv_scale,
                  const Generator* stochastic, Optimizer::RoundingStats* track, Rule&& rule) {
  const int64_t n = p.numel(), nb = (n + kBlock - 1) / kBlock;
  const DType pt = p.dtype(), gt = grad.dtype();
  if (pt == DType::f64) {
    double* w = p.data<double>();
    const double* g = grad.data<double>();
#pragma omp parallel for schedule(static) if (nb >= 8)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
      double gb[kBlock];
      for (int64_t j = 0; j < len; ++j) gb[j] = g[begin + j] * double(inv_scale);
      rule(w + begin, gb, begin, len);
    }
    return;
  }
  void* pp = p.data_ptr();
  const void* gp = grad.data_ptr();
  float* mp = master.defined() ? master.data<float>() : nullptr;
  const bool direct_g = gt == DType::f32 && inv_scale == 1.0f;
  const bool counting = track && is_half(pt);
  int64_t changed = 0, stuck = 0;
#pragma omp parallel for schedule(static) reduction(+ : changed, stuck) if (nb >= 8)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    alignas(64) float gb[kBlock];
    alignas(64) float wb[kBlock];
    const float* g = gb;
    if (direct_g) {
      g = static_cast<const float*>(gp) + begin;
    } else {
      load_f32(gp, gt, begin, len, gb);
      if (inv_scale != 1.0f)
        for (int64_t j = 0; j < len; ++j) gb[j] *= inv_scale;
    }
    float* w = wb;
    if (pt == DType::f32)
      w = static_cast<float*>(pp) + begin;
    else if (mp)
      w = mp + begin;
    else
      load_f32(pp, pt, begin, len, wb);
    alignas(64) float w_before[kBlock];
    alignas(64) float h_before[kBlock];
    if (counting) {
      std::memcpy(w_before, w, size_t(len) * 4);
      load_f32(pp, pt, begin, len, h_before);
    }
    rule(w, g, begin, len);
    if (is_half(pt)) store_half(pp, pt, begin, len, w, mp ? nullptr : stochastic);
    if (counting) {
      load_f32(pp, pt, begin, len, gb);  // the stored 16-bit weights (g is no longer needed)
      for (int64_t j = 0; j < len; ++j) {
        const bool moved = w[j] != w_before[j];
        changed += moved;
        stuck += moved && gb[j] == h_before[j];
      }
    }
  }
  if (counting) {
    track->changed += changed;
    track->unchanged_16bit += stuck;
  }
}

// The f32 AdamW rule of AdamW::update, 16 lanes at a time, over the whole 16-element groups of
// [0, len); returns how many elements it did (the scalar rule does the rest). The same
// operations in the same order as the scalar loop (ISO C++ mode: no contraction into FMA; IEEE
// sqrt and division), so the result is bit-identical to it.
struct AdamWConsts {
  float decay, b1, b2, step, inv_sqrt_bc2, eps;
};
__attribute__((target("avx512f"))) int64_t adamw_f32_avx512(float* w, const float* g, float* m, float* v, int64_t len,
                                                            const AdamWConsts& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1), b2 = _mm512_set1_ps(c.b2), one_b1 = _mm512_set1_ps(1.0f - c.b1),
               one_b2 = _mm512_set1_ps(1.0f - c.b2), decay = _mm512_set1_ps(c.decay), step = _mm512_set1_ps(c.step),
               bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 gj = _mm512_loadu_ps(g + j);
    const __m512 mj = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + j)), _mm512_mul_ps(one_b1, gj));
    const __m512 vj =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + j)), _mm512_mul_ps(_mm512_mul_ps(one_b2, gj), gj));
    _mm512_storeu_ps(m + j, mj);
    _mm512_storeu_ps(v + j, vj);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vj), bc2), eps);
    const __m512 wj =
        _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(w + j), decay), _mm512_div_ps(_mm512_mul_ps(step, mj), denom));
    _mm512_storeu_ps(w + j, wj);
  }
  return j;
}

// The f32 SGD rule of SGD::update, 16 lanes at a time over the whole groups (returns how many
// elements it did), bit-identical to the scalar loop (same operations in the same order, no
// contraction). buf is null without momentum.
struct SgdConsts {
  float lr, wd, mom, damp;
  bool first, nesterov;
};
__attribute__((target("avx512f"))) int64_t sgd_f32_avx512(float* w, const float* g, float* buf, int64_t len,
                                                          const SgdConsts& c) {
  const __m512 lr = _mm512_set1_ps(c.lr), wd = _mm512_set1_ps(c.wd), mom = _mm512_set1_ps(c.mom),
               damp = _mm512_set1_ps(c.damp);
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 wj = _mm512_loadu_ps(w + j);
    __m512 d = _mm512_add_ps(_mm512_loadu_ps(g + j), _mm512_mul_ps(wd, wj));
    if (buf) {
      const __m512 b =
          c.first ? d : _mm512_add_ps(_mm512_mul_ps(mom, _mm512_loadu_ps(buf + j)), _mm512_mul_ps(damp, d));
      _mm512_storeu_ps(buf + j, b);
      d = c.nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mom, b)) : b;
    }
    _mm512_storeu_ps(w + j, _mm512_sub_ps(wj, _mm512_mul_ps(lr, d)));
  }
  return j;
}

Tensor zeros_state(const Tensor& p) {
  MemoryScope scope(MemCategory::optimizer_state);
  return Tensor::zeros(p.shape(), p.dtype() == DType::f64 ? DType::f64 : DType::f32);
}

// The gradient of p as the update reads it: contiguous, in p's dtype or f32 (an unscaled f16
// gradient), f64 for f64.
Tensor checked_grad(const Tensor& p, size_t i) {
  Tensor g = p.grad();
  MIXPREC_CHECK(g.shape() == p.shape(), "optimizer: gradient of parameter ", i, " has shape ", shape_str(g.shape()),
                ", the parameter ", shape_str(p.shape()));
  const bool ok =
      p.dtype() == DType::f64 ? g.dtype() == DType::f64 : (g.dtype() == p.dtype() || g.dtype() == DType::f32);
  MIXPREC_CHECK(ok, "optimizer: gradient of parameter ", i, " is ", dtype_name(g.dtype()), " for a ",
                dtype_name(p.dtype()), " parameter");
  return g.is_contiguous() && g.offset() == 0 ? g : g.clone();
}

}  // namespace

namespace {

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> g(1);
  g[0].params = std::move(params);
  return g;
}

void check_lr(double lr) {
  MIXPREC_CHECK(lr >= 0 && std::isfinite(lr), "learning rate must be a finite number >= 0, got ", lr);
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay, HalfParamOptions half)
    : half_(half) {
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroupState st{{}, groups[g].options.lr.value_or(lr), groups[g].options.weight_decay.value_or(weight_decay)};
    check_lr(st.lr);
    MIXPREC_CHECK(st.weight_decay >= 0, "optimizer: weight_decay of parameter group ", g, " must be >= 0, got ",
                  st.weight_decay);
    for (Tensor& p : groups[g].params) {
      for (size_t j = 0; j < params_.size(); ++j)
        MIXPREC_CHECK(!params_[j].same(p), "optimizer: parameter ", params_.size(), " (in group ", g,
                      ") is also parameter ", j, ": a parameter may appear in one group only");
      st.params.push_back(params_.size());
      group_of_.push_back(g);
      params_.push_back(std::move(p));
    }
    groups_.push_back(std::move(st));
  }
  MIXPREC_CHECK(!params_.empty(), "optimizer got an empty parameter list");
  master_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MIXPREC_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "optimizer parameter ", i,
                  " must be a leaf tensor that requires grad");
    MIXPREC_CHECK(is_floating(p.dtype()), "optimizer parameter ", i, " is ", dtype_name(p.dtype()),
                  ": SGD/AdamW update f64, f32, bf16 or f16 parameters");
    MIXPREC_CHECK(p.is_contiguous() && p.offset() == 0, "optimizer parameter ", i, " ", shape_str(p.shape()),
                  " must be contiguous");
    if (is_half(p.dtype()) && half.master_weights) {
      MemoryScope scope(MemCategory::optimizer_state);
      master_[i] = Tensor::empty(p.shape(), DType::f32);
      convert(p.data_ptr(), p.dtype(), master_[i].data_ptr(), DType::f32, size_t(p.numel()));
    }
  }
}

void Optimizer::set_lr(size_t group, double lr) {
  MIXPREC_CHECK(group < groups_.size(), name(), ".set_lr: no parameter group ", group, " (", groups_.size(),
                " groups)");
  check_lr(lr);
  groups_[group].lr = lr;
}

void Optimizer::set_lr(double lr) {
  check_lr(lr);
  for (ParamGroupState& g : groups_) g.lr = lr;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      p.grad().zero_();
  }
}

void Optimizer::step_unscale(float inv_grad_scale) {
  MIXPREC_CHECK(std::isfinite(inv_grad_scale), name(), ".step: the gradient unscale factor is ", inv_grad_scale);
  ++steps_;
  update(inv_grad_scale);
}

Optimizer::RoundingStats Optimizer::take_rounding_stats() {
  const RoundingStats r = rounding_;
  rounding_ = {};
  return r;
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  sd.emplace_back("step", state_i64(steps_));
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    const ParamGroupState& pg = groups_[g];
    sd.emplace_back(prefix + "lr", Tensor::scalar(pg.lr, DType::f64));
    sd.emplace_back(prefix + "weight_decay", Tensor::scalar(pg.weight_decay, DType::f64));
    std::vector<int64_t> idx(pg.params.begin(), pg.params.end());
    sd.emplace_back(prefix + "params", Tensor::from_vector(idx, {int64_t(idx.size())}));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (master_[i].defined()) sd.emplace_back(prefix + "master", master_[i]);
    for (auto& [k, t] : named_state(i)) sd.emplace_back(prefix + k, t);
  }
  return sd;
}

namespace {

// "<prefix><n>.<rest>" with n < count: n and rest; nullopt for any other key.
std::optional<std::pair<size_t, std::string>> indexed_key(const std::string& key, const std::string& prefix,
                                                          size_t count) {
  if (key.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return std::nullopt;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return std::nullopt;
  const size_t n = size_t(std::stoul(digits));
  if (n >= count) return std::nullopt;
  return std::make_pair(n, key.substr(dot + 1));
}

}  // namespace

void Optimizer::load_state_dict(const StateDict& sd) {
  // Check every entry first: a bad state dict leaves the optimizer as it was.
  const std::string who = name();
  for (const auto& [key, t] : sd) {
    if (key == "step") {
      check_state(who, key, t, DType::i64, {});
    } else if (auto g = indexed_key(key, "param_groups.", groups_.size())) {
      const ParamGroupState& pg = groups_[g->first];
      if (g->second == "lr" || g->second == "weight_decay") {
        check_state(who, key, t, DType::f64, {});
        const double v = t.item();
        MIXPREC_CHECK(v >= 0 && std::isfinite(v), who, ".load_state_dict: '", key, "' is ", v,
                      ", expected a finite number >= 0");
      } else {
        MIXPREC_CHECK(g->second == "params", who, ".load_state_dict: unexpected key '", key, "'");
        check_state(who, key, t, DType::i64, {int64_t(pg.params.size())});
        const std::vector<int64_t> idx = t.to_vector_i64();
        MIXPREC_CHECK(std::equal(idx.begin(), idx.end(), pg.params.begin(),
                                 [](int64_t a, size_t b) { return a >= 0 && size_t(a) == b; }),
                      who, ".load_state_dict: '", key, "' lists other parameters than this optimizer's group ",
                      g->first);
      }
    } else if (auto s = indexed_key(key, "state.", params_.size())) {
      const size_t i = s->first;
      const Tensor& p = params_[i];
      check_state(who, key, t, p.dtype() == DType::f64 ? DType::f64 : DType::f32, p.shape());
      if (s->second == "master")
        MIXPREC_CHECK(master_[i].defined(), who, ".load_state_dict: '", key, "' but parameter ", i,
                      " keeps no master copy");
      else
        check_named_state(i, s->second);
    } else {
      MIXPREC_CHECK(false, who, ".load_state_dict: unexpected key '", key, "' (", groups_.size(), " groups, ",
                    params_.size(), " parameters)");
    }
  }
  MIXPREC_CHECK(find_state(sd, "step"), who, ".load_state_dict: missing key 'step'");
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const char* k : {"lr", "weight_decay", "params"}) {
      const std::string key = "param_groups." + std::to_string(g) + "." + k;
      MIXPREC_CHECK(find_state(sd, key), who, ".load_state_dict: missing key '", key, "'");
    }
  for (const auto& [key, t] : sd) {
    if (key == "step") {
      steps_ = state_to_i64(t);
    } else if (auto g = indexed_key(key, "param_groups.", groups_.size())) {
      if (g->second == "lr") groups_[g->first].lr = t.item();
      if (g->second == "weight_decay") groups_[g->first].weight_decay = t.item();
    } else if (auto s = indexed_key(key, "state.", params_.size())) {
      MemoryScope scope(MemCategory::optimizer_state);
      Tensor copy = t.detach().clone();
      if (s->second == "master")
        master_[s->first].copy_(copy);
      else
        set_named_state(s->first, s->second, copy);
    }
  }
}

// ---------------------------------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : SGD(one_group(std::move(params)), o) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(std::move(groups), o.lr, o.weight_decay, o.half), o_(o) {
  MIXPREC_CHECK(o.momentum >= 0, "SGD: momentum must be >= 0, got ", o.momentum);
  MIXPREC_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got ", o.weight_decay);
  MIXPREC_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                "SGD: nesterov needs momentum > 0 and dampening 0");
  momentum_.resize(params_.size());
}

void SGD::update(float inv_scale) {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const Tensor g = checked_grad(p, i);
    p.bump_version();  // an in-place write: caches keyed by version (reordered conv weights) must see it
    const bool first = o_.momentum != 0 && !momentum_[i].defined();
    if (first) momentum_[i] = zeros_state(p);
    void* buf_base = o_.momentum != 0 ? momentum_[i].data_ptr() : nullptr;
    const ParamGroupState& group = groups_[group_of_[i]];
    const double lr = group.lr, wd = group.weight_decay, mom = o_.momentum, damp = 1 - o_.dampening;
    const bool nesterov = o_.nesterov;
    const Generator stream = rounding_stream(half_.seed, uint64_t(steps_), i);
    const bool vectorised = mixprec::cpu::has_avx512f();
    fused_update(p, g, master_[i], inv_scale, half_.stochastic_rounding ? &stream : nullptr,
                 track_ ? &rounding_ : nullptr, [&](auto* w, const auto* gr, int64_t begin, int64_t len) {
                   using T = std::remove_pointer_t<decltype(w)>;
                   T* buf = buf_base ? static_cast<T*>(buf_base) + begin : nullptr;
                   const T tlr = T(lr), twd = T(wd), tmom = T(mom), tdamp = T(damp);
                   int64_t j = 0;
                   if constexpr (std::is_same_v<T, float>)
                     if (vectorised) j = sgd_f32_avx512(w, gr, buf, len, {tlr, twd, tmom, tdamp, first, nesterov});
                   for (; j < len; ++j) {
                     T d = gr[j] + twd * w[j];
                     if (buf) {
                       buf[j] = first ? d : tmom * buf[j] + tdamp * d;  // PyTorch: the first step copies d
                       d = nesterov ? d + tmom * buf[j] : buf[j];
                     }
                     w[j] -= tlr * d;
                   }
                 });
  }
}

StateDict SGD::named_state(size_t i) const {
  if (!momentum_[i].defined()) return {};
  return {{"momentum_buffer", momentum_[i]}};
}

void SGD::check_named_state(size_t i, const std::string& key) const {
  MIXPREC_CHECK(key == "momentum_buffer", "SGD.load_state_dict: unexpected key 'state.", i, ".", key, "'");
  MIXPREC_CHECK(o_.momentum != 0, "SGD.load_state_dict: 'state.", i,
                ".momentum_buffer' for an optimizer without momentum");
}

void SGD::set_named_state(size_t i, const std::string& key, const Tensor& t) { momentum_[i] = t; }

// -------------------------------------------------------------------------------------- AdamW

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : AdamW(one_group(std::move(params)), o) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o)
    : Optimizer(std::move(groups), o.lr, o.weight_decay, o.half), o_(o) {
  MIXPREC_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got (",
                o.beta1, ", ", o.beta2, ")");
  MIXPREC_CHECK(o.eps >= 0, "AdamW: eps must be >= 0, got ", o.eps);
  MIXPREC_CHECK(o.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", o.weight_decay);
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
}

void AdamW::update(float inv_scale) {
  const double bc1 = 1 - std::pow(o_.beta1, double(steps_));
  const double bc2 = 1 - std::pow(o_.beta2, double(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const Tensor g = checked_grad(p, i);
    p.bump_version();  // an in-place write: caches keyed by version (reordered conv weights) must see it
    // Each on its own: a loaded state dict may hold one moment without the other.
    if (!exp_avg_[i].defined()) exp_avg_[i] = zeros_state(p);
    if (!exp_avg_sq_[i].defined()) exp_avg_sq_[i] = zeros_state(p);
    void* m_base = exp_avg_[i].data_ptr();
    void* v_base = exp_avg_sq_[i].data_ptr();
    const ParamGroupState& group = groups_[group_of_[i]];
    const double decay = 1 - group.lr * group.weight_decay, b1 = o_.beta1, b2 = o_.beta2;
    const double step_size = group.lr / bc1, inv_sqrt_bc2 = 1 / std::sqrt(bc2), eps = o_.eps;
    const Generator stream = rounding_stream(half_.seed, uint64_t(steps_), i);
    const bool vectorised = mixprec::cpu::has_avx512f();
    fused_update(p, g, master_[i], inv_scale, half_.stochastic_rounding ? &stream : nullptr,
                 track_ ? &rounding_ : nullptr, [&](auto* w, const auto* gr, int64_t begin, int64_t len) {
                   using T = std::remove_pointer_t<decltype(w)>;
                   T* m = static_cast<T*>(m_base) + begin;
                   T* v = static_cast<T*>(v_base) + begin;
                   const T tdecay = T(decay), tb1 = T(b1), tb2 = T(b2), tstep = T(step_size), tbc2 = T(inv_sqrt_bc2),
                           teps = T(eps);
                   int64_t j = 0;
                   if constexpr (std::is_same_v<T, float>)
                     if (vectorised) j = adamw_f32_avx512(w, gr, m, v, len, {tdecay, tb1, tb2, tstep, tbc2, teps});
                   for (; j < len; ++j) {
                     const T gj = gr[j];
                     m[j] = tb1 * m[j] + (T(1) - tb1) * gj;
                     v[j] = tb2 * v[j] + (T(1) - tb2) * gj * gj;
                     const T denom = std::sqrt(v[j]) * tbc2 + teps;
                     w[j] = w[j] * tdecay - tstep * m[j] / denom;
                   }
                 });
  }
}

StateDict AdamW::named_state(size_t i) const {
  StateDict out;
  if (exp_avg_[i].defined()) out.emplace_back("exp_avg", exp_avg_[i]);
  if (exp_avg_sq_[i].defined()) out.emplace_back("exp_avg_sq", exp_avg_sq_[i]);
  return out;
}

void AdamW::check_named_state(size_t i, const std::string& key) const {
  MIXPREC_CHECK(key == "exp_avg" || key == "exp_avg_sq", "AdamW.load_state_dict: unexpected key 'state.", i, ".", key,
                "'");
}

void AdamW::set_named_state(size_t i, const std::string& key, const Tensor& t) {
  (key == "exp_avg" ? exp_avg_ : exp_avg_sq_)[i] = t;
}

}  // namespace mixprec::optim
