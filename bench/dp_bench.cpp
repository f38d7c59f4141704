// Data-parallel timing probe (a benchmark, not a test): train steps of the mlp (784-1024-1024-10)
// or the cnn (--channels 420,1000) at one global batch on however many ranks it is started with,
// and print one JSON object from rank 0: global samples/s, and what the gradient all-reduce costs
// with and without overlapping backward. bench/dp_scaling.sh runs it on 1 and 2 ranks.
//   mpirun -np 2 build-cpu/dp_bench --model mlp --batch 512 --steps 20
// Synthetic inputs (random images, fixed labels): the speed does not depend on the values.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mixprec/autocast.h"
#include "mixprec/dist.h"
#include "mixprec/error.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/random.h"

using namespace mixprec;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model = "mlp";
  int64_t batch = 512;  // global
  int steps = 20, warmup = 3;
  dist::WireDType wire = dist::WireDType::f32;
  int64_t bucket_kb = 1024;
  bool autocast = false;  // amp-bf16
  int zero = 0;           // 1: ZeRO-1 (optimizer state sharded)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    MIXPREC_CHECK(i + 1 < argc, "dp_bench: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--warmup")
      a.warmup = std::stoi(v);
    else if (k == "--reduce-dtype")
      a.wire = v == "bf16" ? dist::WireDType::bf16 : dist::WireDType::f32;
    else if (k == "--bucket-kb")
      a.bucket_kb = std::stoll(v);
    else if (k == "--zero")
      a.zero = std::stoi(v);
    else if (k == "--autocast")
      a.autocast = v == "bf16";
    else
      MIXPREC_CHECK(false, "dp_bench: unknown flag ", k);
  }
  MIXPREC_CHECK(a.model == "mlp" || a.model == "cnn", "dp_bench: --model mlp|cnn, got ", a.model);
  return a;
}

std::shared_ptr<nn::Sequential> build(const std::string& name) {
  default_generator().manual_seed(0);
  if (name == "mlp")
    return std::make_shared<nn::Sequential>(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                                            nn::Linear(1024, 10));
  return std::make_shared<nn::Sequential>(nn::Conv2d(1, 420, 3, {.padding = 1}), nn::ReLU(), nn::MaxPool2d(2),
                                          nn::Conv2d(420, 1000, 3, {.padding = 1}), nn::ReLU(), nn::MaxPool2d(2),
                                          nn::Flatten(), nn::Linear(1000 * 7 * 7, 10));
}

struct Run {
  double step_s = 0, wait_s = 0, pack_s = 0, backward_s = 0;
};

// Times `steps` steps after `warmup` untimed ones; the per-step figures are rank 0's.
Run run(const Args& a, bool overlap) {
  dist::ProcessGroup& pg = dist::ProcessGroup::world();
  auto model = build(a.model);
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  dist::DataParallel dp(
      *model, opt, {.reduce_dtype = a.wire, .bucket_bytes = a.bucket_kb << 10, .overlap = overlap, .zero = a.zero});
  const int64_t local = a.batch / pg.size();
  Generator gen(uint64_t(pg.rank()) + 1);
  const Tensor x = a.model == "mlp" ? Tensor::randn({local, 784}, gen) : Tensor::randn({local, 1, 28, 28}, gen);
  std::vector<int64_t> labels(static_cast<size_t>(local));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
  const Tensor y = Tensor::from_vector(labels, {local});
  Run r;
  double backward_s = 0;
  Clock::time_point start;
  dist::DataParallelStats at_start;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) {
      pg.barrier();
      start = Clock::now();
      at_start = dp.stats();
      backward_s = 0;
    }
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(DType::bf16, a.autocast);
      loss = ops::cross_entropy((*model)(x), y);
    }
    const auto b0 = Clock::now();
    loss.backward();
    backward_s += std::chrono::duration<double>(Clock::now() - b0).count();
    dp.step();
  }
  pg.barrier();
  r.step_s = std::chrono::duration<double>(Clock::now() - start).count() / a.steps;
  r.wait_s = (dp.stats().wait_s - at_start.wait_s) / a.steps;
  r.pack_s = (dp.stats().pack_s - at_start.pack_s) / a.steps;
  r.backward_s = backward_s / a.steps;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    dist::ProcessGroup& pg = dist::ProcessGroup::world();
    MIXPREC_CHECK(a.batch % pg.size() == 0, "dp_bench: --batch ", a.batch, " is not a multiple of ", pg.size(),
                  " ranks");
    const Run on = run(a, /*overlap=*/true);
    // The same steps with every bucket launched after backward: the wait is then the whole
    // all-reduce, which tells how much of it the overlapped run hid behind backward.
    const Run off = pg.size() > 1 ? run(a, /*overlap=*/false) : Run{};
    const char* threads = std::getenv("OMP_NUM_THREADS");
    if (pg.rank() == 0)
      std::printf(
          "{\"model\": \"%s\", \"world_size\": %d, \"omp_threads\": \"%s\", \"global_batch\": %lld, \"steps\": %d, "
          "\"reduce_dtype\": \"%s\", \"bucket_kb\": %lld, \"autocast\": \"%s\", \"samples_per_s\": %.1f, "
          "\"step_ms\": %.2f, \"backward_ms\": %.2f, \"exposed_wait_ms\": %.2f, \"pack_ms\": %.2f, "
          "\"no_overlap_step_ms\": %.2f, \"no_overlap_wait_ms\": %.2f, \"hidden_fraction\": %.3f}\n",
          a.model.c_str(), pg.size(), threads ? threads : "unset", static_cast<long long>(a.batch), a.steps,
          dist::wire_dtype_name(a.wire), static_cast<long long>(a.bucket_kb), a.autocast ? "bf16" : "off",
          double(a.batch) / on.step_s, on.step_s * 1e3, on.backward_s * 1e3, on.wait_s * 1e3, on.pack_s * 1e3,
          off.step_s * 1e3, off.wait_s * 1e3, off.wait_s > 0 ? 1.0 - on.wait_s / off.wait_s : 0.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_bench: %s\n", e.what());
    if (dist::ProcessGroup::world().is_distributed()) dist::ProcessGroup::world().abort_job(e.what());
    return 1;
  }
  return 0;
}
