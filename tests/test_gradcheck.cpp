// Finite-difference gradient checks in f64 for every op in src/ops/ops.def. The case table
// below is the list: a test fails if an op in ops.def has no case here.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "gradcheck.h"
#include "mixprec/ops.h"
#include "op_cases.h"
#include "ops/op_table.h"

namespace mixprec {
namespace {

using testing::GradcheckOptions;
using testing::GradFn;
using In = std::vector<Tensor>;

struct Case {
  std::string op;       // the ops.def name this case covers
  std::string variant;  // test-name suffix
  GradFn f;
  std::function<In(Generator&)> inputs;
  GradcheckOptions opt{};
};

// gtest prints a failing case's parameter with this: "op/variant", not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.op << "/" << c.variant; }

// ---- input makers (f64 leaves that require grad unless said otherwise) ----
Tensor param(Tensor t) { return t.set_requires_grad(); }
Tensor U(Generator& g, const Shape& s, double lo = -1.5, double hi = 1.5) {
  return param(Tensor::uniform(s, g, lo, hi, DType::f64));
}
// |x| in [lo, hi], random sign: away from the kinks of relu and the poles of div.
Tensor away(Generator& g, const Shape& s, double lo = 0.3, double hi = 2.0) {
  std::vector<double> v(size_t(shape_numel(s)));
  for (double& x : v) x = (g.uniform() < 0.5 ? -1 : 1) * (lo + (hi - lo) * g.uniform());
  return param(Tensor::from_vector(v, s, DType::f64));
}
Tensor targets(Generator& g, int64_t n, int64_t classes) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t& v : t) v = int64_t(g.next_u64() % uint64_t(classes));
  return Tensor::from_vector(t, {n});
}

std::string reduction_name(ops::Reduction r) {
  return r == ops::Reduction::mean ? "mean" : r == ops::Reduction::sum ? "sum" : "none";
}

