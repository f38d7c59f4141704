// `mixprec bench`: time training steps on synthetic data; one JSON object on stdout. --profile:
// where a step's time goes, kernel by kernel, against the host's own matmul rate (a table, or the
// object with a "profile" member with --json).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "commands.h"
#include "metrics.h"
#include "mixprec/allocator.h"
#include "mixprec/autograd.h"
#include "mixprec/cuda_stream.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"
#include "session.h"

namespace mixprec::cli {

namespace {

struct BenchFlags {
  SessionFlags session;
  int64_t vocab_size = 81;  // Moby Dick's vocabulary after preprocessing (mixprec/text.h)
  int64_t steps = 30, warmup = 5;
  bool profile = false, json = false, cuda_graph = false;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The device's matmul rate in `dtype`, in GFLOP/s: the best of a few products of two n x n
// matrices through the library's own matmul (oneDNN on the CPU, cuBLASLt on a GPU), in this
// process, so a model's achieved rate has its ceiling measured beside it. n = 1024 on the CPU (2
// GFLOP, a few ms), 8192 on a GPU (1.1 TFLOP: long enough that launch and the read-back that
// waits for it are noise).
double reference_gflops(const Device& device, DType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024, reps = device.is_cuda() ? 10 : 20;
  autograd::NoGradGuard no_grad;
  Generator gen(7);
  const Tensor a = Tensor::randn({n, n}, gen).to(dtype).to(device), b = Tensor::randn({n, n}, gen).to(dtype).to(device);
  auto wait = [](const Tensor& c) { (void)c.slice(0, 0, 1).slice(1, 0, 1).to(Device::cpu()); };
  wait(ops::matmul(a, b));  // the primitive is made and cached here, outside the timing
  double best = 1e300;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c;
    for (int64_t i = 0; i < reps; ++i) c = ops::matmul(a, b);
    wait(c);
    best = std::min(best, ms_since(t0) / double(reps));
  }
  return 2.0 * double(n * n * n) / (best * 1e-3) / 1e9;
}

// The kernels of `steps` profiled steps, per step.
Json profile_json(const std::vector<profile::Row>& rows, int64_t steps, double step_ms, double ref_gflops,
                  double profiled_step_ms) {
  Json ops = Json::array();
  double kernel_ms = 0.0, flops = 0.0;
  std::map<std::string, double> phase_ms;
  for (const profile::Row& r : rows) {
    const double ms = 1e3 * r.seconds / double(steps);
    kernel_ms += ms;
    flops += r.flops / double(steps);
    phase_ms[r.phase] += ms;
    Json o = {{"phase", r.phase},
              {"kernel", r.kernel},
              {"dtype", r.dtype},
              {"impl", r.impl},
              {"calls", double(r.calls) / double(steps)},
              {"ms", ms}};
    if (r.flops > 0) o["gflops"] = r.flops / r.seconds / 1e9;
    ops.push_back(o);
  }
  Json phases = Json::object();
  for (const auto& [phase, ms] : phase_ms) phases[phase] = ms;
  return {{"kernels", ops},
          {"phase_ms", phases},
          {"kernel_ms", kernel_ms},
          // The profiled steps' wall time beyond their kernels: allocation, the autograd graph, the
          // host's own work (and the profiler's).
          {"outside_kernels_ms", std::max(0.0, profiled_step_ms - kernel_ms)},
          {"profiled_step_ms", profiled_step_ms},
          {"gflop_per_step", flops / 1e9},
          // The step's rate: its FLOPs over the (unprofiled) best step time.
          {"step_gflops", flops / 1e9 / (step_ms * 1e-3)},
          {"reference_gflops", ref_gflops},
          {"share_of_reference", flops / 1e9 / (step_ms * 1e-3) / ref_gflops}};
}

void print_profile(const Json& j) {
  const Json& p = j["profile"];
  std::printf(
      "%s %s on %s, batch %lld: step %.2f ms (best of %lld), %.3f GFLOP, %.0f GFLOP/s = %.0f%% of the "
      "host's %s matmul (%.0f GFLOP/s, n=%s, this process)\n",
      j["model"].get<std::string>().c_str(), j["precision"].get<std::string>().c_str(),
      j["device"].get<std::string>().c_str(), static_cast<long long>(j["batch_size"].get<int64_t>()),
      j["step_ms"]["best"].get<double>(), static_cast<long long>(j["steps"].get<int64_t>()),
      p["gflop_per_step"].get<double>(), p["step_gflops"].get<double>(), 100.0 * p["share_of_reference"].get<double>(),
      p["reference_dtype"].get<std::string>().c_str(), p["reference_gflops"].get<double>(),
      p["reference_n"].dump().c_str());
  std::printf("profiled step %.2f ms: kernels %.2f ms, outside kernels %.2f ms;", p["profiled_step_ms"].get<double>(),
              p["kernel_ms"].get<double>(), p["outside_kernels_ms"].get<double>());
  for (const auto& [phase, ms] : p["phase_ms"].items()) std::printf(" %s %.2f ms", phase.c_str(), ms.get<double>());
  std::printf("\n\n%-9s %-28s %-5s %8s %9s %6s %8s  %s\n", "phase", "kernel", "dtype", "calls", "ms/step", "share",
              "GFLOP/s", "implementation");
  const double total = p["profiled_step_ms"].get<double>();
  for (const Json& o : p["kernels"]) {
    char rate[32] = "";
    if (o.contains("gflops")) std::snprintf(rate, sizeof rate, "%.0f", o["gflops"].get<double>());
    std::printf("%-9s %-28s %-5s %8.1f %9.3f %5.1f%% %8s  %s\n", o["phase"].get<std::string>().c_str(),
                o["kernel"].get<std::string>().c_str(), o["dtype"].get<std::string>().c_str(), o["calls"].get<double>(),
                o["ms"].get<double>(), 100.0 * o["ms"].get<double>() / total, rate,
                o["impl"].get<std::string>().c_str());
  }
}

// One training step captured into `graph` (nothing runs): throws mixprec::Error if the step waits
// for the GPU. The session's host-side state has then seen a step that has not run yet.
void capture_step(cuda::Graph& graph, Session& s, const Tensor& x, const Tensor& y) {
  graph.capture_begin(s.opt.device.index);
  (void)train_step(s, x, y);
  graph.capture_end();
}

// What one run of a captured step launches, cuBLASLt's and cuDNN's kernels included.
Json launches_of(const cuda::Graph& graph) {
  const cuda::Graph::Nodes n = graph.nodes();
  return {{"kernels_per_step", n.kernels},
          {"memcpys_per_step", n.memcpys},
          {"memsets_per_step", n.memsets},
          {"other_nodes_per_step", n.other}};
}

// Without --cuda-graph: one more step captured (last: it never runs), or why it cannot be.
Json launches_json(Session& s, const Tensor& x, const Tensor& y) {
  cuda::Graph graph;
  try {
    capture_step(graph, s, x, y);
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
  return launches_of(graph);
}

int cmd_bench(const Command& c, const BenchFlags& f) {
  SessionOptions opt = resolve_session(f.session, c);
  MIXPREC_CHECK(!f.cuda_graph || opt.device.is_cuda(),
                "--cuda-graph replays a step's GPU work: it needs --device cuda ",
                "(or auto on a machine with a GPU), got --device ", opt.device.str());
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
  // The device-to-host copies the steps make (each a wait for the device; a step of ours makes
  // none), counted around the steps alone: the loss read that times a CPU step is outside.
  int64_t copies = 0;
  const auto counted = [&](auto&& work) {
    const int64_t before = device_to_host_copies();
    work();
    copies += device_to_host_copies() - before;
  };
  // Reading the step's loss waits for the step (on a GPU, for everything queued on its stream):
  // the time is the step's, not the time to queue it.
  auto step = [&] {
    StepResult r;
    counted([&] { r = train_step(s, x, y); });
    read_losses({&r.pending_loss});
  };
  // No step reads the scale or the skipped count back (a GPU would wait for each): train's steps
  // between log lines do the same.
  s.host_values = false;
  for (int64_t i = 0; i < warmup; ++i) step();
  allocator::reset_peak(opt.device);
  copies = 0;
  std::vector<double> ms;
  cuda::Graph graph;
  if (f.cuda_graph) {
    // The whole step (forward, backward, unscale, clip, optimizer, scale update) captured once
    // after the warm-up and replayed: one launch a step. Its memory (the graph's pool) counts from
    // the capture on. A step that waits for the GPU cannot be captured: the error says so.
    capture_step(graph, s, x, y);
    ms = cuda::time_each(opt.device.index, steps, [&] { counted([&] { graph.replay(); }); });
  } else if (opt.device.is_cuda()) {
    // On a GPU, CUDA events between steps and one wait at the end (the PyTorch peer's timing): the
    // host queues the next step while the GPU runs this one, as in training.
    ms = cuda::time_each(opt.device.index, steps, [&] { counted([&] { (void)train_step(s, x, y); }); });
  } else {
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      ms.push_back(ms_since(t0));
    }
  }
  const int64_t timed_copies = copies;
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
  j["cuda_graph"] = f.cuda_graph;
  j["channels_last"] = opt.model.channels_last;
  j["deterministic"] = opt.deterministic;
  j["steps_per_s"] = {{"best", 1000.0 / best}, {"median", 1000.0 / median}};
  j["samples_per_s"] = {{"best", 1000.0 * double(opt.batch_size) / best},
                        {"median", 1000.0 * double(opt.batch_size) / median}};
  j["step_ms"] = {{"best", best}, {"median", median}};
  j["device_to_host_copies_per_step"] = double(timed_copies) / double(steps);
  j["peak_bytes"] = peak_memory_json(opt.device);
  j["category_peak_bytes"] = category_peak_json(opt.device);
  if (opt.model.is_gpt()) {
    j["block_size"] = opt.model.block_size;
    j["vocab_size"] = opt.model.vocab_size;
    j["tokens_per_s"] = {{"best", 1000.0 * double(opt.batch_size * opt.model.block_size) / best},
                         {"median", 1000.0 * double(opt.batch_size * opt.model.block_size) / median}};
  }
  if (f.profile) {
    // As many steps again, profiled (after the timing: the profiler slows a GPU step), then the
    // matmul reference in the autocast dtype (or f32) on the same device.
    std::vector<double> profiled;
    profile::start();
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      profiled.push_back(ms_since(t0));
    }
    profile::stop();
    double mean = 0.0;
    for (double v : profiled) mean += v / double(steps);
    const DType ref_dtype = opt.precision.autocast ? opt.precision.autocast_dtype : opt.precision.param_dtype;
    Json p = profile_json(profile::rows(), steps, best, reference_gflops(opt.device, ref_dtype), mean);
    p["reference_dtype"] = std::string(dtype_name(ref_dtype));
    p["reference_n"] = opt.device.is_cuda() ? 8192 : 1024;
    j["profile"] = p;
    if (world_rank() == 0 && !f.json) print_profile(j);
  }
  if (f.cuda_graph) {
    j["launches"] = launches_of(graph);  // the replayed step's own graph
    j["launches"]["graph_launches_per_step"] = 1;
  } else if (opt.device.is_cuda()) {
    j["launches"] = launches_json(s, x, y);
  }
  if (world_rank() == 0 && (!f.profile || f.json)) std::printf("%s\n", j.dump().c_str());  // one object for the job
  return 0;
}

}  // namespace

std::function<int()> declare_bench(Command& c) {
  auto f = std::make_shared<BenchFlags>();
  c.integer("steps", f->steps, 1, 1000000, "timed training steps");
  c.integer("warmup", f->warmup, 0, 1000000, "untimed steps first");
  c.flag("profile", f->profile,
         "then profile as many steps: per kernel and phase, its time, GFLOP/s and oneDNN implementation, against the "
         "host's matmul rate (a table; with --json, the object's \"profile\")");
  c.flag("json", f->json, "with --profile, print the JSON object instead of the table (without: always the object)");
  c.flag("cuda-graph", f->cuda_graph,
         "with --device cuda: capture one whole step as a CUDA graph after the warm-up and time its replays (one "
         "launch a step)");
  add_session_flags(c, f->session);
  c.group("gpt model (--model gpt)", {"gpt"});
  c.integer("vocab-size", f->vocab_size, 1, 1 << 24, "random tokens below V (81: Moby Dick's vocabulary)");
  c.group("Options");
  return [f, &c] { return cmd_bench(c, *f); };
}

}  // namespace mixprec::cli
