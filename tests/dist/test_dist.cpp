// Data parallelism over MPI, run by ctest under `mpirun -np 2` (each rank runs every test; the
// single-process reference is computed on each rank too): the collectives, 2 ranks x B/2 against
// 1 process x B (losses, gradient norms, bit-identical replicas), GradScaler agreement when one
// rank overflows, and ZeRO-1 (state halved, same losses). Also passes as one process (size 1).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/clip.h"
#include "mixprec/dist.h"
#include "mixprec/error.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/random.h"

namespace mixprec {
namespace {

dist::ProcessGroup& pg() { return dist::ProcessGroup::world(); }

// FNV-1a over the bytes of every parameter: equal hashes on every rank = bit-identical replicas.
uint64_t params_hash(const nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : m.parameters()) {
    const Tensor c = p.contiguous();
    const auto* b = static_cast<const unsigned char*>(c.host_data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// Whether every rank holds the same value (gathered as its raw bits).
bool same_on_all_ranks(uint64_t v) {
  int64_t bits;
  std::memcpy(&bits, &v, 8);
  const std::vector<int64_t> all =
      pg().all_gather(Tensor::from_vector(std::vector<int64_t>{bits}, {1})).to_vector_i64();
  for (int64_t a : all)
    if (a != all[0]) return false;
  return true;
}
bool same_on_all_ranks(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return same_on_all_ranks(bits);
}

// 784-64-10, initialised from `seed` (each rank passes its own seed to DataParallel runs: the
// constructor's broadcast must make them equal).
std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  default_generator().manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 10));
}

// A fixed synthetic problem: a batch of `rows` images and labels for step s.
struct Batch {
  Tensor x, y;
};
Batch batch(int step, int64_t rows, int64_t first_row = 0, int64_t count = -1) {
  Generator g(1000 + uint64_t(step));
  Tensor x = Tensor::randn({rows, 784}, g);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  const std::vector<float> xv = x.to_vector();
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = int64_t(std::fabs(xv[size_t(r * 784)]) * 7) % 10;
  Tensor y = Tensor::from_vector(labels, {rows});
  if (count < 0) return {x, y};
  return {x.slice(0, first_row, first_row + count).contiguous(), y.slice(0, first_row, first_row + count).contiguous()};
}

// This rank's rows of a global batch of `global` rows.
Batch shard(int step, int64_t global) {
  const int64_t per = global / pg().size();
  return batch(step, global, per * pg().rank(), per);
}

// The global mean of each rank's mean loss (equal shards: the mean over the global batch).
double global_loss(const Tensor& local) {
  Tensor l = Tensor::scalar(local.item(), DType::f64);
  pg().all_reduce(l, dist::ReduceOp::avg);
  return l.item();
}

TEST(ProcessGroup, Collectives) {
  const int r = pg().rank(), n = pg().size();
  Tensor t = Tensor::from_vector(std::vector<float>{float(r + 1), -1.5f, float(10 * r)}, {3});
  Tensor s = t.clone(), a = t.clone(), m = t.clone(), b = t.clone();
  pg().all_reduce(s, dist::ReduceOp::sum);
  pg().all_reduce(a, dist::ReduceOp::avg);
  pg().all_reduce(m, dist::ReduceOp::max);
  const float sum_ranks = float(n * (n + 1) / 2), sum_10r = float(10 * n * (n - 1) / 2);
  EXPECT_EQ(s.to_vector(), (std::vector<float>{sum_ranks, -1.5f * float(n), sum_10r}));
  EXPECT_EQ(a.to_vector(), (std::vector<float>{sum_ranks / float(n), -1.5f, sum_10r / float(n)}));
  EXPECT_EQ(m.to_vector(), (std::vector<float>{float(n), -1.5f, float(10 * (n - 1))}));
  // bf16 wire: each value rounded to bf16 (1/3 is not a bf16 number), sums carried in f32.
  Tensor third = Tensor::full({4}, 1.0 / 3.0);
  pg().all_reduce(third, dist::ReduceOp::sum, dist::WireDType::bf16);
  for (float v : third.to_vector()) EXPECT_NEAR(v, float(n) / 3.0f, float(n) * 0.004f);
  if (n > 1) {
    EXPECT_NE(third.to_vector()[0], float(n) * (1.0f / 3.0f));  // really went through bf16
  }
  pg().broadcast(b, n - 1);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{float(n), -1.5f, float(10 * (n - 1))}));
  const Tensor g = pg().all_gather(Tensor::from_vector(std::vector<int64_t>{r, 7}, {2}));
  ASSERT_EQ(g.shape(), (Shape{n, 2}));
  for (int k = 0; k < n; ++k) EXPECT_EQ(g.to_vector_i64()[size_t(2 * k)], k);
  pg().barrier();
  Tensor bad = Tensor::zeros({2}, DType::bf16);
  EXPECT_THROW(pg().all_reduce(bad), Error);
}

