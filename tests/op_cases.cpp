// The op-case table shared by the fast-vs-reference and autocast drivers (see op_cases.h).
#include "op_cases.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "mixprec/ops.h"
#include "ulp.h"

namespace mixprec::testing {
namespace {

using K = InputSpec::Kind;
InputSpec any(Shape s) { return {std::move(s)}; }
InputSpec pos(Shape s) { return {std::move(s), K::positive}; }
InputSpec targets(int64_t n, int64_t classes) { return {{n}, K::targets, classes}; }
InputSpec constant(Shape s) { return {std::move(s), K::constant}; }
// i64 indices of any shape in [0, classes) (embedding's rows, nll_loss's classes over [B, T]).
InputSpec indices(Shape s, int64_t classes, int64_t ignore_every = 0) {
  return {std::move(s), K::targets, classes, ignore_every};
}

std::vector<OpCase> build() {
  std::vector<OpCase> c;
  using ops::Reduction;
  // A table: a case per line or two reads better than a field per line.
  // clang-format off
  // ---- matmul family ----
  c.push_back({"matmul", "2d", {any({6, 16}), any({16, 5})}, [](const In& x) { return ops::matmul(x[0], x[1]); }, 16});
  c.push_back({"matmul", "batched_broadcast_b", {any({2, 6, 8}), any({3, 1, 8, 5})},
               [](const In& x) { return ops::matmul(x[0], x[1]); }, 12});
  c.push_back({"linear", "bias", {any({6, 16}), any({5, 16}), any({5})},
               [](const In& x) { return ops::linear(x[0], x[1], x[2]); }, 16});
  c.push_back({"linear", "fused_relu_3d", {any({2, 3, 16}), any({5, 16}), any({5})},
               [](const In& x) { return ops::linear_relu(x[0], x[1], x[2]); }, 16});
  // ---- softmax family ----
  c.push_back({"softmax", "dim_last", {any({4, 9})}, [](const In& x) { return ops::softmax(x[0], -1); }, 9, 1});
  c.push_back({"log_softmax", "dim0", {any({5, 3})}, [](const In& x) { return ops::log_softmax(x[0], 0); }, 5, 1});
  // ---- loss family ----
  c.push_back({"cross_entropy", "mean", {any({6, 7}), targets(6, 7)},
               [](const In& x) { return ops::cross_entropy(x[0], x[1]); }, 7, 1});
  c.push_back({"nll_loss", "sum", {any({6, 7}), targets(6, 7)},
               [](const In& x) { return ops::nll_loss(x[0], x[1], Reduction::sum); }, 6});
  c.push_back({"nll_loss", "none", {any({6, 7}), targets(6, 7)},
               [](const In& x) { return ops::nll_loss(x[0], x[1], Reduction::none); }});
  c.push_back({"cross_entropy", "btc_ignore_mean", {any({2, 5, 7}), indices({2, 5}, 7, 3)},
               [](const In& x) { return ops::cross_entropy(x[0], x[1]); }, 7, 1});
  c.push_back({"nll_loss", "btc_ignore_none", {any({2, 5, 7}), indices({2, 5}, 7, 3)},
               [](const In& x) { return ops::nll_loss(x[0], x[1], Reduction::none); }});
  c.push_back({"mse_loss", "mean", {any({4, 5}), any({4, 5})},
               [](const In& x) { return ops::mse_loss(x[0], x[1]); }, 20, 2});
  // ---- unary family ----
  c.push_back({"exp", "basic", {any({4, 5})}, [](const In& x) { return ops::exp(x[0]); }});
  c.push_back({"log", "positive", {pos({4, 5})}, [](const In& x) { return ops::log(x[0]); }});
  c.push_back({"pow", "exp_2_5", {pos({4, 5})}, [](const In& x) { return ops::pow(x[0], 2.5); }});
  c.push_back({"sqrt", "positive", {pos({4, 5})}, [](const In& x) { return ops::sqrt(x[0]); }});
  c.push_back({"neg", "basic", {any({4, 5})}, [](const In& x) { return ops::neg(x[0]); }});
  c.push_back({"affine", "scale_shift", {any({4, 5})}, [](const In& x) { return ops::affine(x[0], 1.5, -0.25); }});
  // ---- reduce family ----
  c.push_back({"sum", "all", {any({4, 5})}, [](const In& x) { return ops::sum(x[0]); }, 20});
  c.push_back({"sum", "dim1_keepdim", {any({3, 4, 5})}, [](const In& x) { return ops::sum(x[0], {1}, true); }, 4});
  c.push_back({"mean", "dims_0_2", {any({3, 4, 5})}, [](const In& x) { return ops::mean(x[0], {0, 2}); }, 15});
  // ---- binary family (the broadcast operand's gradient sums over the repeated rows) ----
  c.push_back({"add", "row", {any({4, 5}), any({5})}, [](const In& x) { return ops::add(x[0], x[1]); }, 4});
  c.push_back({"sub", "col", {any({4, 1}), any({4, 5})}, [](const In& x) { return ops::sub(x[0], x[1]); }, 5});
  c.push_back({"mul", "same", {any({4, 5}), any({4, 5})}, [](const In& x) { return ops::mul(x[0], x[1]); }});
  c.push_back({"div", "row", {any({4, 5}), any({5})}, [](const In& x) { return ops::div(x[0], x[1]); }, 4, 2});
  // ---- activation family ----
  c.push_back({"relu", "basic", {any({4, 5})}, [](const In& x) { return ops::relu(x[0]); }});
  c.push_back({"gelu", "exact", {any({4, 5})}, [](const In& x) { return ops::gelu(x[0]); }});
  c.push_back({"gelu", "tanh", {any({4, 5})}, [](const In& x) { return ops::gelu(x[0], true); }});
  c.push_back({"silu", "basic", {any({4, 33})}, [](const In& x) { return ops::silu(x[0]); }, 1, 1});
  c.push_back({"sigmoid", "basic", {any({4, 33})}, [](const In& x) { return ops::sigmoid(x[0]); }, 1, 1});
  c.push_back({"tanh", "basic", {any({4, 33})}, [](const In& x) { return ops::tanh(x[0]); }, 1, 1});
  // A fresh generator per call: the same mask on every backend.
  c.push_back({"dropout", "p0_3", {any({4, 5})}, [](const In& x) {
                 Generator g(42);
                 return ops::dropout(x[0], 0.3, true, &g);
               }});
  // ---- shape family ----
  c.push_back({"reshape", "2d", {any({3, 4})}, [](const In& x) { return ops::reshape(x[0], {2, 6}); }});
  c.push_back({"transpose", "2d", {any({3, 4})}, [](const In& x) { return ops::transpose(x[0], 0, 1); }});
  c.push_back({"slice", "dim1", {any({3, 5})}, [](const In& x) { return ops::slice(x[0], 1, 1, 4); }});
  c.push_back({"expand", "repeat", {any({3, 1})}, [](const In& x) { return ops::expand(x[0], {2, 3, 4}); }, 8});
  c.push_back({"contiguous", "of_transpose", {any({3, 4})},
               [](const In& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); }});
  // There and back: the result keeps the input's dtype (cast is `keep`), both casts record.
  c.push_back({"cast", "via_f64", {any({3, 4})},
               [](const In& x) { return ops::cast(ops::cast(x[0], DType::f64), x[0].dtype()); }});
  c.push_back({"cat", "dim0", {any({2, 3}), any({1, 3})}, [](const In& x) { return ops::cat({x[0], x[1]}, 0); }});
  // ---- conv, pool, norm ----
  c.push_back({"conv2d", "pad1_bias", {any({2, 3, 5, 5}), any({4, 3, 3, 3}), any({4})},
               [](const In& x) { return ops::conv2d(x[0], x[1], x[2], {.padding = 1}); }, 50});
  c.push_back({"conv2d", "fused_relu_stride2", {any({2, 2, 6, 6}), any({3, 2, 3, 3})},
               [](const In& x) { return ops::conv2d(x[0], x[1], Tensor(), {.stride = 2, .relu = true}); }, 18});
  c.push_back({"max_pool2d", "k2", {any({2, 2, 4, 6})}, [](const In& x) { return ops::max_pool2d(x[0], 2); }});
  // conv2d then max_pool2d as one op; with 8 output channels the CPU's pool reads oneDNN's layout
  // (test_conv_pool.cpp has the deeper cases).
  c.push_back({"conv2d_max_pool2d", "pad1_bias_k2", {any({2, 3, 6, 5}), any({8, 3, 3, 3}), any({8})},
               [](const In& x) { return ops::conv2d_max_pool2d(x[0], x[1], x[2], {.padding = 1}, 2); }, 72});
  c.push_back({"conv2d_max_pool2d", "fused_relu_k2", {any({2, 8, 6, 6}), any({16, 8, 3, 3}), any({16})},
               [](const In& x) { return ops::conv2d_max_pool2d(x[0], x[1], x[2], {.padding = 1, .relu = true}, 2); },
               72});
  c.push_back({"conv2d_max_pool2d", "k3_s2_p1", {any({2, 4, 7, 7}), any({8, 4, 3, 3})},
               [](const In& x) {
                 return ops::conv2d_max_pool2d(x[0], x[1], Tensor(), {}, 3, {.stride = 2, .padding = 1});
               },
               72});
  // Channels-last (NHWC bytes; the layout a GPU's convolutions run in): the ops that keep it, on
  // channel counts that give the GPU's NHWC pool several channels a thread (8) and one (3). The
  // ReLU before the pool makes its backward read the kept input (the from-input path).
  const auto cl = [](const Tensor& t) { return ops::contiguous(t, ops::MemoryFormat::channels_last); };
  c.push_back({"contiguous", "channels_last", {any({2, 3, 4, 5})}, [cl](const In& x) { return cl(x[0]); }});
  c.push_back({"conv2d", "channels_last_bias", {any({2, 8, 5, 5}), any({8, 8, 3, 3}), any({8})},
               [](const In& x) { return ops::conv2d(x[0], x[1], x[2], {.padding = 1, .channels_last = true}); }, 72});
  c.push_back({"conv2d", "channels_last_fused_relu_stride2", {any({2, 3, 6, 6}), any({4, 3, 3, 3})},
               [cl](const In& x) { return ops::conv2d(cl(x[0]), x[1], Tensor(), {.stride = 2, .relu = true}); }, 36});
  c.push_back({"max_pool2d", "channels_last_k2", {any({2, 8, 4, 6})},
               [cl](const In& x) { return ops::max_pool2d(cl(x[0]), 2); }});
  c.push_back({"max_pool2d", "channels_last_after_relu", {any({2, 3, 4, 6})},
               [cl](const In& x) { return ops::max_pool2d(ops::relu(cl(x[0])), 2); }});
  c.push_back({"max_pool2d", "channels_last_k3_s2_p1", {any({2, 8, 5, 6})},
               [cl](const In& x) { return ops::max_pool2d(cl(x[0]), 3, {.stride = 2, .padding = 1}); }});
  c.push_back({"avg_pool2d", "k3_s2_p1", {any({2, 2, 5, 6})},
               [](const In& x) { return ops::avg_pool2d(x[0], 3, {.stride = 2, .padding = 1}); }, 9});
  c.push_back({"adaptive_avg_pool2d", "7x5_to_3x2", {any({2, 2, 7, 5})},
               [](const In& x) { return ops::adaptive_avg_pool2d(x[0], {3, 2}); }, 9});
  c.push_back({"batch_norm", "train_affine", {any({4, 3, 2, 2}), any({3}), any({3})},
               [](const In& x) { return ops::batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], true); }, 16});
  c.push_back({"batch_norm", "eval_running_stats", {any({4, 3, 2, 2}), any({3}), any({3}), constant({3})},
               [](const In& x) {
                 const Tensor var = ops::mul(x[3], x[3]);  // positive, in the dtype under test
                 return ops::batch_norm(x[0], x[3], var, x[1], x[2], false);
               }, 16});
  c.push_back({"layer_norm", "last_dim_affine", {any({3, 8}), any({8}), any({8})},
               [](const In& x) { return ops::layer_norm(x[0], {8}, x[1], x[2]); }, 8});
  // ---- embedding (k: the most rows one weight row's gradient sums; 12 indices over 5 rows) ----
  c.push_back({"embedding", "indices_3x4", {any({5, 6}), indices({3, 4}, 5)},
               [](const In& x) { return ops::embedding(x[0], x[1]); }, 12});
  // ---- attention (k: the longest sums, over keys and the head dim; rounds: the fused kernel's
  // bf16 P and dS before its matmuls, and the rounded output its backward reads) ----
  c.push_back({"scaled_dot_product_attention", "plain_tq_ne_tk", {any({2, 2, 5, 8}), any({2, 2, 7, 8}), any({2, 2, 7, 6})},
               [](const In& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2]); }, 16, 4});
  c.push_back({"scaled_dot_product_attention", "causal_views_of_qkv", {any({2, 6, 3, 2, 8})},
               [](const In& x) {
                 const Tensor t = ops::transpose(x[0], 1, 3);  // [B, H, 3, T, E], the GPT's layout
                 auto part = [&](int64_t i) { return ops::reshape(ops::slice(t, 2, i, i + 1), {2, 2, 6, 8}); };
                 return ops::scaled_dot_product_attention(part(0), part(1), part(2), {.causal = true});
               }, 16, 4});
  c.push_back({"scaled_dot_product_attention", "packed_qkv_causal", {any({2, 6, 3 * 2 * 8})},
               [](const In& x) { return ops::packed_qkv_attention(x[0], 2, {.causal = true}); }, 16, 4});
  // A fresh generator per call: the same mask on every backend.
  c.push_back({"scaled_dot_product_attention", "causal_dropout", {any({1, 2, 6, 4}), any({1, 2, 9, 4}), any({1, 2, 9, 4})},
               [](const In& x) {
                 Generator g(11);
                 return ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true, .dropout = 0.25, .gen = &g});
               }, 16, 4});
  // clang-format on
  return c;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build();
  return cases;
}

