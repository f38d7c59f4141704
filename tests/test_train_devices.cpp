// Whole training loops on the fenced device (host access to its memory faults, as on a GPU) against
// the same loops on the CPU: every parameter, buffer and the loss scale bit-identical after N
// steps, the same skipped steps for injected inf/NaN gradients, and not one device-to-host copy in
// an amp-fp16 step (forward, scaled backward, unscale, clip, step, update). Plus the optimizer
// family's fast CPU kernels against the reference in f32, bf16 and f16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error_norms.h"
#include "kernels/optim.h"
#include "kernels/shape.h"
#include "mixprec/autocast.h"
#include "mixprec/clip.h"
#include "mixprec/cuda_stream.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/random.h"
#include "tensor_bytes.h"

using namespace mixprec;
using testutil::bytes_of;

namespace {

struct Loop {
  std::string model;      // "mlp" or "cnn" (conv + BatchNorm)
  std::string precision;  // "fp32", "amp-bf16", "amp-fp16", "bf16-sr" (pure bf16, stochastic rounding)
  std::string optimizer;  // "adamw" or "sgd" (momentum, nesterov)
  bool clip = false;
  int bad_step = -1;  // this step's first gradient is overwritten with bad_value
  double bad_value = INFINITY;
  int capture_at = -1;  // CUDA: this step is captured into a cuda::Graph, and it and the later ones replay it
};

struct Outcome {
  std::vector<std::vector<uint8_t>> state;  // parameters, buffers, master weights
  std::vector<bool> stepped;
  double scale = 0;
  int64_t skipped = 0, steps = 0;
  cuda::Graph::Nodes nodes;  // of the captured step (capture_at)
};

std::shared_ptr<nn::Module> make_model(const std::string& kind) {
  default_generator().manual_seed(11);
  if (kind == "mlp")
    return std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(64, 32), nn::ReLU(), nn::Linear(32, 10));
  return std::make_shared<nn::Sequential>(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(),
                                          nn::MaxPool2d(2), nn::Flatten(), nn::Linear(4 * 4 * 4, 10));
}

constexpr int kSteps = 6;

// The loop of docs (scale, backward, [unscale, clip], step, update) on `device`; batches are made
// on the CPU and moved, as a loader's are. count_copies: the device-to-host copies of steps 2..N.
Outcome run(const Loop& c, const Device& device, int64_t* count_copies = nullptr) {
  std::shared_ptr<nn::Module> model = make_model(c.model);
  const bool pure = c.precision == "bf16-sr";
  if (pure) model->to(DType::bf16, [](const nn::Module& m) { return !m.is_normalization(); });
  model->to(device);
  const optim::HalfParamOptions half{.master_weights = !pure, .stochastic_rounding = pure, .seed = 5};
  std::unique_ptr<optim::Optimizer> opt;
  if (c.optimizer == "adamw")
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2, .half = half});
  else
    opt = std::make_unique<optim::SGD>(
        model->parameters(),
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true, .half = half});
  const bool fp16 = c.precision == "amp-fp16";
  amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 2, .enabled = fp16});
  Generator data(3);
  Outcome out;
  int64_t copies_before = 0;
  // The batch goes into the same device tensors every step, as a captured step needs (its replays
  // read the memory the capture read).
  Tensor x = Tensor::empty({8, 1, 8, 8}, pure ? DType::bf16 : DType::f32, device);
  Tensor y = Tensor::empty({8}, DType::i64, device);
  cuda::Graph graph;
  for (int step = 0; step < kSteps; ++step) {
    if (step == 1) copies_before = kernels::device_to_host_copies();
    x.copy_(Tensor::randn({8, 1, 8, 8}, data, pure ? DType::bf16 : DType::f32).to(device));
    std::vector<int64_t> labels(8);
    for (int64_t& l : labels) l = int64_t(data.uniform_below(10));
    y.copy_(Tensor::from_vector(labels, {8}).to(device));
    if (c.capture_at >= 0 && step > c.capture_at) {
      graph.replay();
      continue;
    }
    if (step == c.capture_at) graph.capture_begin(device.index);
    opt->zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(device.type, fp16 ? DType::f16 : DType::bf16,
                       c.precision == "amp-fp16" || c.precision == "amp-bf16");
      loss = ops::cross_entropy((*model)(x), y);
    }
    scaler.scale(loss).backward();
    if (step == c.bad_step) {
      Tensor g = opt->params()[0].grad();
      g.copy_(Tensor::full(g.shape(), c.bad_value, g.dtype(), device));
    }
    if (c.clip) {
      scaler.unscale_(*opt);
      nn::clip_grad_norm_(opt->params(), 0.5);
    }
    scaler.step(*opt);
    scaler.update();
    if (step == c.capture_at) {
      graph.capture_end();
      out.nodes = graph.nodes();
      graph.replay();  // the capture ran nothing: this is the captured step
    }
  }
  if (count_copies) *count_copies = kernels::device_to_host_copies() - copies_before;
  for (const Tensor& p : model->parameters()) out.state.push_back(bytes_of(p.to(Device::cpu())));
  for (const auto& [name, b] : model->named_buffers()) out.state.push_back(bytes_of(b.to(Device::cpu())));
  for (size_t i = 0; i < opt->params().size(); ++i)
    if (opt->master(i).defined()) out.state.push_back(bytes_of(opt->master(i).to(Device::cpu())));
  out.scale = scaler.get_scale();
  out.skipped = scaler.num_skipped_steps();
  out.steps = opt->steps();
  return out;
}

