// The CUDA kernels of the element-wise, reduce, softmax, loss, embedding, shape and random families
// (src/kernels/cuda/) against the CPU reference kernels, deeper than the op cases of
// test_op_devices.cpp: contiguous, tail-length, transposed, row-sliced and misaligned (offset by
// one element) views; long reductions; random non-zero inputs; destinations poisoned before each
// run (a write outside the view shows). Bounds: agree_within_bound (op_cases.h), 2 ulp of the
// dtype + (k + 2) u32 S for a k-term reduction + `rounds` ulps of S where CUDA's f32 functions
// (exp, erf, tanh: up to 2 ulp) differ from the host's libm; conversions, fills and dropout masks
// must be the CPU's bit for bit. Skipped, with the reason, where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cross_entropy_checks.h"
#include "kernels/kernels.h"
#include "mixprec/ops.h"
#include "op_cases.h"

namespace mixprec::testing {
namespace {

#define REQUIRE_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU (" << cuda::unavailable_reason() << ")"

const std::vector<DType> kFloat = {DType::f32, DType::bf16, DType::f16, DType::f64};

// One input seen the same way on the host and on the GPU.
struct View {
  std::string name;
  Tensor host, gpu;
};

// Views of `shape` (2-d) with values of magnitude [0.25, 2]: each a different path of the kernels.
std::vector<View> views(const Shape& shape, DType t, bool positive, Generator& g) {
  const int64_t r = shape[0], c = shape[1], n = r * c;
  const Device gpu = Device::cuda(0);
  std::vector<View> v;
  auto add = [&](const std::string& name, const Tensor& base, const std::function<Tensor(const Tensor&)>& f) {
    v.push_back({name, f(base), f(base.to(gpu))});
  };
  add("contiguous", nonzero_values(shape, t, positive, g), [](const Tensor& b) { return b; });
  add("transposed", nonzero_values({c, r}, t, positive, g), [](const Tensor& b) { return b.t(); });
  add("row_sliced", nonzero_values({r, c + 3}, t, positive, g), [=](const Tensor& b) { return b.slice(1, 1, c + 1); });
  add("misaligned", nonzero_values({n + 1}, t, positive, g),
      [=](const Tensor& b) { return b.slice(0, 1, n + 1).view(shape); });
  return v;
}

std::string label(const View& v, DType t) { return v.name + " " + std::string(dtype_name(t)); }

Tensor on_cpu_ref(const std::function<Tensor()>& f) {
  const kernels::BackendGuard ref(kernels::Backend::ref);
  return f();
}

// Bits equal element by element (a NaN may be any NaN): conversions, fills, masks.
::testing::AssertionResult same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << what << ": dtype or shape differ";
  const std::vector<double> f = got.to_vector_f64(), w = want.to_vector_f64();
  for (size_t i = 0; i < f.size(); ++i) {
    const bool ok = std::isnan(w[i]) ? std::isnan(f[i]) : f[i] == w[i] && std::signbit(f[i]) == std::signbit(w[i]);
    if (!ok) return ::testing::AssertionFailure() << what << ": element " << i << " is " << f[i] << ", CPU " << w[i];
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------------------------ element-wise

TEST(CudaKernels, UnaryAndGradientsOnEveryView) {
  REQUIRE_GPU();
  using kernels::UnaryGradOp;
  using kernels::UnaryOp;
  struct U {
    UnaryOp op;
    bool positive;
    int rounds;
    std::optional<UnaryGradOp> grad;
  };
  const kernels::UnaryParams p{2.5, -0.75};
  const std::vector<U> ops = {{UnaryOp::neg, false, 0, {}},
                              {UnaryOp::affine, false, 0, {}},
                              {UnaryOp::exp, false, 1, UnaryGradOp::exp},
                              {UnaryOp::log, true, 1, UnaryGradOp::log},
                              {UnaryOp::pow, true, 1, UnaryGradOp::pow},
                              {UnaryOp::sqrt, true, 0, UnaryGradOp::sqrt}};
  Generator g(11);
  for (DType t : kFloat)
    for (const U& u : ops)
      for (const View& x : views({37, 41}, t, u.positive, g)) {
        const std::string what = "unary " + std::to_string(int(u.op)) + " " + label(x, t);
        const Tensor got = kernels::unary(u.op, x.gpu, p);
        EXPECT_TRUE(got.device().is_cuda()) << what;
        EXPECT_TRUE(
            agree_within_bound(got, on_cpu_ref([&] { return kernels::unary(u.op, x.host, p); }), 1, u.rounds, what));
        if (!u.grad) continue;
        const Tensor gh = nonzero_values(x.host.shape(), t, false, g);
        const Tensor gd = gh.to(Device::cuda(0));
        EXPECT_TRUE(agree_within_bound(kernels::unary_grad(*u.grad, gd, x.gpu, p),
                                       on_cpu_ref([&] { return kernels::unary_grad(*u.grad, gh, x.host, p); }), 1,
                                       u.rounds + 1, what + " grad"));
      }
}

TEST(CudaKernels, EveryActivationAndGradientOnEveryView) {
  REQUIRE_GPU();
  using kernels::Activation;
  Generator g(12);
  for (DType t : kFloat)
    for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu,
                         Activation::sigmoid, Activation::tanh})
      for (const View& x : views({33, 65}, t, false, g)) {
        const std::string what = "activation " + std::to_string(int(a)) + " " + label(x, t);
        const int rounds = a == Activation::relu ? 0 : 2;
        EXPECT_TRUE(agree_within_bound(kernels::activation(a, x.gpu),
                                       on_cpu_ref([&] { return kernels::activation(a, x.host); }), 1, rounds, what));
        const Tensor gh = nonzero_values(x.host.shape(), t, false, g);
        EXPECT_TRUE(agree_within_bound(kernels::activation_grad(a, gh.to(Device::cuda(0)), x.gpu),
                                       on_cpu_ref([&] { return kernels::activation_grad(a, gh, x.host); }), 1,
                                       rounds + 1, what + " grad"));
      }
}

TEST(CudaKernels, BinaryWithEveryBroadcastOnEveryView) {
  REQUIRE_GPU();
  using kernels::BinaryOp;
  Generator g(13);
  for (DType t : kFloat)
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div})
      for (const View& a : views({29, 67}, t, false, g))
        for (const Shape& bs : {Shape{29, 67}, Shape{67}, Shape{29, 1}, Shape{}}) {
          const Tensor bh = nonzero_values(bs, t, false, g);
          const std::string what = "binary " + std::to_string(int(op)) + " " + label(a, t) + " with " + shape_str(bs);
          EXPECT_TRUE(agree_within_bound(kernels::binary(op, a.gpu, bh.to(Device::cuda(0))),
                                         on_cpu_ref([&] { return kernels::binary(op, a.host, bh); }), 1, 0, what));
          // The broadcast operand first too.
          EXPECT_TRUE(agree_within_bound(kernels::binary(op, bh.to(Device::cuda(0)), a.gpu),
                                         on_cpu_ref([&] { return kernels::binary(op, bh, a.host); }), 1, 0,
                                         what + " (swapped)"));
        }
}