Tensor nonzero_values(const Shape& shape, DType t, bool positive, Generator& g) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& e : v) {
    e = 0.25 + 1.75 * g.uniform();
    if (!positive && g.uniform() < 0.5) e = -e;
  }
  return Tensor::from_vector(v, shape, t);
}

In make_inputs(const OpCase& c, Generator& g, const std::function<DType(size_t)>& dtype_of) {
  In in;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    if (s.kind == K::targets) {
      std::vector<int64_t> t(static_cast<size_t>(shape_numel(s.shape)));
      for (int64_t& v : t) v = int64_t(g.next_u64() % uint64_t(s.classes));
      for (size_t j = 1; s.ignore_every > 0 && j < t.size(); j += size_t(s.ignore_every)) t[j] = -100;
      in.push_back(Tensor::from_vector(t, s.shape));
      continue;
    }
    Tensor t = nonzero_values(s.shape, dtype_of(i), s.kind == K::positive, g);
    if (s.kind != K::constant) t.set_requires_grad();
    in.push_back(t);
  }
  return in;
}

Outcome run_case(const OpCase& c, const In& inputs, uint64_t seed, kernels::Backend b, const Device& device) {
  const kernels::BackendGuard guard(b);
  In leaves;
  for (const Tensor& t : inputs) {
    Tensor l = t.detach().to(device);
    leaves.push_back(t.requires_grad() ? l.detach().set_requires_grad() : l);
  }
  Tensor y = c.f(leaves);
  Generator g(seed);
  y.backward(nonzero_values(y.shape(), y.dtype(), false, g).to(device));
  Outcome r{{y.detach()}};
  for (const Tensor& l : leaves) r.tensors.push_back(l.requires_grad() ? l.grad() : Tensor());
  return r;
}

}  // namespace mixprec::testing
