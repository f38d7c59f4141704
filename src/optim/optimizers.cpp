// SGD and AdamW: PyTorch's update rules as one fused loop per parameter (f32 math; f64 params
// update in f64).
#include <cmath>

#include "kernels/ref/access.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/optim.h"

namespace mixprec::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  MIXPREC_CHECK(!params_.empty(), "optimizer got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    MIXPREC_CHECK(params_[i].defined() && params_[i].is_leaf() && params_[i].requires_grad(),
                  "optimizer parameter ", i, " must be a leaf tensor that requires grad");
    MIXPREC_CHECK(params_[i].dtype() == DType::f32 || params_[i].dtype() == DType::f64, "optimizer parameter ", i,
                  " is ", dtype_name(params_[i].dtype()), ": SGD/AdamW update f32 (or f64) parameters");
  }
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  MIXPREC_CHECK(lr >= 0 && std::isfinite(lr), "learning rate must be a finite number >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else p.grad().zero_();
  }
}

namespace {

Tensor zeros_like_state(const Tensor& p) {
  MemoryScope scope(MemCategory::optimizer_state);
  return Tensor::zeros(p.shape(), p.dtype());
}

// Calls f(T{}) for f32 or f64 parameters.
template <class F>
void by_param_type(DType t, F&& f) {
  if (t == DType::f64) f(double{});
  else f(float{});
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  MIXPREC_CHECK(o.momentum >= 0, "SGD: momentum must be >= 0, got ", o.momentum);
  MIXPREC_CHECK(o.weight_decay >= 0, "SGD: weight_decay must be >= 0, got ", o.weight_decay);
  MIXPREC_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: nesterov needs momentum > 0 and dampening 0");
  momentum_.resize(params_.size());
}

void SGD::step() {
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const bool first = o_.momentum != 0 && !momentum_[i].defined();
    if (o_.momentum != 0 && first) momentum_[i] = zeros_like_state(p);
    by_param_type(p.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* pp = p.data<T>();
      const T* pg = g.data<T>();
      T* buf = o_.momentum != 0 ? momentum_[i].data<T>() : nullptr;
      const T lr = T(lr_), wd = T(o_.weight_decay), mom = T(o_.momentum), damp = T(1 - o_.dampening);
      const bool nesterov = o_.nesterov;
      const int64_t n = p.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 15))
      for (int64_t j = 0; j < n; ++j) {
        T d = pg[j] + wd * pp[j];
        if (buf) {
          buf[j] = first ? d : mom * buf[j] + damp * d;  // PyTorch: the first step copies d
          d = nesterov ? d + mom * buf[j] : buf[j];
        }
        pp[j] -= lr * d;
      }
    });
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  MIXPREC_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1), got (",
                o.beta1, ", ", o.beta2, ")");
  MIXPREC_CHECK(o.eps >= 0, "AdamW: eps must be >= 0, got ", o.eps);
  MIXPREC_CHECK(o.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", o.weight_decay);
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
}

void AdamW::step() {
  ++steps_;
  const double bc1 = 1 - std::pow(o_.beta1, double(steps_));
  const double bc2 = 1 - std::pow(o_.beta2, double(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = zeros_like_state(p);
      exp_avg_sq_[i] = zeros_like_state(p);
    }
    by_param_type(p.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* pp = p.data<T>();
      const T* pg = g.data<T>();
      T* m = exp_avg_[i].data<T>();
      T* v = exp_avg_sq_[i].data<T>();
      const T decay = T(1 - lr_ * o_.weight_decay), b1 = T(o_.beta1), b2 = T(o_.beta2);
      const T step_size = T(lr_ / bc1), inv_sqrt_bc2 = T(1 / std::sqrt(bc2)), eps = T(o_.eps);
      const int64_t n = p.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 15))
      for (int64_t j = 0; j < n; ++j) {
        const T gj = pg[j];
        m[j] = b1 * m[j] + (T(1) - b1) * gj;
        v[j] = b2 * v[j] + (T(1) - b2) * gj * gj;
        const T denom = std::sqrt(v[j]) * inv_sqrt_bc2 + eps;
        pp[j] = pp[j] * decay - step_size * m[j] / denom;
      }
    });
  }
}

}  // namespace mixprec::optim