TEST(CudaKernels, AddInplaceFromEveryViewAndDtype) {
  REQUIRE_GPU();
  Generator g(14);
  for (DType t : kFloat)
    for (DType gt : {t, DType::f32})
      for (const View& x : views({19, 131}, gt, false, g)) {
        const Tensor acc_h = nonzero_values({19, 131}, t, false, g);
        Tensor acc_d = acc_h.to(Device::cuda(0));
        Tensor acc_r = acc_h.clone();
        kernels::add_inplace(acc_d, x.gpu);
        on_cpu_ref([&] {
          kernels::add_inplace(acc_r, x.host);
          return acc_r;
        });
        EXPECT_TRUE(agree_within_bound(acc_d, acc_r, 1, 0,
                                       "add_inplace " + label(x, gt) + " into " + std::string(dtype_name(t))));
      }
}

TEST(CudaKernels, ReluMaskInplaceSameAndMixedDtypes) {
  REQUIRE_GPU();
  Generator g(15);
  for (DType gt : kFloat)
    for (DType yt : {gt, DType::f32})
      for (const View& y : views({23, 45}, yt, false, g)) {
        const Tensor gh = nonzero_values({23, 45}, gt, false, g);
        Tensor gd = gh.to(Device::cuda(0)), gr = gh.clone();
        kernels::relu_mask_inplace(gd, y.gpu);
        on_cpu_ref([&] {
          kernels::relu_mask_inplace(gr, y.host);
          return gr;
        });
        EXPECT_TRUE(same_values(gd, gr, "relu_mask_inplace " + label(y, yt) + " on " + std::string(dtype_name(gt))));
      }
  // A tiny positive f32 y keeps an f16 gradient (it would round to 0 in f16).
  Tensor grad = Tensor::full({5}, 3.0, DType::f16, Device::cuda(0));
  kernels::relu_mask_inplace(grad, Tensor::full({5}, 1e-30, DType::f32, Device::cuda(0)));
  EXPECT_EQ(grad.to_vector(), std::vector<float>(5, 3.0f));
}

