// `mixprec bench`: time training steps on synthetic data; one JSON object on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "metrics.h"
#include "mixprec/allocator.h"
#include "session.h"

namespace mixprec::cli {

namespace {

struct BenchFlags {
  SessionFlags session;
  int64_t vocab_size = 81;  // Moby Dick's vocabulary after preprocessing (mixprec/text.h)
  int64_t steps = 30, warmup = 5;
};

int cmd_bench(const Command& c, const BenchFlags& f) {
  SessionOptions opt = resolve_session(f.session, c);
  if (opt.model.is_gpt()) opt.model.vocab_size = f.vocab_size;
  const int64_t steps = f.steps, warmup = f.warmup;

  Session s = make_session(opt);
  start_data_parallel(s);  // under mpirun: each rank times its share of every (global) batch
  Generator gen(opt.seed + 1);
  Tensor x, y;
  {
    MemoryScope scope(MemCategory::data);
    // Made on the CPU (the same data on every device), then moved: the data sits on the device
    // before the timing starts, as the PyTorch peer's does.
    if (opt.model.is_gpt()) {
      // Random tokens: the step's cost does not depend on which ones.
      const int64_t n = opt.batch_size * opt.model.block_size;
      std::vector<int64_t> tokens(size_t(2 * n));
      for (auto& t : tokens) t = int64_t(gen.uniform_below(uint64_t(opt.model.vocab_size)));
      x = Tensor::from_vector(std::vector<int64_t>(tokens.begin(), tokens.begin() + n),
                              {opt.batch_size, opt.model.block_size})
              .to(opt.device);
      y = Tensor::from_vector(std::vector<int64_t>(tokens.begin() + n, tokens.end()),
                              {opt.batch_size, opt.model.block_size})
              .to(opt.device);
    } else {
      x = Tensor::randn({opt.batch_size, 1, opt.model.image_rows, opt.model.image_cols}, gen)
              .to(batch_dtype(opt))
              .to(opt.device);
      std::vector<int64_t> labels(size_t(opt.batch_size));
      for (auto& l : labels) l = int64_t(gen.next_u64() % uint64_t(opt.model.num_classes));
      y = Tensor::from_vector(labels, {opt.batch_size}).to(opt.device);
    }
  }
  // Reading the step's loss waits for the step (on a GPU, for everything queued on its stream):
  // the time is the step's, not the time to queue it.
  auto step = [&] {
    const StepResult r = train_step(s, x, y);
    read_losses({&r.pending_loss});
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  allocator::reset_peak(opt.device);
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double best = ms.front(), median = ms[ms.size() / 2];
  Json j = {{"impl", "mixprec"},
            {"model", opt.model.name},
            {"precision", opt.precision.name},
            {"device", opt.device.str()},
            {"batch_size", opt.batch_size},
            {"parameters", s.model->num_parameters()},
            {"threads", opt.threads},
            {"world_size", world_size()},
            {"steps", steps},
            {"warmup", warmup}};
  j["steps_per_s"] = {{"best", 1000.0 / best}, {"median", 1000.0 / median}};
  j["samples_per_s"] = {{"best", 1000.0 * double(opt.batch_size) / best},
                        {"median", 1000.0 * double(opt.batch_size) / median}};
  j["step_ms"] = {{"best", best}, {"median", median}};
  j["peak_bytes"] = peak_memory_json(opt.device);
  j["category_peak_bytes"] = category_peak_json(opt.device);
  if (opt.model.is_gpt()) {
    j["block_size"] = opt.model.block_size;
    j["vocab_size"] = opt.model.vocab_size;
    j["tokens_per_s"] = {{"best", 1000.0 * double(opt.batch_size * opt.model.block_size) / best},
                         {"median", 1000.0 * double(opt.batch_size * opt.model.block_size) / median}};
  }
  if (world_rank() == 0) std::printf("%s\n", j.dump().c_str());  // one JSON object for the job
  return 0;
}

}  // namespace

std::function<int()> declare_bench(Command& c) {
  auto f = std::make_shared<BenchFlags>();
  c.integer("steps", f->steps, 1, 1000000, "timed training steps");
  c.integer("warmup", f->warmup, 0, 1000000, "untimed steps first");
  add_session_flags(c, f->session);
  c.group("gpt model (--model gpt)", {"gpt"});
  c.integer("vocab-size", f->vocab_size, 1, 1 << 24, "random tokens below V (81: Moby Dick's vocabulary)");
  c.group("Options");
  return [f, &c] { return cmd_bench(c, *f); };
}

}  // namespace mixprec::cli