std::vector<Case> all_cases() {
  std::vector<Case> c;
  using ops::Reduction;
  // Inputs on a 1/64 grid and a 2^-10 step: x +- eps is exact in f32, so the difference is
  // exact despite the f32 round trip.
  GradcheckOptions cast_opt;
  cast_opt.eps = 1.0 / 1024;

  // ---- matmul family ----
  c.push_back({"matmul", "2d", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {4, 5})};
               }});
  c.push_back({"matmul", "3d_at_2d", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {4, 5})};
               }});
  c.push_back({"matmul", "transposed_operands", [](const In& x) { return ops::matmul(x[0].t(), x[1].t()); },
               [](Generator& g) {
                 return In{U(g, {4, 3}), U(g, {5, 4})};
               }});
  c.push_back({"matmul", "only_b_requires_grad", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{Tensor::uniform({3, 4}, g, -1, 1, DType::f64), U(g, {4, 2})};
               }});
  c.push_back({"matmul", "batched_3d", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {2, 4, 5})};
               }});
  c.push_back({"matmul", "batched_broadcast_a", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {2, 4, 5})};
               }});
  c.push_back({"matmul", "batched_4d_broadcast_both", [](const In& x) { return ops::matmul(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 1, 3, 4}), U(g, {3, 4, 2})};
               }});
  c.push_back({"matmul", "batched_transposed_operands",
               [](const In& x) { return ops::matmul(x[0].transpose(1, 2), x[1].transpose(1, 2)); },
               [](Generator& g) {
                 return In{U(g, {2, 4, 3}), U(g, {2, 5, 4})};
               }});
  c.push_back({"linear", "bias", [](const In& x) { return ops::linear(x[0], x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {5, 4}), U(g, {5})};
               }});
  c.push_back({"linear", "no_bias", [](const In& x) { return ops::linear(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {5, 4})};
               }});
  c.push_back({"linear", "3d_bias", [](const In& x) { return ops::linear(x[0], x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {5, 4}), U(g, {5})};
               }});
  c.push_back({"linear", "3d_no_bias", [](const In& x) { return ops::linear(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {5, 4})};
               }});
  c.push_back({"linear", "transposed_weight", [](const In& x) { return ops::linear(x[0], x[1].t(), x[2]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {4, 5}), U(g, {5})};
               }});
  c.push_back({"linear", "fused_relu", [](const In& x) { return ops::linear_relu(x[0], x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}), U(g, {5, 4}), U(g, {5})};
               }});
  c.push_back({"linear", "fused_relu_3d_no_bias", [](const In& x) { return ops::linear_relu(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {5, 4})};
               }});
  c.push_back({"linear", "mlp_composite",
               [](const In& x) {
                 Tensor h = ops::gelu(ops::linear(x[0], x[1], x[2]));
                 return ops::cross_entropy(ops::linear(h, x[3]), x[4]);
               },
               [](Generator& g) {
                 return In{U(g, {4, 3}), U(g, {6, 3}), U(g, {6}), U(g, {5, 6}), targets(g, 4, 5)};
               }});

  // ---- softmax family ----
  for (bool log : {false, true}) {
    const std::string op = log ? "log_softmax" : "softmax";
    auto sm = [log](const Tensor& x, int64_t d) { return log ? ops::log_softmax(x, d) : ops::softmax(x, d); };
    c.push_back({op, "dim_last", [sm](const In& x) { return sm(x[0], -1); },
                 [](Generator& g) {
                   return In{U(g, {3, 5}, -2, 2)};
                 }});
    c.push_back({op, "dim0", [sm](const In& x) { return sm(x[0], 0); },
                 [](Generator& g) {
                   return In{U(g, {3, 5}, -2, 2)};
                 }});
    c.push_back({op, "3d_dim1", [sm](const In& x) { return sm(x[0], 1); },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4}, -2, 2)};
                 }});
    c.push_back(
        {op, "1d", [sm](const In& x) { return sm(x[0], 0); }, [](Generator& g) { return In{U(g, {6}, -2, 2)}; }});
  }

  // ---- losses ----
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    c.push_back({"cross_entropy", reduction_name(r), [r](const In& x) { return ops::cross_entropy(x[0], x[1], r); },
                 [](Generator& g) {
                   return In{U(g, {4, 5}, -2, 2), targets(g, 4, 5)};
                 }});
    c.push_back({"nll_loss", reduction_name(r), [r](const In& x) { return ops::nll_loss(x[0], x[1], r); },
                 [](Generator& g) {
                   return In{U(g, {4, 5}, -3, 0), targets(g, 4, 5)};
                 }});
    c.push_back({"mse_loss", reduction_name(r), [r](const In& x) { return ops::mse_loss(x[0], x[1], r); },
                 [](Generator& g) {
                   return In{U(g, {3, 4}), U(g, {3, 4})};
                 }});
  }
  // [B, T, C] with the class dim last and some targets ignored (-100, and a class index as
  // ignore_index): mean divides by the targets left.
  auto some_ignored = [](Generator& g, const Shape& s, int64_t classes, int64_t ignore) {
    std::vector<int64_t> t(size_t(shape_numel(s)));
    for (size_t i = 0; i < t.size(); ++i) t[i] = i % 3 == 1 ? ignore : int64_t(g.next_u64() % uint64_t(classes));
    return Tensor::from_vector(t, s);
  };
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    c.push_back({"cross_entropy", std::string("btc_ignore_") + reduction_name(r),
                 [r](const In& x) { return ops::cross_entropy(x[0], x[1], r); },
                 [some_ignored](Generator& g) {
                   return In{U(g, {2, 3, 5}, -2, 2), some_ignored(g, {2, 3}, 5, -100)};
                 }});
  }
  c.push_back({"nll_loss", "btc_ignore_class_2",
               [](const In& x) { return ops::nll_loss(x[0], x[1], Reduction::mean, 2); },
               [some_ignored](Generator& g) {
                 return In{U(g, {3, 2, 4}, -3, 0), some_ignored(g, {3, 2}, 4, 2)};
               }});
  c.push_back({"nll_loss", "of_log_softmax", [](const In& x) { return ops::nll_loss(ops::log_softmax(x[0], 1), x[1]); },
               [](Generator& g) {
                 return In{U(g, {4, 5}, -2, 2), targets(g, 4, 5)};
               }});

  // ---- unary math ----
  c.push_back({"exp", "basic", [](const In& x) { return ops::exp(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -2, 2)};
               }});
  c.push_back({"log", "positive", [](const In& x) { return ops::log(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, 0.2, 3)};
               }});
  c.push_back({"pow", "exp_2_5", [](const In& x) { return ops::pow(x[0], 2.5); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, 0.2, 2)};
               }});
  c.push_back({"pow", "exp_neg_1_5", [](const In& x) { return ops::pow(x[0], -1.5); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, 0.3, 2)};
               }});
  c.push_back({"pow", "exp_3_mixed_sign", [](const In& x) { return ops::pow(x[0], 3.0); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -2, 2)};
               }});
  c.push_back({"sqrt", "positive", [](const In& x) { return ops::sqrt(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, 0.2, 3)};
               }});
  c.push_back({"neg", "basic", [](const In& x) { return ops::neg(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"affine", "scale_shift", [](const In& x) { return ops::affine(x[0], 1.7, -0.3); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"affine", "negative_scale", [](const In& x) { return ops::affine(x[0], -0.5); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 2})};
               }});

  // ---- activations ----
  c.push_back({"relu", "away_from_zero", [](const In& x) { return ops::relu(x[0]); },
               [](Generator& g) {
                 return In{away(g, {3, 4}, 0.1, 2)};
               }});
  c.push_back({"relu", "times_input",
               [](const In& x) { return ops::mul(ops::relu(x[0]), x[0]); },  // x*relu(x): both paths meet
               [](Generator& g) {
                 return In{away(g, {2, 3, 2}, 0.1, 2)};
               }});
  c.push_back({"gelu", "exact", [](const In& x) { return ops::gelu(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -3, 3)};
               }});
  c.push_back({"gelu", "tanh", [](const In& x) { return ops::gelu(x[0], /*tanh_approx=*/true); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -3, 3)};
               }});
  c.push_back({"silu", "basic", [](const In& x) { return ops::silu(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -4, 4)};
               }});
  c.push_back({"sigmoid", "basic", [](const In& x) { return ops::sigmoid(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -4, 4)};
               }});
  c.push_back({"tanh", "basic", [](const In& x) { return ops::tanh(x[0]); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -3, 3)};
               }});
  // Saved output (sigmoid, tanh) reused by a second consumer of the output.
  c.push_back({"sigmoid", "times_output",
               [](const In& x) {
                 Tensor y = ops::sigmoid(x[0]);
                 return ops::mul(y, ops::tanh(y));
               },
               [](Generator& g) {
                 return In{U(g, {2, 3, 2}, -3, 3)};
               }});
  // The generator is re-seeded on every evaluation, so the mask is the same each time.
  c.push_back({"dropout", "p0_3_fixed_mask",
               [](const In& x) {
                 Generator g(42);
                 return ops::dropout(x[0], 0.3, /*training=*/true, &g);
               },
               [](Generator& g) {
                 return In{U(g, {4, 5})};
               }});
  c.push_back({"dropout", "eval_is_identity", [](const In& x) { return ops::dropout(x[0], 0.5, /*training=*/false); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});

  // ---- reductions ----
  for (bool is_mean : {false, true}) {
    const std::string op = is_mean ? "mean" : "sum";
    auto all = [is_mean](const Tensor& x) { return is_mean ? ops::mean(x) : ops::sum(x); };
    auto over = [is_mean](const Tensor& x, std::vector<int64_t> d, bool k) {
      return is_mean ? ops::mean(x, std::move(d), k) : ops::sum(x, std::move(d), k);
    };
    c.push_back({op, "all", [all](const In& x) { return all(x[0]); }, [](Generator& g) { return In{U(g, {3, 4})}; }});
    c.push_back({op, "all_3d", [all](const In& x) { return all(x[0]); },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4})};
                 }});
    c.push_back({op, "dim0", [over](const In& x) { return over(x[0], {0}, false); },
                 [](Generator& g) {
                   return In{U(g, {3, 4})};
                 }});
    c.push_back({op, "dim1_keepdim", [over](const In& x) { return over(x[0], {1}, true); },
                 [](Generator& g) {
                   return In{U(g, {3, 4})};
                 }});
    c.push_back({op, "dims_0_2",
                 [over](const In& x) {
                   return over(x[0], {0, 2}, false);
                 },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4})};
                 }});
    c.push_back({op, "dims_2_0_keepdim",
                 [over](const In& x) {
                   return over(x[0], {2, 0}, true);
                 },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4})};
                 }});
    c.push_back({op, "neg_dim", [over](const In& x) { return over(x[0], {-1}, false); },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4})};
                 }});
    c.push_back({op, "middle_dim_keepdim", [over](const In& x) { return over(x[0], {1}, true); },
                 [](Generator& g) {
                   return In{U(g, {2, 3, 4})};
                 }});
  }

  // ---- binary with broadcasting, both directions ----
  struct Pair {
    const char* name;
    Shape a, b;
  };
  const std::vector<Pair> pairs = {
      {"same", {3, 4}, {3, 4}},           {"row", {3, 4}, {4}},          {"row_left", {4}, {3, 4}},
      {"scalar_right", {3, 4}, {}},       {"scalar_left", {}, {3, 4}},   {"col_x_row", {3, 1}, {1, 4}},
      {"row_x_col", {1, 4}, {3, 1}},      {"col_3d", {2, 3, 4}, {3, 1}}, {"lead_one", {1, 4}, {3, 4}},
      {"col_left_3d", {3, 1}, {2, 3, 4}},
  };
  const std::vector<std::pair<std::string, Tensor (*)(const Tensor&, const Tensor&)>> bins = {
      {"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul}, {"div", ops::div}};
  for (const auto& [name, fn] : bins) {
    auto f = fn;
    for (const Pair& p : pairs)
      c.push_back({name, p.name, [f](const In& x) { return f(x[0], x[1]); },
                   [p](Generator& g) {
                     return In{away(g, p.a), away(g, p.b)};
                   }});
    c.push_back({name, "only_a_requires_grad", [f](const In& x) { return f(x[0], x[1]); },
                 [](Generator& g) {
                   return In{away(g, {3, 4}), away(g, {4}).detach()};
                 }});
    c.push_back({name, "only_b_requires_grad", [f](const In& x) { return f(x[0], x[1]); },
                 [](Generator& g) {
                   return In{away(g, {3, 1}).detach(), away(g, {1, 4})};
                 }});
    c.push_back({name, "same_tensor_twice", [f](const In& x) { return f(x[0], x[0]); },
                 [](Generator& g) {
                   return In{away(g, {3, 4})};
                 }});
  }

  // s gets one gradient from add (passed through unchanged, shared with x's) and one from mul:
  // summing them must not write into the buffer x's gradient still uses.
  c.push_back({"add", "diamond_accumulation",
               [](const In& x) {
                 Tensor s = ops::add(x[0], x[0]);
                 return ops::mul(ops::add(s, x[0]), s);
               },
               [](Generator& g) {
                 return In{away(g, {3, 4})};
               }});

  // A transpose after the op hands its backward a non-contiguous gradient.
  auto tr = [](const Tensor& t) { return ops::transpose(t, 0, t.dim() - 1); };
  c.push_back({"softmax", "strided_grad", [tr](const In& x) { return tr(ops::softmax(x[0], -1)); },
               [](Generator& g) {
                 return In{U(g, {3, 5}, -2, 2)};
               }});
  c.push_back({"log_softmax", "strided_grad", [tr](const In& x) { return tr(ops::log_softmax(x[0], 0)); },
               [](Generator& g) {
                 return In{U(g, {3, 5}, -2, 2)};
               }});
  c.push_back({"relu", "strided_grad", [tr](const In& x) { return tr(ops::relu(x[0])); },
               [](Generator& g) {
                 return In{away(g, {3, 4}, 0.1, 2)};
               }});
  c.push_back({"gelu", "strided_grad", [tr](const In& x) { return tr(ops::gelu(x[0])); },
               [](Generator& g) {
                 return In{U(g, {3, 4}, -3, 3)};
               }});
  c.push_back({"exp", "strided_grad", [tr](const In& x) { return tr(ops::exp(x[0])); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"add", "strided_grad_broadcast", [tr](const In& x) { return tr(ops::add(x[0], x[1])); },
               [](Generator& g) {
                 return In{away(g, {3, 4}), away(g, {4})};
               }});
  c.push_back({"div", "strided_grad_broadcast", [tr](const In& x) { return tr(ops::div(x[0], x[1])); },
               [](Generator& g) {
                 return In{away(g, {3, 1}), away(g, {3, 4})};
               }});
  c.push_back({"linear", "strided_grad_3d", [tr](const In& x) { return tr(ops::linear(x[0], x[1], x[2])); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {5, 4}), U(g, {5})};
               }});
  c.push_back({"mean", "strided_grad", [tr](const In& x) { return tr(ops::mean(x[0], {1}, true)); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4})};
               }});
  c.push_back({"cast", "strided_grad",
               [tr](const In& x) { return tr(ops::cast(ops::cast(x[0], DType::f32), DType::f64)); },
               [](Generator& g) {
                 std::vector<double> v(12);
                 for (double& e : v) e = double(int64_t(g.next_u64() % 256) - 128) / 64;
                 return In{param(Tensor::from_vector(v, {3, 4}, DType::f64))};
               },
               cast_opt});

  // ---- shape ops ----
  c.push_back({"expand", "new_leading_and_size1",
               [](const In& x) {
                 return ops::expand(x[0], {2, 3, 4});
               },
               [](Generator& g) {
                 return In{U(g, {3, 1})};
               }});
  c.push_back({"expand", "keep_with_minus1",
               [](const In& x) {
                 return ops::expand(x[0], {3, -1, 2});
               },
               [](Generator& g) {
                 return In{U(g, {1, 4, 1})};
               }});
  c.push_back({"reshape", "2d_to_2d",
               [](const In& x) {
                 return ops::reshape(x[0], {2, 6});
               },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"reshape", "infer",
               [](const In& x) {
                 return ops::reshape(x[0], {-1, 3});
               },
               [](Generator& g) {
                 return In{U(g, {2, 3, 2})};
               }});
  c.push_back({"reshape", "of_transpose", [](const In& x) { return ops::reshape(x[0].t(), {12}); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"reshape", "flatten_1", [](const In& x) { return ops::flatten(x[0]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4})};
               }});
  c.push_back({"reshape", "flatten_0", [](const In& x) { return ops::flatten(x[0], 0); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 2})};
               }});
  c.push_back({"transpose", "2d", [](const In& x) { return ops::transpose(x[0], 0, 1); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"transpose", "3d_0_2_then_mul", [](const In& x) { return ops::mul(ops::transpose(x[0], 0, 2), x[1]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {4, 3, 2})};
               }});
  c.push_back({"slice", "dim0", [](const In& x) { return ops::slice(x[0], 0, 1, 3); },
               [](Generator& g) {
                 return In{U(g, {4, 3})};
               }});
  c.push_back({"slice", "dim1_strided", [](const In& x) { return ops::slice(x[0], 1, 2, 5); },
               [](Generator& g) {
                 return In{U(g, {3, 5})};
               }});
  c.push_back({"slice", "slice_of_slice_neg_dim",
               [](const In& x) { return ops::slice(ops::slice(x[0], -1, 1, 4), 0, 1, 2); },
               [](Generator& g) {
                 return In{U(g, {3, 5})};
               }});
  c.push_back({"slice", "two_slices_summed",
               [](const In& x) { return ops::add(ops::slice(x[0], 0, 0, 2), ops::slice(x[0], 0, 1, 3)); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"contiguous", "of_transpose", [](const In& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"contiguous", "of_slice_then_exp",
               [](const In& x) { return ops::exp(ops::contiguous(ops::slice(x[0], 1, 1, 3))); },
               [](Generator& g) {
                 return In{U(g, {3, 4})};
               }});
  c.push_back({"cast", "f64_f32_f64", [](const In& x) { return ops::cast(ops::cast(x[0], DType::f32), DType::f64); },
               [](Generator& g) {
                 std::vector<double> v(12);
                 for (double& e : v) e = double(int64_t(g.next_u64() % 256) - 128) / 64;
                 return In{param(Tensor::from_vector(v, {3, 4}, DType::f64))};
               },
               cast_opt});
  c.push_back({"cast", "tensor_to_chain",
               [](const In& x) { return ops::mul(x[0].to(DType::f32).to(DType::f64), x[1]); },
               [](Generator& g) {
                 std::vector<double> v(6);
                 for (double& e : v) e = double(int64_t(g.next_u64() % 256) - 128) / 64;
                 return In{param(Tensor::from_vector(v, {2, 3}, DType::f64)), U(g, {2, 3}).detach()};
               },
               cast_opt});

  // ---- convolution, pooling, normalisation, concatenation (deeper cases: test_conv/pool/norm) ----
  c.push_back({"conv2d", "bias", [](const In& x) { return ops::conv2d(x[0], x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 5, 5}), U(g, {4, 3, 3, 3}), U(g, {4})};
               }});
  c.push_back({"conv2d", "stride2_pad1_no_bias",
               [](const In& x) { return ops::conv2d(x[0], x[1], Tensor(), {.stride = 2, .padding = 1}); },
               [](Generator& g) {
                 return In{U(g, {1, 2, 6, 5}), U(g, {3, 2, 3, 2})};
               }});
  c.push_back({"conv2d", "groups_dilation",
               [](const In& x) {
                 return ops::conv2d(x[0], x[1], x[2], {.padding = {2, 1}, .dilation = 2, .groups = 2});
               },
               [](Generator& g) {
                 return In{U(g, {1, 4, 5, 5}), U(g, {6, 2, 3, 2}), U(g, {6})};
               }});
  c.push_back({"max_pool2d", "k2", [](const In& x) { return ops::max_pool2d(x[0], 2); },
               [](Generator& g) {
                 return In{U(g, {2, 2, 4, 6})};
               }});
  c.push_back({"conv2d_max_pool2d", "pad1_bias_k2",
               [](const In& x) { return ops::conv2d_max_pool2d(x[0], x[1], x[2], {.padding = 1}, 2); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 5, 4}), U(g, {4, 3, 3, 3}), U(g, {4})};
               }});
  c.push_back({"conv2d_max_pool2d", "fused_relu_k2",
               [](const In& x) { return ops::conv2d_max_pool2d(x[0], x[1], x[2], {.padding = 1, .relu = true}, 2); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 5, 4}), U(g, {4, 3, 3, 3}), U(g, {4})};
               }});
  // Channels-last inputs (NHWC bytes) through the ops that keep the layout.
  const auto cl = [](const Tensor& t) { return ops::contiguous(t, ops::MemoryFormat::channels_last); };
  c.push_back({"contiguous", "channels_last", [cl](const In& x) { return ops::exp(cl(x[0])); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 2, 3})};
               }});
  c.push_back({"conv2d", "channels_last_bias",
               [](const In& x) { return ops::conv2d(x[0], x[1], x[2], {.padding = 1, .channels_last = true}); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4, 4}), U(g, {4, 3, 3, 3}), U(g, {4})};
               }});
  c.push_back({"max_pool2d", "channels_last_k2_after_relu",
               [cl](const In& x) { return ops::max_pool2d(ops::relu(cl(x[0])), 2); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4, 6})};
               }});
  c.push_back({"max_pool2d", "k3_s2_p1_ceil_3d",
               [](const In& x) { return ops::max_pool2d(x[0], 3, {.stride = 2, .padding = 1, .ceil_mode = true}); },
               [](Generator& g) {
                 return In{U(g, {2, 6, 5})};
               }});
  c.push_back({"avg_pool2d", "k2", [](const In& x) { return ops::avg_pool2d(x[0], 2); },
               [](Generator& g) {
                 return In{U(g, {2, 2, 4, 6})};
               }});
  c.push_back({"avg_pool2d", "k3_s2_p1_exclude_pad",
               [](const In& x) {
                 return ops::avg_pool2d(x[0], {3, 2}, {.stride = 2, .padding = 1, .count_include_pad = false});
               },
               [](Generator& g) {
                 return In{U(g, {1, 2, 5, 6})};
               }});
  c.push_back({"adaptive_avg_pool2d", "7x5_to_3x2",
               [](const In& x) {
                 return ops::adaptive_avg_pool2d(x[0], {3, 2});
               },
               [](Generator& g) {
                 return In{U(g, {2, 2, 7, 5})};
               }});
  c.push_back({"adaptive_avg_pool2d", "global", [](const In& x) { return ops::adaptive_avg_pool2d(x[0], 1); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 3, 4})};
               }});
  c.push_back({"batch_norm", "train_affine_4d",
               [](const In& x) { return ops::batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], /*training=*/true); },
               [](Generator& g) {
                 return In{U(g, {3, 2, 2, 3}), U(g, {2}), U(g, {2})};
               }});
  c.push_back({"batch_norm", "train_2d_no_affine",
               [](const In& x) { return ops::batch_norm(x[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
               [](Generator& g) {
                 return In{U(g, {5, 3})};
               }});
  c.push_back({"batch_norm", "eval_running_stats",
               [](const In& x) { return ops::batch_norm(x[0], x[3], x[4], x[1], x[2], /*training=*/false); },
               [](Generator& g) {
                 return In{U(g, {3, 2, 2, 2}), U(g, {2}), U(g, {2}), Tensor::uniform({2}, g, -0.5, 0.5, DType::f64),
                           Tensor::uniform({2}, g, 0.5, 2.0, DType::f64)};
               }});
  c.push_back({"layer_norm", "last_dim_affine", [](const In& x) { return ops::layer_norm(x[0], {4}, x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4}), U(g, {4}), U(g, {4})};
               }});
  c.push_back({"layer_norm", "two_dims_no_affine",
               [](const In& x) {
                 return ops::layer_norm(x[0], {3, 4});
               },
               [](Generator& g) {
                 return In{U(g, {2, 3, 4})};
               }});
  c.push_back({"cat", "dim0_three",
               [](const In& x) {
                 return ops::cat({x[0], x[1], x[2]}, 0);
               },
               [](Generator& g) {
                 return In{U(g, {2, 3}), U(g, {1, 3}), U(g, {3, 3})};
               }});
  c.push_back({"cat", "neg_dim_one_constant",
               [](const In& x) {
                 return ops::cat({x[0], x[1]}, -1);
               },
               [](Generator& g) {
                 return In{U(g, {2, 2, 3}), U(g, {2, 2, 2}).detach()};
               }});
  // ---- embedding: repeated indices, so the scatter-add sums several rows into one ----
  c.push_back({"embedding", "repeated_1d", [](const In& x) { return ops::embedding(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {5, 3}), Tensor::from_vector(std::vector<int64_t>{1, 3, 1, 4, 1, 0}, {6})};
               }});
  c.push_back({"embedding", "indices_2d", [](const In& x) { return ops::embedding(x[0], x[1]); },
               [](Generator& g) {
                 return In{U(g, {6, 4}), Tensor::from_vector(std::vector<int64_t>{5, 0, 5, 2, 2, 5}, {2, 3})};
               }});
  // The GPT's shape of use: token rows, then a non-linear function of them.
  c.push_back({"embedding", "then_gelu_sum",
               [](const In& x) { return ops::sum(ops::gelu(ops::embedding(x[0], x[1]))); },
               [](Generator& g) {
                 return In{U(g, {4, 3}), Tensor::from_vector(std::vector<int64_t>{3, 3, 0, 3}, {2, 2})};
               }});

  // ---- attention: q [B, H, Tq, E], k [B, H, Tk, E], v [B, H, Tk, Ev] ----
  c.push_back({"scaled_dot_product_attention", "plain_tq_ne_tk",
               [](const In& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2]); },
               [](Generator& g) {
                 return In{U(g, {2, 2, 3, 4}), U(g, {2, 2, 5, 4}), U(g, {2, 2, 5, 3})};
               }});
  c.push_back(
      {"scaled_dot_product_attention", "causal_more_keys_scale",
       [](const In& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true, .scale = 0.7}); },
       [](Generator& g) {
         return In{U(g, {1, 2, 4, 3}), U(g, {1, 2, 6, 3}), U(g, {1, 2, 6, 2})};
       }});
  c.push_back({"scaled_dot_product_attention", "causal_more_queries",
               [](const In& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true}); },
               [](Generator& g) {
                 return In{U(g, {1, 2, 5, 3}), U(g, {1, 2, 3, 3}), U(g, {1, 2, 3, 4})};
               }});
  // The GPT's layout: q, k, v are strided views of one [B, T, 3, H, E] tensor.
  c.push_back({"scaled_dot_product_attention", "causal_views_of_qkv",
               [](const In& x) {
                 const Tensor t = ops::transpose(x[0], 1, 3);  // [B, H, 3, T, E]
                 auto part = [&](int64_t i) { return ops::reshape(ops::slice(t, 2, i, i + 1), {2, 2, 4, 3}); };
                 return ops::scaled_dot_product_attention(part(0), part(1), part(2), {.causal = true});
               },
               [](Generator& g) {
                 return In{U(g, {2, 4, 3, 2, 3})};
               }});
  // The packed form: q, k, v the thirds of one [B, T, 3 C] input, C = 2 heads of 3.
  c.push_back({"scaled_dot_product_attention", "packed_qkv_causal",
               [](const In& x) { return ops::packed_qkv_attention(x[0], 2, {.causal = true}); },
               [](Generator& g) {
                 return In{U(g, {2, 4, 3 * 2 * 3})};
               }});
  // A fresh generator per evaluation: the same mask every time.
  c.push_back({"scaled_dot_product_attention", "causal_dropout_fixed_generator",
               [](const In& x) {
                 Generator gen(7);
                 return ops::scaled_dot_product_attention(x[0], x[1], x[2],
                                                          {.causal = true, .dropout = 0.3, .gen = &gen});
               },
               [](Generator& g) {
                 return In{U(g, {2, 1, 5, 3}), U(g, {2, 1, 5, 3}), U(g, {2, 1, 5, 2})};
               }});
  return c;
}