// ------------------------------------------------------------------------------- reductions

TEST(CudaKernels, SumOverDimsOfEveryViewIntoEveryDtype) {
  REQUIRE_GPU();
  Generator g(16);
  const std::vector<std::vector<int64_t>> dim_sets = {{0}, {1}, {0, 1}};
  for (DType t : kFloat)
    for (const View& x : views({70, 45}, t, false, g))
      for (const auto& dims : dim_sets)
        for (DType out : {DType::f32, DType::f64, t})
          for (bool keepdim : {false, true}) {
            const int64_t k = dims.size() == 2 ? 70 * 45 : (dims[0] == 0 ? 70 : 45);
            const std::string what = "sum " + label(x, t) + " dims " + std::to_string(dims[0]) +
                                     (dims.size() == 2 ? ",1" : "") + " -> " + std::string(dtype_name(out));
            EXPECT_TRUE(agree_within_bound(kernels::sum(x.gpu, dims, keepdim, out),
                                           on_cpu_ref([&] { return kernels::sum(x.host, dims, keepdim, out); }), k, 0,
                                           what));
          }
}

// The split path (few outputs, long rows), the column path with long columns (its rows split over
// blocks: 40 and GPT-2's bias gradient's 770 columns), a whole-tensor sum.
TEST(CudaKernels, LongReductions) {
  REQUIRE_GPU();
  Generator g(17);
  struct R {
    Shape shape;
    std::vector<int64_t> dims;
    int64_t k;
  };
  for (const R& r : {R{{3, 70001}, {1}, 70001}, R{{20001, 40}, {0}, 20001}, R{{8195, 770}, {0}, 8195},
                     R{{200003}, {0}, 200003}, R{{3, 5, 4099}, {0, 2}, 3 * 4099}})
    for (DType t : kFloat) {
      const Tensor xh = nonzero_values(r.shape, t, true, g);
      const std::string what = "sum of " + shape_str(r.shape) + " " + std::string(dtype_name(t));
      EXPECT_TRUE(agree_within_bound(kernels::sum(xh.to(Device::cuda(0)), r.dims, false, DType::f32),
                                     on_cpu_ref([&] { return kernels::sum(xh, r.dims, false, DType::f32); }), r.k, 0,
                                     what));
    }
}

TEST(CudaKernels, AllFiniteFindsNanAndInfAnywhere) {
  REQUIRE_GPU();
  Generator g(18);
  for (DType t : kFloat)
    for (const View& x : views({31, 33}, t, false, g)) {
      EXPECT_TRUE(kernels::all_finite(x.gpu)) << label(x, t);
      for (int64_t at : {int64_t(0), int64_t(500), int64_t(31 * 33 - 1)})
        for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)}) {
          Tensor h = x.host.clone();
          Tensor flat = h.view({31 * 33});
          flat.slice(0, at, at + 1).fill_(bad);
          EXPECT_FALSE(kernels::all_finite(h.to(Device::cuda(0)))) << label(x, t) << " bad at " << at;
        }
    }
}

// ---------------------------------------------------------------------------------- softmax

