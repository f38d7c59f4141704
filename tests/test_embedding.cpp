// The embedding kernels (gather, scatter-add: the fast one bit-identical to the reference on any
// thread count), cross_entropy / nll_loss over [B, T, V] with ignore_index (PyTorch's rules: mean
// over the targets left, NaN when none is), large vocabularies, the one-line errors, nn::Embedding.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "error_text.h"
#include "kernels/embedding.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using kernels::Backend;
using kernels::BackendGuard;
using testutil::bytes_of;
using testutil::error_of;

const std::vector<DType> kFloat = {DType::f32, DType::bf16, DType::f16};

std::vector<int64_t> random_indices(Generator& g, size_t n, int64_t rows) {
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = int64_t(g.uniform_below(uint64_t(rows)));
  return v;
}

// Each output row is the weight row its index names, bit for bit, on both backends and any dtype.
TEST(EmbeddingKernels, GatherCopiesRowsBitForBit) {
  Generator g(1);
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16})
    for (Backend b : {Backend::cpu, Backend::ref}) {
      const BackendGuard guard(b);
      const Tensor w = Tensor::randn({7, 5}, g, t);
      const std::vector<int64_t> idx = random_indices(g, 12, 7);
      const Tensor out = ops::embedding(w, Tensor::from_vector(idx, {3, 4}));
      ASSERT_EQ(out.shape(), (Shape{3, 4, 5}));
      ASSERT_EQ(out.dtype(), t);
      for (size_t i = 0; i < idx.size(); ++i)
        EXPECT_EQ(bytes_of(out.view({12, 5}).slice(0, int64_t(i), int64_t(i) + 1).contiguous()),
                  bytes_of(w.slice(0, idx[i], idx[i] + 1).contiguous()))
            << "row " << i << " " << dtype_name(t);
    }
}

// A transposed weight (not contiguous) and sliced indices take the reference's path; same rows.
TEST(EmbeddingKernels, NonContiguousOperands) {
  Generator g(2);
  const Tensor w = Tensor::randn({4, 6}, g).t();  // [6, 4]
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{5, 0, 3, 3, 1, 2}, {2, 3}).slice(1, 1, 3);
  const Tensor out = ops::embedding(w, idx);
  const Tensor want = ops::embedding(w.contiguous(), idx.contiguous());
  EXPECT_EQ(bytes_of(out), bytes_of(want));
}

// The fast scatter-add sums each row's gradients in index order in f32 as the reference does:
// the same bits, on 1 thread and on 3.
TEST(EmbeddingKernels, ScatterAddIsTheReferenceBitForBitOnAnyThreadCount) {
  Generator g(3);
  const int64_t rows = 50, dim = 33, n = 2000;                                       // 40 uses per row on average
  const Tensor idx = Tensor::from_vector(random_indices(g, n, rows - 3), {40, 50});  // 3 rows unused
  const int saved_threads = omp_get_max_threads();
  for (DType t : kFloat) {
    const Tensor grad = Tensor::randn({40, 50, dim}, g, t);
    Tensor want;
    {
      const BackendGuard ref(Backend::ref);
      want = kernels::embedding_backward(grad, idx, rows, t);
    }
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const BackendGuard fast(Backend::cpu);
      const Tensor got = kernels::embedding_backward(grad, idx, rows, t);
      EXPECT_EQ(bytes_of(got), bytes_of(want)) << dtype_name(t) << " on " << threads << " threads";
    }
    omp_set_num_threads(saved_threads);
    // Unused rows are exactly 0.
    for (double v : want.slice(0, rows - 3, rows).to_vector_f64()) EXPECT_EQ(v, 0.0);
  }
}

// The f32 accumulation: 4096 bf16 gradients of 1 + 2^-7 summed into one row need f32 (each partial
// sum exact), where a bf16 running sum would have stopped growing near 256.
TEST(EmbeddingKernels, ScatterAddAccumulatesInF32) {
  const Tensor idx = Tensor::zeros({4096}, DType::i64);
  const Tensor grad = Tensor::full({4096, 2}, 1.0 + 0x1p-7, DType::bf16);
  for (Backend b : {Backend::cpu, Backend::ref}) {
    const BackendGuard guard(b);
    const Tensor dw = kernels::embedding_backward(grad, idx, 3, DType::bf16);
    EXPECT_EQ(dw.to_vector_f64()[0], 4128.0) << "4096 * (1 + 2^-7) = 4128, a bf16 value";
  }
}