void expect_same(const Loop& c) {
  SCOPED_TRACE(c.model + " " + c.precision + " " + c.optimizer + (c.clip ? " clip" : "") +
               (c.bad_step >= 0 ? " bad " + std::to_string(c.bad_value) : ""));
  const Outcome cpu = run(c, Device::cpu()), fenced = run(c, Device::fenced());
  ASSERT_EQ(cpu.state.size(), fenced.state.size());
  for (size_t i = 0; i < cpu.state.size(); ++i) EXPECT_EQ(cpu.state[i], fenced.state[i]) << "tensor " << i;
  EXPECT_EQ(cpu.scale, fenced.scale);
  EXPECT_EQ(cpu.skipped, fenced.skipped);
  EXPECT_EQ(cpu.steps, fenced.steps);
  const int64_t expected_skips = c.precision == "amp-fp16" && c.bad_step >= 0 ? 1 : 0;
  EXPECT_EQ(fenced.skipped, expected_skips);
  EXPECT_EQ(fenced.steps, kSteps - expected_skips);
}

}  // namespace

TEST(TrainDevices, LoopsOnTheFencedDeviceAreBitIdenticalToTheCpu) {
  for (const char* model : {"mlp", "cnn"})
    for (const char* precision : {"fp32", "amp-bf16", "amp-fp16"})
      for (const char* optimizer : {"adamw", "sgd"}) expect_same({model, precision, optimizer, /*clip=*/true});
  expect_same({"mlp", "bf16-sr", "sgd"});
  expect_same({"cnn", "bf16-sr", "adamw", true});
}

TEST(TrainDevices, InjectedInfAndNaNSkipTheSameStepsAndBackOffTheSameScale) {
  for (double bad : {INFINITY, -INFINITY, NAN})
    for (const char* optimizer : {"adamw", "sgd"}) {
      expect_same({"mlp", "amp-fp16", optimizer, /*clip=*/false, /*bad_step=*/3, bad});
      expect_same({"cnn", "amp-fp16", optimizer, /*clip=*/true, /*bad_step=*/2, bad});
    }
  // The scale really backed off: growth every 2 finite steps from 1024, halved at the bad step.
  const Outcome o = run({"mlp", "amp-fp16", "adamw", false, 3, INFINITY}, Device::fenced());
  EXPECT_EQ(o.scale, 2048.0);  // steps 0,1: x2 (2048); 2: -; 3: inf (1024); 4,5: x2 (2048)
}