TEST(CudaKernels, SoftmaxRowsOfEveryLength) {
  REQUIRE_GPU();
  Generator g(19);
  for (DType t : kFloat)
    for (int64_t cols : {int64_t(1), int64_t(10), int64_t(33), int64_t(1000), int64_t(3001)})
      for (bool log : {false, true}) {
        const std::vector<View> xs = views({17, cols}, t, false, g);
        for (const View& x : xs) {
          const std::string what =
              std::string(log ? "log_softmax " : "softmax ") + std::to_string(cols) + " " + label(x, t);
          const Tensor yd = kernels::softmax_lastdim(x.gpu, log);
          const Tensor yh = on_cpu_ref([&] { return kernels::softmax_lastdim(x.host, log); });
          EXPECT_TRUE(agree_within_bound(yd, yh, cols, 2, what));
          // The backward from the same (CPU) y, so only the kernel differs.
          const Tensor gh = nonzero_values({17, cols}, t, false, g);
          EXPECT_TRUE(agree_within_bound(
              kernels::softmax_lastdim_backward(yh.to(Device::cuda(0)), gh.to(Device::cuda(0)), log),
              on_cpu_ref([&] { return kernels::softmax_lastdim_backward(yh, gh, log); }), cols, 2, what + " backward"));
        }
      }
}

// ------------------------------------------------------------------------------------- loss

TEST(CudaKernels, NllLossForwardAndBackward) {
  REQUIRE_GPU();
  using kernels::LossReduce;
  Generator g(20);
  const int64_t n = 300, c = 10;
  std::vector<int64_t> labels(n);
  for (int64_t& l : labels) l = int64_t(g.uniform_below(c));
  for (int64_t i = 0; i < n; i += 7) labels[size_t(i)] = -100;  // ignored
  const Tensor th = Tensor::from_vector(labels, {n});
  const Tensor td = th.to(Device::cuda(0));
  for (DType t : kFloat)
    for (const View& lp : views({n, c}, t, false, g))
      for (LossReduce r : {LossReduce::none, LossReduce::sum, LossReduce::mean}) {
        const bool reduce = r != LossReduce::none;
        const std::string what = std::string("nll_loss ") +
                                 (r == LossReduce::mean ? "mean "
                                  : reduce              ? "sum "
                                                        : "none ") +
                                 label(lp, t);
        EXPECT_TRUE(agree_within_bound(kernels::nll_loss_forward(lp.gpu, td, r, -100),
                                       on_cpu_ref([&] { return kernels::nll_loss_forward(lp.host, th, r, -100); }),
                                       reduce ? n : 1, 0, what));
        const Tensor gh = nonzero_values(reduce ? Shape{} : Shape{n}, t, false, g);
        EXPECT_TRUE(same_values(kernels::nll_loss_backward(gh.to(Device::cuda(0)), td, {n, c}, r, -100, t),
                                on_cpu_ref([&] {
                                  return kernels::nll_loss_backward(gh, th, {n, c}, r, -100, t);
                                }),
                                what + " backward"));
      }
}