// An index outside [0, V) throws one line naming embedding and the index's place, on each backend.
TEST(EmbeddingKernels, OutOfRangeIndexIsOneLine) {
  const Tensor w = Tensor::zeros({5, 3});
  for (Backend b : {Backend::cpu, Backend::ref}) {
    const BackendGuard guard(b);
    EXPECT_EQ(error_of([&] {
                ops::embedding(w, Tensor::from_vector(std::vector<int64_t>{0, 4, 1, 9}, {2, 2}));
              }),
              "embedding: indices[3] = 9 is not a row index in [0, 5)");
    EXPECT_EQ(error_of([&] { ops::embedding(w, Tensor::from_vector(std::vector<int64_t>{-1}, {1})); }),
              "embedding: indices[0] = -1 is not a row index in [0, 5)");
  }
  EXPECT_EQ(error_of([&] { ops::embedding(w, Tensor::zeros({2})); }), "embedding: indices must be i64, got f32 [2]");
  EXPECT_EQ(error_of([&] { ops::embedding(Tensor::zeros({5}), Tensor::zeros({2}, DType::i64)); }),
            "embedding: weight must be [num_embeddings, embedding_dim], got [5]");
}

// A vocabulary of 100,000 rows: the first and last rows are reached, and the gradient lands there.
TEST(EmbeddingKernels, LargeVocabulary) {
  Generator g(4);
  const int64_t rows = 100000;
  Tensor w = Tensor::randn({rows, 4}, g).set_requires_grad();
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{rows - 1, 0, rows - 1, 51234}, {4});
  const Tensor out = ops::embedding(w, idx);
  EXPECT_EQ(bytes_of(out.slice(0, 0, 1).contiguous()), bytes_of(w.detach().slice(0, rows - 1, rows).contiguous()));
  ops::sum(out).backward();
  const std::vector<double> dw = w.grad().to_vector_f64();
  EXPECT_EQ(dw[size_t((rows - 1) * 4)], 2.0);
  EXPECT_EQ(dw[0], 1.0);
  EXPECT_EQ(dw[size_t(51234 * 4 + 3)], 1.0);
  double total = 0;
  for (double v : dw) total += v;
  EXPECT_EQ(total, 16.0);
}

// ---------------------------------------------------------------- cross_entropy over [B, T, V]

// [B, T, V] with [B, T] targets is the [B*T, V] loss: the same bits, gradient included.
TEST(CrossEntropyBTV, EqualsTheFlattenedLossBitForBit) {
  Generator g(5);
  const std::vector<int64_t> t = random_indices(g, 24, 11);
  for (ops::Reduction r : {ops::Reduction::mean, ops::Reduction::sum, ops::Reduction::none}) {
    const Tensor base = Tensor::randn({4, 6, 11}, g);
    Tensor x3 = base.clone().set_requires_grad(), x2 = base.view({24, 11}).clone().set_requires_grad();
    const Tensor l3 = ops::cross_entropy(x3, Tensor::from_vector(t, {4, 6}), r);
    const Tensor l2 = ops::cross_entropy(x2, Tensor::from_vector(t, {24}), r);
    EXPECT_EQ(l3.shape(), r == ops::Reduction::none ? (Shape{4, 6}) : Shape{});
    EXPECT_EQ(bytes_of(l3), bytes_of(l2));
    ops::sum(l3).backward();
    ops::sum(l2).backward();
    EXPECT_EQ(bytes_of(x3.grad()), bytes_of(x2.grad()));
  }
}

// Ignored targets add neither loss nor gradient, and mean divides by the targets left.
TEST(CrossEntropyBTV, IgnoredTargetsCountNeither) {
  Generator g(6);
  const Tensor x = Tensor::randn({2, 3, 5}, g, DType::f64).set_requires_grad();
  const std::vector<int64_t> t = {1, -100, 4, -100, -100, 0};
  const Tensor loss = ops::cross_entropy(x, Tensor::from_vector(t, {2, 3}));
  const std::vector<double> lp = ops::log_softmax(x.detach(), -1).to_vector_f64();
  const double want = -(lp[0 * 5 + 1] + lp[2 * 5 + 4] + lp[5 * 5 + 0]) / 3;
  EXPECT_NEAR(loss.item(), want, 1e-15);
  loss.backward();
  const std::vector<double> dx = x.grad().to_vector_f64();
  for (int64_t row : {1, 3, 4})
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(dx[size_t(row * 5 + c)], 0.0) << "ignored row " << row;
  // A class index may be the ignored one: target 2 with ignore_index 2 counts nothing.
  const Tensor lp2 = Tensor::randn({3, 4}, g);
  const Tensor t2 = Tensor::from_vector(std::vector<int64_t>{2, 1, 2}, {3});
  EXPECT_EQ(ops::nll_loss(lp2, t2, ops::Reduction::mean, 2).item(), -lp2.to_vector_f64()[1 * 4 + 1]);
  const std::vector<double> none = ops::nll_loss(lp2, t2, ops::Reduction::none, 2).to_vector_f64();
  EXPECT_EQ(none[0], 0.0);
  EXPECT_EQ(none[2], 0.0);
}

