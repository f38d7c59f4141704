// `mixprec bench`: time training steps on synthetic data; one JSON object on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "metrics.h"
#include "mixprec/allocator.h"
#include "session.h"

namespace mixprec::cli {

int cmd_bench(Args& a) {
  SessionOptions opt = parse_session(a);
  const int64_t steps = a.integer("steps", 30, 1, 1000000);
  const int64_t warmup = a.integer("warmup", 5, 0, 1000000);
  a.finish();

  Session s = make_session(opt);
  Generator gen(opt.seed + 1);
  Tensor x, y;
  {
    MemoryScope scope(MemCategory::data);
    x = Tensor::randn({opt.batch_size, 1, opt.model.image_rows, opt.model.image_cols}, gen);
    std::vector<int64_t> labels(size_t(opt.batch_size));
    for (auto& l : labels) l = int64_t(gen.next_u64() % uint64_t(opt.model.num_classes));
    y = Tensor::from_vector(labels, {opt.batch_size});
  }
  for (int64_t i = 0; i < warmup; ++i) train_step(s, x, y);
  allocator::reset_peak();
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    train_step(s, x, y);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double best = ms.front(), median = ms[ms.size() / 2];
  Json j = {{"impl", "mixprec"},
            {"model", opt.model.name},
            {"precision", opt.precision.name},
            {"batch_size", opt.batch_size},
            {"threads", opt.threads},
            {"steps", steps},
            {"warmup", warmup}};
  j["steps_per_s"] = {{"best", 1000.0 / best}, {"median", 1000.0 / median}};
  j["samples_per_s"] = {{"best", 1000.0 * double(opt.batch_size) / best},
                        {"median", 1000.0 * double(opt.batch_size) / median}};
  j["step_ms"] = {{"best", best}, {"median", median}};
  j["peak_bytes"] = peak_memory_json();
  j["category_peak_bytes"] = category_peak_json();
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace mixprec::cli