// cross_entropy's kernels against the f64 reference (cross_entropy_checks.h's bounds) in every
// dtype, on the image models' 10 classes, the char gpt's [B, T, 65] and GPT-2's vocabulary of
// 50304, every third target ignored; then a bad target, reported at the next wait naming
// nll_loss, its row's gradient 0; and every target ignored: mean NaN, sum 0, gradient 0.
TEST(CudaKernels, CrossEntropyMatchesTheReference) {
  REQUIRE_GPU();
  using kernels::LossReduce;
  const Device gpu = Device::cuda(0);
  Generator g(23);
  for (const Shape& shape : {Shape{6, 10}, Shape{3, 4, 65}, Shape{4, 50304}}) {
    const Shape lead(shape.begin(), shape.end() - 1);
    std::vector<int64_t> tv(static_cast<size_t>(shape_numel(lead)));
    for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 3 == 2 ? -100 : int64_t(g.next_u64() % uint64_t(shape.back()));
    const Tensor target = Tensor::from_vector(tv, lead);
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const Tensor logits = Tensor::uniform(shape, g, -6, 6, DType::f64).to(t);
      for (LossReduce r : {LossReduce::none, LossReduce::sum, LossReduce::mean}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_str(shape) + " reduction " + std::to_string(int(r)));
        const DType ct = t == DType::f64 ? DType::f64 : DType::f32;
        const Tensor gy = r == LossReduce::none ? Tensor::uniform(lead, g, 0.5, 2.0, ct) : Tensor::scalar(1.5, ct);
        const kernels::CrossEntropyResult got = kernels::cross_entropy_forward(logits.to(gpu), target.to(gpu), r, -100);
        const Tensor dx = kernels::cross_entropy_backward(gy.to(gpu), logits.to(gpu), got.lse, target.to(gpu), r, -100);
        EXPECT_EQ(got.loss.dtype(), ct);
        EXPECT_EQ(dx.dtype(), t);
        testutil::expect_cross_entropy_near_reference(logits, target, gy, r, -100, got, dx);
      }
    }
  }
  const Tensor logits = Tensor::uniform({6, 4}, g, -1, 1, DType::f32).to(gpu);
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 7, 0}, {6}).to(gpu);
  const kernels::CrossEntropyResult r = kernels::cross_entropy_forward(logits, bad, LossReduce::sum, -100);
  const Tensor dx = kernels::cross_entropy_backward(Tensor::scalar(1.0).to(gpu), logits, r.lse, bad, LossReduce::sum,
                                                    -100);  // no throw at either launch
  try {
    (void)r.loss.item();
    ADD_FAILURE() << "a target of 7 with 4 classes was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nll_loss: target[4] = 7 is not a class index in [0, 4)"), std::string::npos)
        << e.what();
  }
  const std::vector<double> dxv = dx.to_vector_f64();
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(dxv[16 + c], 0.0) << "the bad target's row";
  const Tensor all_ignored = Tensor::full({6}, -100.0, DType::i64).to(gpu);
  const kernels::CrossEntropyResult none = kernels::cross_entropy_forward(logits, all_ignored, LossReduce::mean, -100);
  EXPECT_TRUE(std::isnan(none.loss.item()));
  EXPECT_EQ(kernels::cross_entropy_forward(logits, all_ignored, LossReduce::sum, -100).loss.item(), 0.0);
  for (double v : kernels::cross_entropy_backward(Tensor::scalar(1.0).to(gpu), logits, none.lse, all_ignored,
                                                  LossReduce::mean, -100)
                      .to_vector_f64())
    EXPECT_EQ(v, 0.0);
}

// [B, T, C] log-probabilities with [B, T] targets, every one ignored: the mean is NaN (0/0, as
// PyTorch), the sum 0, the gradient 0, on the GPU as on the CPU.
TEST(CudaKernels, NllLossLeadingShapeAndAllIgnored) {
  REQUIRE_GPU();
  using kernels::LossReduce;
  Generator g(22);
  const Tensor lp = nonzero_values({3, 4, 5}, DType::f32, false, g);
  const Tensor all_ignored = Tensor::full({3, 4}, -1.0, DType::i64);
  const Device gpu = Device::cuda(0);
  EXPECT_TRUE(std::isnan(kernels::nll_loss_forward(lp.to(gpu), all_ignored.to(gpu), LossReduce::mean, -1).item()));
  EXPECT_EQ(kernels::nll_loss_forward(lp.to(gpu), all_ignored.to(gpu), LossReduce::sum, -1).item(), 0.0);
  const Tensor grad = kernels::nll_loss_backward(Tensor::scalar(1.0).to(gpu), all_ignored.to(gpu), {3, 4, 5},
                                                 LossReduce::mean, -1, DType::f32);
  EXPECT_EQ(grad.shape(), (Shape{3, 4, 5}));
  for (double v : grad.to_vector_f64()) EXPECT_EQ(v, 0.0);
  const Tensor none = kernels::nll_loss_forward(lp.to(gpu), all_ignored.to(gpu), LossReduce::none, -1);
  EXPECT_EQ(none.shape(), (Shape{3, 4}));
}