class Gradcheck : public ::testing::TestWithParam<Case> {};

TEST_P(Gradcheck, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  Generator g(std::hash<std::string>{}(c.op + "/" + c.variant) & 0xffff);
  EXPECT_TRUE(testing::gradcheck(c.op + "/" + c.variant, c.f, c.inputs(g), c.opt));
}

INSTANTIATE_TEST_SUITE_P(Ops, Gradcheck, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return param_info.param.op + "_" + param_info.param.variant;
                         });

// The helper itself must catch a wrong backward rule, and say where.
TEST(GradcheckHelper, CatchesAWrongBackward) {
  auto wrong_square = [](const In& x) {
    Tensor out = ops::mul(x[0].detach(), x[0].detach());
    Tensor saved = x[0].detach();
    return autograd::record(out, "wrong_square", {x[0]}, [saved](const Tensor& g, const autograd::Node&) {
      return std::vector<Tensor>{ops::mul(g, saved)};  // should be 2 * g * x
    });
  };
  Generator g(1);
  Tensor x = param(Tensor::uniform({2, 3}, g, 0.5, 1.5, DType::f64));
  const ::testing::AssertionResult r = testing::gradcheck("wrong_square", wrong_square, {x});
  ASSERT_FALSE(r);
  const std::string msg = r.message();
  EXPECT_NE(msg.find("wrong_square: input 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("element 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("6 gradient element(s) differ"), std::string::npos) << msg;
  // The same function with the right rule passes.
  auto square = [](const In& in) { return ops::mul(in[0], in[0]); };
  EXPECT_TRUE(testing::gradcheck("square", square, {x}));
}

TEST(GradcheckHelper, RejectsNonF64Inputs) {
  Generator g(2);
  Tensor x = param(Tensor::uniform({3}, g, 0, 1, DType::f32));
  EXPECT_FALSE(testing::gradcheck("exp_f32", [](const In& in) { return ops::exp(in[0]); }, {x}));
}

// Dropout's gradient is exactly mask / (1 - p): zero where dropped, 1/(1-p) elsewhere.
TEST(Dropout, GradientIsMaskOverKeepProbability) {
  const double p = 0.25;
  const int64_t n = 2000;
  Generator init(3);
  Tensor x = param(Tensor::uniform({n}, init, 0.5, 1.5, DType::f64));
  Generator g(9);
  Tensor y = ops::dropout(x, p, true, &g);
  Tensor r = Tensor::randn({n}, init, DType::f64);
  y.backward(r);
  const auto xv = x.to_vector_f64(), yv = y.to_vector_f64(), rv = r.to_vector_f64(), gv = x.grad().to_vector_f64();
  int64_t dropped = 0, bad = 0, first_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = size_t(i);
    bool ok;
    if (yv[k] == 0) {
      ++dropped;
      ok = gv[k] == 0.0;
    } else {
      ok = std::fabs(yv[k] - xv[k] / (1 - p)) <= 1e-15 * std::fabs(yv[k]) &&
           std::fabs(gv[k] - rv[k] / (1 - p)) <= 1e-15 * std::fabs(gv[k]);
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  EXPECT_EQ(bad, 0) << "first at element " << first_bad << ": x " << xv[size_t(std::max<int64_t>(first_bad, 0))]
                    << " y " << yv[size_t(std::max<int64_t>(first_bad, 0))] << " grad "
                    << gv[size_t(std::max<int64_t>(first_bad, 0))] << " R "
                    << rv[size_t(std::max<int64_t>(first_bad, 0))];
  EXPECT_NEAR(double(dropped) / double(n), p, 0.05);
  // Same seed, same mask.
  Generator g2(9);
  EXPECT_EQ(ops::dropout(x.detach(), p, true, &g2).to_vector_f64(), yv);
}

}  // namespace

std::set<std::string> testing::gradcheck_ops() {
  std::set<std::string> ops;
  for (const Case& c : all_cases()) ops.insert(c.op);
  return ops;
}

}  // namespace mixprec