TEST(TrainDevices, AnAmpFp16StepMakesNoDeviceToHostCopy) {
  for (const char* model : {"mlp", "cnn"}) {
    int64_t copies = -1;
    run({model, "amp-fp16", "adamw", /*clip=*/true, /*bad_step=*/3}, Device::fenced(), &copies);
    EXPECT_EQ(copies, 0) << model;
  }
  // The counter counts: one item() is one copy.
  const int64_t before = kernels::device_to_host_copies();
  (void)Tensor::scalar(1.0, DType::f32, Device::fenced()).item();
  EXPECT_EQ(kernels::device_to_host_copies() - before, 1);
}

// On a GPU. A training step captured into a CUDA graph: the capture fails on any wait for the GPU
// (a .item(), a host copy), so capturing is the test that a step never stops the GPU, and replays
// must give every bit that eager steps give (the scale, found_inf, the step counts, the lr and the
// stochastic-rounding stream, keyed by the device's step count, all live on the device; dropout
// is refused in a capture, below). The graph's node count is the step's launches.
TEST(CudaTrain, CapturedStepsReplayBitIdenticalToEagerSteps) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  const std::vector<Loop> loops = {
      {"mlp", "fp32", "adamw", true},    {"mlp", "amp-bf16", "sgd", true}, {"mlp", "amp-fp16", "adamw", true},
      {"cnn", "fp32", "sgd", true},      {"cnn", "amp-bf16", "adamw"},     {"cnn", "amp-fp16", "sgd", true},
      {"mlp", "bf16-sr", "adamw", true}, {"cnn", "bf16-sr", "sgd"},
  };
  for (const Loop& c : loops) {
    SCOPED_TRACE(c.model + " " + c.precision + " " + c.optimizer + (c.clip ? " clip" : ""));
    Loop captured = c;
    captured.capture_at = 2;
    const Outcome eager = run(c, Device::cuda()), graph = run(captured, Device::cuda());
    ASSERT_EQ(eager.state.size(), graph.state.size());
    for (size_t i = 0; i < eager.state.size(); ++i) EXPECT_EQ(eager.state[i], graph.state[i]) << "tensor " << i;
    EXPECT_EQ(eager.scale, graph.scale);
    EXPECT_EQ(eager.skipped, graph.skipped);
    EXPECT_EQ(eager.steps, graph.steps);
    EXPECT_GT(graph.nodes.kernels, 0);
    std::printf("[ kernels  ] %s %s %s%s: %lld kernels, %lld memcpys, %lld memsets, %lld other nodes per step\n",
                c.model.c_str(), c.precision.c_str(), c.optimizer.c_str(), c.clip ? " clip" : "",
                static_cast<long long>(graph.nodes.kernels), static_cast<long long>(graph.nodes.memcpys),
                static_cast<long long>(graph.nodes.memsets), static_cast<long long>(graph.nodes.other));
  }
}

// The smallest captured work in which a kernel of ours reads what cuBLASLt wrote: a product into
// the graph's pool, then a sum over it, replayed twice: the eager values, in f32, bf16 and f16. Also
// run.sh initcheck-probe's first case (docs/gpu.md, 2026-12-04: initcheck's reports in the
// captured steps all read buffers a replayed cuBLASLt kernel wrote; this says whether it reports
// them here too, where nothing else runs).
TEST(CudaTrain, AReplayedProductReadByOurKernelGivesTheEagerValues) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Generator gen(7);
    const Tensor a = Tensor::uniform({24, 40}, gen, -1, 1).to(t).to(Device::cuda());
    const Tensor b = Tensor::uniform({40, 56}, gen, -1, 1).to(t).to(Device::cuda());
    const Tensor eager = ops::sum(ops::matmul(a, b), {0});
    cuda::Graph graph;
    graph.capture_begin();
    const Tensor captured = ops::sum(ops::matmul(a, b), {0});
    graph.capture_end();
    for (int replay = 0; replay < 2; ++replay) {
      graph.replay();
      EXPECT_EQ(bytes_of(captured), bytes_of(eager)) << dtype_name(t) << ", replay " << replay;
    }
  }
}