// A bad target is reported at the host's next wait for the GPU, once, naming the sample; the
// launch itself does not wait.
TEST(CudaKernels, NllLossBadTargetReportedAtTheNextWait) {
  REQUIRE_GPU();
  using kernels::LossReduce;
  Generator g(21);
  const Tensor lp = nonzero_values({6, 4}, DType::f32, false, g).to(Device::cuda(0));
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 7, 0}, {6}).to(Device::cuda(0));
  const Tensor loss = kernels::nll_loss_forward(lp, bad, LossReduce::sum, -100);  // no throw here
  try {
    (void)loss.item();
    ADD_FAILURE() << "a target of 7 with 4 classes was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nll_loss: target[4] = 7 is not a class index in [0, 4)"), std::string::npos)
        << e.what();
  }
  const Tensor good = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 3, 0}, {6}).to(Device::cuda(0));
  EXPECT_NO_THROW((void)kernels::nll_loss_forward(lp, good, LossReduce::sum, -100).item())
      << "the flag was not cleared";
}

// ------------------------------------------------------------------------------- embedding

// The gather bit for bit on every weight view and dtype; the scatter-add bit for bit too: sorted by
// index, each row summed in position order in f32 as the reference sums it, no atomics (the same
// bits on every run: mixprec/deterministic.h).
TEST(CudaKernels, EmbeddingGatherAndScatterAdd) {
  REQUIRE_GPU();
  Generator g(23);
  const int64_t rows = 37, dim = 19;
  std::vector<int64_t> idx(5 * 41);
  for (int64_t& v : idx) v = int64_t(g.uniform_below(uint64_t(rows / 3)));  // many repeats
  const Tensor ih = Tensor::from_vector(idx, {5, 41});
  const Tensor id = ih.to(Device::cuda(0));
  int64_t most = 0;
  for (int64_t r = 0; r < rows; ++r) most = std::max<int64_t>(most, std::count(idx.begin(), idx.end(), r));
  for (DType t : kFloat) {
    for (const View& w : views({rows, dim}, t, false, g))
      EXPECT_TRUE(same_values(kernels::embedding_forward(w.gpu, id),
                              on_cpu_ref([&] { return kernels::embedding_forward(w.host, ih); }),
                              "embedding " + label(w, t)));
    const Tensor gh = nonzero_values({5, 41, dim}, t, false, g);
    const Tensor gd = gh.to(Device::cuda(0));
    const Tensor first = kernels::embedding_backward(gd, id, rows, t);
    EXPECT_TRUE(same_values(first, on_cpu_ref([&] { return kernels::embedding_backward(gh, ih, rows, t); }),
                            "embedding backward " + std::string(dtype_name(t))));
    EXPECT_TRUE(same_values(kernels::embedding_backward(gd, id, rows, t), first, "embedding backward rerun"));
  }
  EXPECT_GT(most, 5);  // the runs the rows sum are long
}

// An index out of range is reported at the next wait, naming embedding and its position, through
// the flag nll_loss's bad targets use; then cleared.
TEST(CudaKernels, EmbeddingBadIndexReportedAtTheNextWait) {
  REQUIRE_GPU();
  Generator g(24);
  const Tensor w = nonzero_values({5, 3}, DType::f32, false, g).to(Device::cuda(0));
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 4, 1, 9}, {2, 2}).to(Device::cuda(0));
  const Tensor out = kernels::embedding_forward(w, bad);  // no throw here
  try {
    (void)out.to_vector_f64();
    ADD_FAILURE() << "index 9 of 5 rows was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding: indices[3] = 9 is not a row index in [0, 5)"), std::string::npos)
        << e.what();
  }
  const Tensor good = Tensor::from_vector(std::vector<int64_t>{0, 4, 1, 2}, {2, 2}).to(Device::cuda(0));
  EXPECT_NO_THROW((void)kernels::embedding_forward(w, good).to_vector_f64()) << "the flag was not cleared";
}

// ------------------------------------------------------------------------------------ shape

const std::vector<DType> kAll = {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i64, DType::u8};