// Under Open MPI the group asks libnbc for its ring all-reduce before MPI_Init (process_group.cpp,
// prefer_ring_allreduce; the default, a binomial tree below 4 ranks, adds every bucket on rank 0):
// the MPI library's own value of the setting, read through MPI_T.
TEST(ProcessGroup, OpenMpiRunsTheRingAllReduce) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) GTEST_SKIP() << "not started by Open MPI's launcher";
  ASSERT_GE(pg().size(), 1);  // the group (and MPI) made first, as a program's first use does
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int index = -1, count = 0, value = -1;
  ASSERT_EQ(MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index), MPI_SUCCESS);
  MPI_T_cvar_handle handle{};
  ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
  ASSERT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
  MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  EXPECT_EQ(value, 1) << "1: ring";
}

// The must-show: 2 ranks x B/2 against 1 process x B, fp32, 50 steps of SGD with momentum.
void run_equivalence(dist::WireDType wire, double loss_rtol) {
  constexpr int kSteps = 50;
  constexpr int64_t kBatch = 64;
  std::vector<double> ref_loss, ref_norm;
  double max_rel = 0;
  auto ref = mlp(100);  // rank 0's initial weights
  {
    optim::SGD opt(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int s = 0; s < kSteps; ++s) {
      const Batch b = batch(s, kBatch);
      opt.zero_grad();
      Tensor loss = ops::cross_entropy((*ref)(b.x), b.y);
      loss.backward();
      ref_loss.push_back(loss.item());
      ref_norm.push_back(nn::grad_norm(ref->parameters()).item());
      opt.step();
    }
  }
  auto model = mlp(100 + uint64_t(pg().rank()));  // different on each rank until DataParallel
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  dist::DataParallel dp(*model, opt, {.reduce_dtype = wire, .bucket_bytes = 64 << 10});
  EXPECT_TRUE(same_on_all_ranks(params_hash(*model)));
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = shard(s, kBatch);
    opt.zero_grad();
    Tensor loss = ops::cross_entropy((*model)(b.x), b.y);
    loss.backward();
    const double l = global_loss(loss);
    EXPECT_NEAR(l, ref_loss[size_t(s)], loss_rtol * std::fabs(ref_loss[size_t(s)])) << "step " << s;
    max_rel = std::max(max_rel, std::fabs(l - ref_loss[size_t(s)]) / std::fabs(ref_loss[size_t(s)]));
    dp.sync_gradients();
    // After the all-reduce every rank holds the same gradients: the local norm is the global one.
    const double norm = nn::grad_norm(model->parameters()).item();
    EXPECT_TRUE(same_on_all_ranks(norm)) << "step " << s;
    if (wire == dist::WireDType::f32) {
      EXPECT_NEAR(norm, ref_norm[size_t(s)], 1e-5 * ref_norm[size_t(s)]);
    }
    dp.step();
    if (s % 10 == 9) {
      EXPECT_TRUE(same_on_all_ranks(params_hash(*model))) << "after step " << s;
    }
  }
  if (pg().rank() == 0)
    std::printf(
        "[ equal    ] %d ranks x batch %lld against 1 x %lld, %s wire, %d steps: largest relative loss "
        "difference %.2e (step 0: %.6f, step %d: %.6f)\n",
        pg().size(), static_cast<long long>(kBatch / pg().size()), static_cast<long long>(kBatch),
        dist::wire_dtype_name(wire), kSteps, max_rel, ref_loss[0], kSteps - 1, ref_loss.back());
  if (pg().size() > 1) {
    EXPECT_GT(dp.stats().buckets_in_backward, 0);  // launched from backward, not all at the end
    EXPECT_EQ(dp.stats().wire_bytes, kSteps * model->num_parameters() * (wire == dist::WireDType::bf16 ? 2 : 4));
  }
}