// Every target ignored: mean 0/0 = NaN (as PyTorch), sum 0, and a zero gradient.
TEST(CrossEntropyBTV, AllIgnoredMeanIsNaN) {
  Generator g(7);
  for (Backend b : {Backend::cpu, Backend::ref}) {
    const BackendGuard guard(b);
    Tensor x = Tensor::randn({2, 2, 3}, g).set_requires_grad();
    const Tensor t = Tensor::full({2, 2}, -100, DType::i64);
    const Tensor mean = ops::cross_entropy(x, t);
    EXPECT_TRUE(std::isnan(mean.item()));
    EXPECT_EQ(ops::cross_entropy(x, t, ops::Reduction::sum).item(), 0.0);
    mean.backward();
    for (double v : x.grad().to_vector_f64()) EXPECT_EQ(v, 0.0);
  }
}

// A vocabulary of 5000 classes (longer rows than the fast softmax's block: the reference's path)
// against the loss computed in f64 here.
TEST(CrossEntropyBTV, LargeVocabulary) {
  Generator g(8);
  const int64_t v = 5000;
  const Tensor x = Tensor::randn({2, 3, v}, g);
  const std::vector<int64_t> t = {0, v - 1, 17, 4999, 2500, 1};
  const double loss = ops::cross_entropy(x, Tensor::from_vector(t, {2, 3})).item();
  const std::vector<double> xv = x.to_vector_f64();
  double want = 0;
  for (size_t row = 0; row < 6; ++row) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < v; ++c) mx = std::max(mx, xv[row * size_t(v) + size_t(c)]);
    for (int64_t c = 0; c < v; ++c) s += std::exp(xv[row * size_t(v) + size_t(c)] - mx);
    want += (mx + std::log(s) - xv[row * size_t(v) + size_t(t[row])]) / 6;
  }
  EXPECT_NEAR(loss, want, 1e-5 * std::fabs(want));
}

TEST(CrossEntropyBTV, ShapeAndTargetErrorsAreOneLine) {
  const Tensor x = Tensor::zeros({2, 3, 5});
  EXPECT_EQ(error_of([&] { ops::cross_entropy(x, Tensor::zeros({6}, DType::i64)); }),
            "nll_loss: target must be i64 [2, 3] (log_probs [2, 3, 5] with the class dim last), got i64 [6]");
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy(x, Tensor::full({2, 3}, 5, DType::i64));
            }),
            "nll_loss: target[0] = 5 is not a class index in [0, 5)");
}

// ---------------------------------------------------------------------------- nn::Embedding

TEST(NnEmbedding, NameInitAndForward) {
  default_generator().manual_seed(9);
  nn::Embedding emb(65, 128);
  EXPECT_EQ(emb.name(), "Embedding(65, 128)");
  const nn::NamedTensors p = emb.named_parameters();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].first, "weight");
  EXPECT_EQ(p[0].second.shape(), (Shape{65, 128}));
  EXPECT_TRUE(p[0].second.requires_grad());
  // N(0, 1) as PyTorch: 8320 draws, mean within 4 standard errors of 0, variance near 1.
  const std::vector<double> w = emb.weight.to_vector_f64();
  double mean = 0, sq = 0;
  for (double v : w) mean += v / double(w.size());
  for (double v : w) sq += (v - mean) * (v - mean) / double(w.size());
  EXPECT_LT(std::fabs(mean), 4 / std::sqrt(double(w.size())));
  EXPECT_NEAR(sq, 1.0, 0.06);
  const Tensor y = emb(Tensor::from_vector(std::vector<int64_t>{3, 64, 0, 3}, {2, 2}));
  EXPECT_EQ(y.shape(), (Shape{2, 2, 128}));
  EXPECT_EQ(bytes_of(y.view({4, 128}).slice(0, 3, 4).contiguous()), bytes_of(emb.weight.slice(0, 3, 4).contiguous()));
  EXPECT_EQ(error_of([] { nn::Embedding(0, 4); }), "Embedding(0, 4): sizes must be positive");
}

}  // namespace
}  // namespace mixprec