// Values that hit every conversion rule: fractions, negatives, beyond f16's and u8's range, NaN.
Tensor conversion_values(const Shape& shape, DType t, Generator& g) {
  std::vector<double> v(size_t(shape_numel(shape)));
  const double specials[] = {0.5, -1.5, 2.5, 300.7, -300.2, 70000.0, 1e-6, -0.0, 255.5, double(NAN)};
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? specials[(i / 3) % 10] : (g.uniform() - 0.5) * 600;
  return Tensor::from_vector(v, shape, DType::f64).to(t);
}

TEST(CudaKernels, CopyBetweenEveryDtypePairAndViewIntoPoisonedDestinations) {
  REQUIRE_GPU();
  Generator g(22);
  const Shape shape{27, 35};
  for (DType st : kAll)
    for (DType dt : kAll) {
      const Tensor src_base = conversion_values({35, 27 + 1}, st, g);
      for (int layout = 0; layout < 4; ++layout) {
        // src: contiguous, transposed, misaligned; dst: inside a poisoned base, contiguous or strided.
        auto src_of = [&](const Tensor& b) {
          if (layout == 1) return b.slice(1, 0, 27).t();
          if (layout == 2) return b.view({35 * 28}).slice(0, 1, 1 + 27 * 35).view(shape);
          return b.view({35 * 28}).slice(0, 0, 27 * 35).view(shape);
        };
        auto dst_of = [&](Tensor& b) {
          return layout == 3 ? b.slice(1, 2, 37) : b.view({27 * 39}).slice(0, 0, 27 * 35).view(shape);
        };
        Tensor dst_base_h = Tensor::full({27, 39}, 77.0, dt);  // the poison: must survive outside the view
        Tensor dst_base_d = dst_base_h.to(Device::cuda(0));
        Tensor dh = dst_of(dst_base_h), dd = dst_of(dst_base_d);
        const Tensor sd_base = src_base.to(Device::cuda(0));
        kernels::copy(src_of(sd_base), dd);
        on_cpu_ref([&] {
          kernels::copy(src_of(src_base), dh);
          return dh;
        });
        EXPECT_TRUE(same_values(dst_base_d, dst_base_h,
                                "copy " + std::string(dtype_name(st)) + " -> " + std::string(dtype_name(dt)) +
                                    " layout " + std::to_string(layout)));
      }
    }
}

TEST(CudaKernels, FillEveryDtypeAndView) {
  REQUIRE_GPU();
  for (DType t : kAll)
    for (double value : {0.0, -0.0, 1.5, -3.25, 1e10})
      for (bool strided : {false, true}) {
        Tensor base_h = Tensor::full({13, 21}, 5.0, t);
        Tensor base_d = base_h.to(Device::cuda(0));
        Tensor vh = strided ? base_h.slice(1, 1, 20) : base_h.view({13 * 21}).slice(0, 1, 13 * 21);
        Tensor vd = strided ? base_d.slice(1, 1, 20) : base_d.view({13 * 21}).slice(0, 1, 13 * 21);
        kernels::fill(vd, value);
        kernels::fill(vh, value);
        EXPECT_TRUE(same_values(base_d, base_h,
                                "fill " + std::to_string(value) + " " + std::string(dtype_name(t)) +
                                    (strided ? " strided" : " misaligned")));
      }
}

// ----------------------------------------------------------------------------------- random

TEST(CudaKernels, DropoutMaskIsTheCpusBitForBit) {
  REQUIRE_GPU();
  for (DType t : kFloat)
    for (int64_t n : {int64_t(1), int64_t(5), int64_t(1027), int64_t(100003)}) {
      Generator cpu = Generator(99).split(uint64_t(n)), gpu = cpu;
      (void)cpu.next_u32();  // an offset off the block boundary: reserve() must round both up alike
      (void)gpu.next_u32();
      for (int use = 0; use < 2; ++use) {
        const Tensor md = kernels::dropout_mask({n}, t, 0.3, gpu, Device::cuda(0));
        const Tensor mh = kernels::dropout_mask({n}, t, 0.3, cpu, Device::cpu());
        EXPECT_TRUE(same_values(md, mh, "dropout mask " + std::to_string(n) + " " + std::string(dtype_name(t))));
        EXPECT_EQ(gpu.offset(), cpu.offset());
      }
    }
}

}  // namespace
}  // namespace mixprec::testing