TEST(DataParallel, TwoRanksHalfBatchEqualsOneProcessFullBatch) { run_equivalence(dist::WireDType::f32, 1e-5); }

// bf16 on the wire: half the bytes, gradients rounded once per hop; the losses follow closely.
TEST(DataParallel, Bf16WireFollowsTheReference) { run_equivalence(dist::WireDType::bf16, 2e-3); }

// Micro-batches (set_grad_sync): two backward passes per step, reduced once after the last; the
// gradients are the one-process full batch's.
TEST(DataParallel, MicroBatchesReduceOnceAfterTheLast) {
  auto ref = mlp(100);
  const Batch full = batch(0, 64);
  ops::cross_entropy((*ref)(full.x), full.y).backward();
  auto model = mlp(100 + uint64_t(pg().rank()));
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  dist::DataParallel dp(*model, opt);
  const Batch b = shard(0, 64);
  const int64_t half = b.x.size(0) / 2;
  for (int part = 0; part < 2; ++part) {
    dp.set_grad_sync(part == 1);
    const Tensor x = b.x.slice(0, part * half, (part + 1) * half), y = b.y.slice(0, part * half, (part + 1) * half);
    ops::affine(ops::cross_entropy((*model)(x), y), 0.5, 0.0).backward();
    EXPECT_EQ(dp.stats().buckets_in_backward > 0, part == 1 && pg().size() > 1) << "part " << part;
  }
  dp.sync_gradients();
  const std::vector<Tensor> got = model->parameters(), want = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    const std::vector<float> g = got[i].grad().to_vector(), w = want[i].grad().to_vector();
    for (size_t k = 0; k < g.size(); ++k) ASSERT_NEAR(g[k], w[k], 1e-6 + 1e-5 * std::fabs(w[k])) << i << " " << k;
  }
  // Without set_grad_sync(false) a second backward before the step is refused.
  ops::cross_entropy((*model)(b.x), b.y).backward();
  EXPECT_THROW(ops::cross_entropy((*model)(b.x), b.y).backward(), Error);
  dp.sync_gradients();
}

// amp-fp16 with dynamic loss scaling: an inf injected into one rank's gradient after the
// all-reduce (only that rank sees it) must skip the step on every rank and keep the scales equal.
TEST(DataParallel, OverflowOnOneRankSkipsTheStepOnAll) {
  constexpr int kSteps = 6, kInjectAt = 3;
  auto model = mlp(11);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  dist::DataParallel dp(*model, opt);
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
  const bool injector = pg().rank() == pg().size() - 1;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = shard(s, 32);
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(DType::f16);
      loss = ops::cross_entropy((*model)(b.x), b.y);
    }
    scaler.scale(loss).backward();
    dp.sync_gradients();
    const uint64_t before = params_hash(*model);
    if (s == kInjectAt && injector) model->parameters()[0].grad().data<float>()[5] = INFINITY;
    dp.step(scaler);
    const bool stepped = scaler.stepped(opt);
    EXPECT_EQ(stepped, s != kInjectAt) << "step " << s;
    EXPECT_EQ(params_hash(*model) == before, s == kInjectAt) << "step " << s;
    scaler.update();
    EXPECT_TRUE(same_on_all_ranks(scaler.get_scale())) << "step " << s;
    EXPECT_TRUE(same_on_all_ranks(params_hash(*model))) << "step " << s;
  }
  EXPECT_EQ(scaler.num_skipped_steps(), 1);
  // Growth every 2 finite steps: 1024 -> 2048 (steps 0,1) -> backoff 1024 (3) -> 2048 (4,5).
  EXPECT_EQ(scaler.get_scale(), 2048.0);
}

