// gradcheck: compares autograd gradients with central finite differences, in f64.
// The checked scalar is L(x) = sum(f(x) * R) with R a fixed random f64 tensor shaped like
// f(x), so every output element matters; its gradient wrt f(x) is R, which is what
// f(x).backward(R) seeds (the helper does not lean on mul/sum being right).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/random.h"
#include "mixprec/tensor.h"

namespace mixprec::testing {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double rtol = 1e-6;  // |autograd - numeric| <= atol + rtol * |numeric|
  double atol = 1e-7;
  uint64_t seed = 0x5eed;  // for R
  int max_reports = 8;     // mismatches listed in the failure message
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace detail {

// sum(y * R) on the host, in f64.
inline double weighted_sum(const Tensor& y, const std::vector<double>& r) {
  const std::vector<double> v = y.to_vector_f64();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

// A fresh f64 leaf (no grad) holding `values` in `like`'s shape.
inline Tensor leaf_like(const Tensor& like, const std::vector<double>& values) {
  return Tensor::from_vector(values, like.shape(), like.dtype());
}

}  // namespace detail

// Checks every input with requires_grad() (f64 leaves); other inputs (targets, i64) are
// passed through untouched. `op` names the check in failure messages.
inline ::testing::AssertionResult gradcheck(std::string_view op, const GradFn& f, const std::vector<Tensor>& inputs,
                                            const GradcheckOptions& o = {}) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    if (inputs[i].dtype() != DType::f64 || !inputs[i].is_leaf())
      return ::testing::AssertionFailure()
             << op << ": input " << i << " must be an f64 leaf, got " << dtype_name(inputs[i].dtype());
    checked.push_back(i);
  }
  if (checked.empty()) return ::testing::AssertionFailure() << op << ": no input requires grad";

  // Analytic: fresh leaves with the same values, so earlier .grad never leaks in.
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) {
      Tensor l = detail::leaf_like(t, t.to_vector_f64());
      l.set_requires_grad();
      leaves.push_back(l);
    } else {
      leaves.push_back(t);
    }
  }
  Tensor y;
  try {
    y = f(leaves);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << op << ": forward threw: " << e.what();
  }
  if (!y.defined() || y.dtype() != DType::f64)
    return ::testing::AssertionFailure() << op << ": output must be a defined f64 tensor, got "
                                         << (y.defined() ? dtype_name(y.dtype()) : "undefined");
  if (!y.requires_grad()) return ::testing::AssertionFailure() << op << ": output does not require grad";
  Generator gen(o.seed);
  const Tensor r = Tensor::randn(y.shape(), gen, DType::f64);
  const std::vector<double> rv = r.to_vector_f64();
  try {
    y.backward(r);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << op << ": backward threw: " << e.what();
  }

  std::ostringstream msg;
  msg << std::setprecision(12);
  int bad = 0;
  int64_t total_bad = 0;
  for (size_t i : checked) {
    const Tensor g = leaves[i].grad();
    if (!g.defined()) return ::testing::AssertionFailure() << op << ": input " << i << " received no gradient";
    if (g.dtype() != DType::f64 || g.shape() != inputs[i].shape())
      return ::testing::AssertionFailure() << op << ": input " << i << " gradient is " << dtype_name(g.dtype()) << " "
                                           << shape_str(g.shape()) << ", expected f64 " << shape_str(inputs[i].shape());
    const std::vector<double> analytic = g.to_vector_f64();
    std::vector<double> x = inputs[i].to_vector_f64();
    for (size_t j = 0; j < x.size(); ++j) {
      auto eval = [&](double xj) {
        std::vector<double> xp = x;
        xp[j] = xj;
        std::vector<Tensor> in = inputs;
        for (size_t k = 0; k < in.size(); ++k)
          if (in[k].defined() && in[k].requires_grad()) in[k] = detail::leaf_like(inputs[k], inputs[k].to_vector_f64());
        in[i] = detail::leaf_like(inputs[i], xp);
        autograd::NoGradGuard no_grad;
        return detail::weighted_sum(f(in), rv);
      };
      const double numeric = (eval(x[j] + o.eps) - eval(x[j] - o.eps)) / (2 * o.eps);
      const double diff = std::fabs(analytic[j] - numeric);
      if (!(diff <= o.atol + o.rtol * std::fabs(numeric))) {
        ++total_bad;
        if (bad++ < o.max_reports)
          msg << "\n  " << op << ": input " << i << " " << shape_str(inputs[i].shape()) << " element " << j
              << ": autograd " << analytic[j] << " vs finite difference " << numeric << " (diff " << diff << ")";
      }
    }
  }
  if (total_bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << op << ": " << total_bad << " gradient element(s) differ" << msg.str();
}

}  // namespace mixprec::testing