// The same without a graph: products (a plain one and the ReLU + bias epilogue of the mlp's first
// layer) written by eager cuBLASLt calls into memory nothing wrote before (every tensor is kept, so
// the caching allocator hands out fresh bytes), then summed by our kernel, in f32, bf16 and f16:
// the CPU's sums. run.sh initcheck-probe's second case: whether initcheck sees cuBLASLt's eager
// 16-bit writes (2026-12-04, fourth session: its only reports outside graphs were reads of
// 16-bit products in the first training of a process, docs/gpu.md).
TEST(CudaTrain, EagerProductsInFreshMemoryReadByOurKernelGiveTheCpuSums) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  std::vector<Tensor> kept;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Generator gen(7);
    const Tensor a = Tensor::uniform({8, 64}, gen, -1, 1).to(t);
    const Tensor w = Tensor::uniform({32, 64}, gen, -1, 1).to(t);
    const Tensor bias = Tensor::uniform({32}, gen, -1, 1).to(t);
    const Tensor b = Tensor::uniform({64, 40}, gen, -1, 1).to(t);
    const Tensor da = a.to(Device::cuda()), dw = w.to(Device::cuda()), dbias = bias.to(Device::cuda()),
                 db = b.to(Device::cuda());
    const Tensor plain = ops::matmul(da, db), fused = ops::linear_relu(da, dw, dbias);
    const Tensor plain_sum = ops::sum(plain, {0}), fused_sum = ops::sum(fused, {0});
    // Our sums of what cuBLASLt wrote are the CPU's sums of the same values copied back, within
    // one rounding of the sum's dtype (the two add in different orders).
    const double tol = t == DType::f32 ? 1e-5 : 1e-2;
    for (const auto& [product, sum] : {std::pair{plain, plain_sum}, std::pair{fused, fused_sum}}) {
      const Tensor cpu = ops::sum(product.to(Device::cpu()), {0});
      double largest = 0;
      for (double v : cpu.to_vector_f64()) largest = std::max(largest, std::fabs(v));
      EXPECT_LE(mixprec::testing::error_of(sum.to(Device::cpu()), cpu).max, tol * largest) << dtype_name(t);
    }
    kept.insert(kept.end(), {da, dw, dbias, db, plain, fused, plain_sum, fused_sum});
  }
}

TEST(CudaTrain, InjectedInfAndNaNSkipTheSameStepsAndBackOffTheSameScaleAsTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  for (double bad : {INFINITY, -INFINITY, NAN})
    for (const char* model : {"mlp", "cnn"}) {
      const Loop c{model, "amp-fp16", "adamw", /*clip=*/true, /*bad_step=*/3, bad};
      SCOPED_TRACE(std::string(model) + " bad " + std::to_string(bad));
      const Outcome cpu = run(c, Device::cpu()), gpu = run(c, Device::cuda());
      EXPECT_EQ(gpu.skipped, 1);
      EXPECT_EQ(gpu.skipped, cpu.skipped);
      EXPECT_EQ(gpu.steps, cpu.steps);
      EXPECT_EQ(gpu.scale, cpu.scale);
    }
}

TEST(CudaTrain, AWaitForTheGpuInACapturedStepFailsTheCapture) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  const Tensor t = Tensor::full({4}, 1.5, DType::f32, Device::cuda());
  {
    cuda::Graph g;
    g.capture_begin();
    const Tensor s = ops::sum(t);
    EXPECT_THROW((void)s.item(), Error);  // a copy to the host that waits
    try {
      g.capture_end();
      ADD_FAILURE() << "capture_end accepted a capture that waited for the GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("capture"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(g.captured());
  }
  EXPECT_EQ(ops::sum(t).item(), 6.0);  // the stream works on, eagerly
}