// The control: the same injection without the MAX reduction lets the ranks disagree, which is
// what the reduction is for (run only with several ranks: alone there is nobody to disagree with).
TEST(DataParallel, WithoutTheReductionRanksWouldDisagree) {
  if (pg().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto model = mlp(12);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  dist::DataParallel dp(*model, opt);
  amp::GradScaler scaler({.init_scale = 1024.0});
  const Batch b = shard(0, 32);
  scaler.scale(ops::cross_entropy((*model)(b.x), b.y)).backward();
  dp.sync_gradients();
  if (pg().rank() == 1) model->parameters()[0].grad().data<float>()[5] = INFINITY;
  scaler.step(opt);  // straight to the scaler: no attach
  EXPECT_EQ(scaler.stepped(opt), pg().rank() != 1);
  EXPECT_FALSE(same_on_all_ranks(params_hash(*model)));
}

// ZeRO-1: the optimizer state of each rank is 1/size of the whole; the run is the unsharded one,
// bit for bit (each element's update is the same arithmetic, only on another rank). For bf16
// parameters (the half presets) the shard holds the f32 master copies too.
void run_zero1(DType param_dtype) {
  constexpr int kSteps = 20;
  auto state_bytes = [] { return allocator::stats().live_bytes[size_t(MemCategory::optimizer_state)]; };
  std::vector<double> losses[2];
  int64_t state[2] = {0, 0};
  for (int zero : {0, 1}) {
    auto model = mlp(21);
    model->to(param_dtype);
    const int64_t before = state_bytes();
    optim::AdamW opt(model->parameters(), {.lr = 1e-3});
    dist::DataParallel dp(*model, opt, {.zero = zero});
    for (int s = 0; s < kSteps; ++s) {
      const Batch b = shard(s, 64);
      opt.zero_grad();
      Tensor loss = ops::cross_entropy((*model)(b.x.to(param_dtype)), b.y);
      loss.backward();
      losses[zero].push_back(global_loss(loss));
      dp.step();
      if (s == 0) state[zero] = state_bytes() - before;
    }
    EXPECT_TRUE(same_on_all_ranks(params_hash(*model)));
    if (zero == 1) {
      EXPECT_EQ(dp.optimizer().steps(), kSteps);
      EXPECT_THROW(opt.step(), Error);  // its state went to the shard
    }
  }
  // AdamW: exp_avg + exp_avg_sq (8 bytes per parameter element), + a 4-byte f32 master of a bf16
  // parameter; split by flat elements (64-byte rounding of each piece aside).
  const int64_t whole = (param_dtype == DType::f32 ? 8 : 12) * mlp(0)->num_parameters();
  EXPECT_NEAR(double(state[0]), double(whole), 512.0);
  EXPECT_NEAR(double(state[1]), double(whole) / pg().size(), 512.0);
  if (pg().rank() == 0)
    std::printf("[ zero-1   ] %s parameters, %d ranks: optimizer state %lld bytes per rank, unsharded %lld\n",
                std::string(dtype_name(param_dtype)).c_str(), pg().size(), static_cast<long long>(state[1]),
                static_cast<long long>(state[0]));
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(losses[1][size_t(s)], losses[0][size_t(s)]) << "step " << s;
}

TEST(DataParallel, Zero1HalvesOptimizerStateAndKeepsTheLosses) { run_zero1(DType::f32); }
TEST(DataParallel, Zero1ShardsMasterWeightsOfBf16Parameters) { run_zero1(DType::bf16); }

// A checkpoint of a ZeRO-1 run holds the whole optimizer state (gathered), equal to the unsharded
// run's, and resumes on a sharded run bit for bit.
TEST(DataParallel, Zero1StateConsolidatesAndResumes) {
  constexpr int kSteps = 12, kCut = 6;
  auto run = [](nn::Module& model, optim::Optimizer& opt, dist::DataParallel& dp, int from, int to) {
    std::vector<double> losses;
    for (int s = from; s < to; ++s) {
      const Batch b = shard(s, 64);
      opt.zero_grad();
      Tensor loss = ops::cross_entropy(model(b.x), b.y);
      loss.backward();
      losses.push_back(global_loss(loss));
      dp.step();
    }
    return losses;
  };
  auto copy = [](const StateDict& sd) {
    StateDict out;
    for (const auto& [k, t] : sd) out.emplace_back(k, t.clone());
    return out;
  };
  // The reference: unsharded, its state at kCut, then on to kSteps.
  auto ref = mlp(31);
  optim::AdamW ref_opt(ref->parameters(), {.lr = 1e-3});
  dist::DataParallel ref_dp(*ref, ref_opt);
  run(*ref, ref_opt, ref_dp, 0, kCut);
  const StateDict want = copy(ref_dp.optimizer_state_dict());
  const std::vector<double> want_losses = run(*ref, ref_opt, ref_dp, kCut, kSteps);
  // Sharded to kCut; its gathered state is the reference's, key for key and bit for bit.
  StateDict model_sd, opt_sd;
  {
    auto model = mlp(31);
    optim::AdamW opt(model->parameters(), {.lr = 1e-3});
    dist::DataParallel dp(*model, opt, {.zero = 1});
    run(*model, opt, dp, 0, kCut);
    opt_sd = copy(dp.optimizer_state_dict());
    model_sd = copy(model->state_dict());
  }
  ASSERT_EQ(opt_sd.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(opt_sd[k].first, want[k].first);
    EXPECT_EQ(opt_sd[k].second.shape(), want[k].second.shape()) << want[k].first;
    EXPECT_EQ(opt_sd[k].second.to_vector_f64(), want[k].second.to_vector_f64()) << want[k].first;
  }
  // Resumed: load into a fresh optimizer, shard it, go on: the reference's losses.
  auto model = mlp(99);
  model->load_state_dict(model_sd);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  opt.load_state_dict(opt_sd);
  dist::DataParallel dp(*model, opt, {.zero = 1});
  EXPECT_EQ(dp.optimizer().steps(), kCut);
  const std::vector<double> losses = run(*model, opt, dp, kCut, kSteps);
  EXPECT_EQ(losses, want_losses);
}

// BatchNorm normalises with each rank's own batch statistics (as DDP); the running statistics are
// rank 0's after every step (broadcast_buffers), so eval and checkpoints agree. Without the
// broadcast they drift apart: the control.
TEST(DataParallel, BatchNormRunningStatsFollowRankZero) {
  for (bool broadcast : {true, false}) {
    default_generator().manual_seed(3);
    nn::Sequential model(nn::Conv2d(1, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(),
                         nn::Linear(4 * 28 * 28, 10));
    optim::SGD opt(model.parameters(), {.lr = 0.01});
    dist::DataParallel dp(model, opt, {.broadcast_buffers = broadcast});
    for (int s = 0; s < 3; ++s) {
      const Batch b = shard(s, 16);
      opt.zero_grad();
      ops::cross_entropy(model(b.x.reshape({-1, 1, 28, 28})), b.y).backward();
      dp.step();
    }
    uint64_t h = 0;
    for (const auto& [name, t] : model.named_buffers())
      for (float v : t.to_vector()) h = h * 31 + uint64_t(std::fabs(v) * 1e6);
    EXPECT_EQ(same_on_all_ranks(h), broadcast || pg().size() == 1) << "broadcast_buffers " << broadcast;
    EXPECT_TRUE(same_on_all_ranks(params_hash(model)));
  }
}

}  // namespace
}  // namespace mixprec