// Dropout in a CUDA graph draws through the graph's device offsets (PyTorch's Philox state for
// graphs): each replay draws the masks the same eager call would, a replay after eager draws picks
// up where they left the generator, and the generator's host offset ends where eager calls leave
// it. Attention's dropout is still refused in a capture, with one line (docs/gpu.md).
TEST(CudaTrain, DropoutInACaptureDrawsWhatEagerCallsDraw) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::unavailable_reason();
  const Tensor x = Tensor::full({1000}, 1.0, DType::f32, Device::cuda());
  Generator eager(3), captured(3);
  auto masks = [&](Generator& gen) {  // one "step": two draws of different sizes (alignment moves)
    const Tensor a = ops::dropout(x, 0.5, /*training=*/true, &gen);
    const Tensor b = ops::dropout(ops::slice(x, 0, 0, 13), 0.25, /*training=*/true, &gen);
    return std::make_pair(a, b);
  };
  cuda::Graph g;
  g.capture_begin();
  const auto out = masks(captured);
  g.capture_end();
  EXPECT_EQ(captured.offset(), eager.offset()) << "the capture moved the generator";
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay == 2) {  // eager draws between replays, from both generators
      (void)ops::dropout(x, 0.5, true, &eager);
      (void)ops::dropout(x, 0.5, true, &captured);
    }
    g.replay();
    const auto want = masks(eager);
    EXPECT_EQ(bytes_of(out.first), bytes_of(want.first));
    EXPECT_EQ(bytes_of(out.second), bytes_of(want.second));
    EXPECT_EQ(captured.offset(), eager.offset());
  }
  EXPECT_NE(bytes_of(out.first), bytes_of(masks(eager).first));  // masks do change from step to step

  const Tensor q = Tensor::full({1, 1, 4, 8}, 0.5, DType::f32, Device::cuda());
  cuda::Graph h;
  h.capture_begin();
  (void)ops::add(q, q);  // captured: the graph is not empty
  try {
    (void)ops::scaled_dot_product_attention(q, q, q, {.dropout = 0.5, .gen = &captured});
    ADD_FAILURE() << "attention's dropout was captured";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("attention dropout in a CUDA graph capture"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  h.capture_end();  // what was captured before the refusal is a valid graph
}

TEST(TrainDevices, ErrorAtMinScaleSurfacesWhenTheStateIsRead) {
  nn::Linear lin(4, 2);
  lin.to(Device::fenced());
  optim::SGD opt(lin.parameters(), {.lr = 0.1});
  amp::GradScaler s({.init_scale = 2, .min_scale = 2, .error_at_min_scale = true});
  const Tensor x = Tensor::ones({3, 4}).to(Device::fenced());
  s.scale(ops::sum(lin(x))).backward();
  Tensor g = opt.params()[0].grad();
  g.copy_(Tensor::full(g.shape(), INFINITY, g.dtype(), Device::fenced()));
  s.step(opt);
  EXPECT_NO_THROW(s.update());  // on a device: recorded there, not read
  EXPECT_THROW(s.get_scale(), Error);
  EXPECT_EQ(s.get_scale(), 2.0);  // reported once; the scale stayed
}

// ------------------------------------------------------------- fast kernels vs the reference

namespace {

struct KernelRig {
  std::vector<kernels::OptimParam> params;
  std::vector<Tensor> keep;
  kernels::OptimStep step;
};

// Three parameters of dtype t (5000 elements: blocks, vector lanes and a tail; 37; and 20011, whose
// blocks put the step on the fast kernels' parallel path over all parameters' blocks), with
// gradients, states and (for 16-bit) a master or stochastic rounding.
KernelRig make_rig(DType t, bool master, bool stochastic, bool scaled) {
  Generator gen(9);
  KernelRig r;
  int64_t index = 0;
  for (int64_t n : {5000, 37, 20011}) {
    kernels::OptimParam p;
    p.param = Tensor::randn({n}, gen, t);
    p.grad = Tensor::randn({n}, gen, t == DType::f16 && scaled ? DType::f32 : t, scaled ? 512.0 : 1.0);
    if (is_half(t) && master) p.master = p.param.to(DType::f32);
    const DType st = t == DType::f64 ? DType::f64 : DType::f32;
    p.state1 = Tensor::randn({n}, gen, st, 0.1);
    p.state2 = Tensor::uniform({n}, gen, 0.0, 1e-4, st);
    p.lr = Tensor::scalar(0.01, DType::f64);
    p.weight_decay = 0.05;
    p.index = uint64_t(index++);
    r.params.push_back(p);
  }
  r.step = {state_i64(3),
            Tensor::zeros({}),
            scaled ? Tensor::scalar(512.0) : Tensor(),
            stochastic,
            17,
            Tensor::zeros({2}, DType::i64)};
  return r;
}

std::vector<std::vector<uint8_t>> bytes(const KernelRig& r, const Tensor& ready) {
  std::vector<std::vector<uint8_t>> out{bytes_of(r.step.step), bytes_of(r.step.rounding), bytes_of(ready)};
  for (const kernels::OptimParam& p : r.params)
    for (const Tensor* t : {&p.param, &p.master, &p.state1, &p.state2})
      if (t->defined()) out.push_back(bytes_of(*t));
  return out;
}

}  // namespace

TEST(OptimKernels, FastUpdatesAreBitIdenticalToTheReference) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (bool master : {true, false})
      for (bool scaled : {false, true})
        for (const char* rule : {"sgd", "adamw"}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " " + rule + (master ? " master" : " sr") +
                       (scaled ? " scaled" : ""));
          KernelRig a = make_rig(t, master, !master, scaled), b = make_rig(t, master, !master, scaled);
          const Tensor ra = Tensor::zeros({3}, DType::u8), rb = Tensor::zeros({3}, DType::u8);
          for (int k = 0; k < 2; ++k) {  // the first SGD step copies d into the buffer, the second uses it
            if (std::string(rule) == "sgd") {
              kernels::cpu::sgd_step(a.params, {0.9, 0.1, false, ra}, a.step);
              kernels::ref::sgd_step(b.params, {0.9, 0.1, false, rb}, b.step);
            } else {
              kernels::cpu::adamw_step(a.params, {0.9, 0.999, 1e-8}, a.step);
              kernels::ref::adamw_step(b.params, {0.9, 0.999, 1e-8}, b.step);
            }
          }
          EXPECT_EQ(bytes(a, ra), bytes(b, rb));
          EXPECT_EQ(state_to_i64(a.step.step), 5);
          // A set found_inf changes nothing.
          const auto before = bytes(a, ra);
          a.step.found_inf.fill_(1);
          kernels::cpu::adamw_step(a.params, {0.9, 0.999, 1e-8}, a.step);
          kernels::cpu::sgd_step(a.params, {0.9, 0.1, true, ra}, a.step);
          EXPECT_EQ(bytes(a, ra), before);
        }
}

TEST(OptimKernels, FastUnscaleIsBitIdenticalToTheReference) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (bool bad : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (bad ? " with inf" : ""));
      Generator gen(4);
      const Tensor src = Tensor::randn({9001}, gen, t, 1000.0);
      if (bad) src.slice(0, 8999, 9000).fill_(INFINITY);
      Tensor da = Tensor::empty({9001}, t == DType::f16 ? DType::f32 : t), db = da.clone();
      Tensor fa = Tensor::zeros({}), fb = Tensor::zeros({});
      const Tensor scale = Tensor::scalar(1024.0);
      kernels::cpu::unscale_and_check({src}, {da}, scale, fa);
      kernels::ref::unscale_and_check({src}, {db}, scale, fb);
      EXPECT_EQ(bytes_of(da), bytes_of(db));
      EXPECT_EQ(fa.item(), bad ? 1.0 : 0.0);
      EXPECT_EQ(fb.item(), fa.item());
    }
}
