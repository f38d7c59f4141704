// Timing probe (not a test) of scaled_dot_product_attention, forward + backward, causal, head dim
// 32 (the GPT's): the fused CPU kernel against the unfused reference, bf16 and f32, interleaved so
// that machine-wide speed swings hit both alike. One JSON line per (T, dtype), T in 128, 512,
// 2048, with B * H * T^2 fixed (2^24 scores per pass), and the bytes each keeps for the backward.
//
//   cmake --build build --target attention_bench
//   OMP_NUM_THREADS=2 build/attention_bench [fused_reps=10] [ref_reps=3]
//
// `attention_bench gpt [reps=100] [f32|bf16|both] [cold]` times instead one layer of the gpt recipe
// as the model runs it: packed_qkv_attention on a [32, 128, 3 * 128] qkv with 4 heads, forward and
// backward into the packed gradient (each also on its own), fused kernel only, f32 and bf16 or the
// one named. `cold` writes 64 MiB before the forward and again before the backward (not timed), so
// that their inputs come from memory as in a training step, where other ops ran in between
// (docs/hosts.md, 2026-12-06, third session: it gives the step's call times).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"

using namespace mixprec;

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct Inputs {
  Tensor q, k, v, g;
};

Inputs make(int64_t bh, int64_t t, DType dt) {
  Generator gen(1);
  const MemoryScope data(MemCategory::data);
  auto u = [&](double lo, double hi) { return Tensor::uniform({1, bh, t, 32}, gen, lo, hi, dt); };
  return {u(-2, 2).set_requires_grad(), u(-2, 2).set_requires_grad(), u(-2, 2).set_requires_grad(), u(-1, 1)};
}

// One forward + backward; returns its milliseconds and the bytes the forward left alive.
double step(Inputs& in, int64_t* saved) {
  for (Tensor* x : {&in.q, &in.k, &in.v}) x->set_grad(Tensor());
  const auto t0 = std::chrono::steady_clock::now();
  Tensor o;
  {
    const MemoryScope act(MemCategory::activations);
    const int64_t before = allocator::stats().live_bytes[size_t(MemCategory::activations)];
    o = ops::scaled_dot_product_attention(in.q, in.k, in.v, {.causal = true});
    *saved = allocator::stats().live_bytes[size_t(MemCategory::activations)] - before;
  }
  o.backward(in.g);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Times {
  std::vector<double> ms;
  int64_t saved = 0;
  double best() const { return *std::min_element(ms.begin(), ms.end()); }
  double median() const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

// One gpt layer's attention as nn::CausalSelfAttention runs it, reps times per dtype.
int gpt_layer(int reps, const std::string& only, bool cold, const std::string& host) {
  std::vector<char> other(size_t(64) << 20);
  const auto evict = [&](int r) {  // every line of a buffer larger than the caches, written
    if (!cold) return;
    char* const p = other.data();
    const int64_t n = int64_t(other.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 64) p[i] = char(r + i);
  };
  const int64_t b = 32, t = 128, c = 128, heads = 4;
  for (DType dt : {DType::f32, DType::bf16}) {
    if (!only.empty() && only != dtype_name(dt)) continue;
    Generator gen(1);
    Tensor qkv = Tensor::uniform({b, t, 3 * c}, gen, -2, 2, dt).set_requires_grad();
    const Tensor g = Tensor::uniform({b, heads, t, c / heads}, gen, -1, 1, dt);
    Times times, fwd, bwd;
    for (int r = 0; r <= reps; ++r) {  // the first: warm-up
      qkv.set_grad(Tensor());
      evict(r);
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor y = ops::packed_qkv_attention(qkv, heads, {.causal = true});
      const auto t1 = std::chrono::steady_clock::now();
      evict(r + 1);
      const auto t2 = std::chrono::steady_clock::now();
      y.backward(g);
      const auto t3 = std::chrono::steady_clock::now();
      if (r == 0) continue;
      const double fwd_ms = std::chrono::duration<double, std::milli>(t1 - t0).count(),
                   bwd_ms = std::chrono::duration<double, std::milli>(t3 - t2).count();
      times.ms.push_back(fwd_ms + bwd_ms);
      fwd.ms.push_back(fwd_ms);
      bwd.ms.push_back(bwd_ms);
    }
    std::printf(
        "{\"bench\":\"attention_gpt_layer\",\"host\":\"%s\",\"threads\":%d,\"cold\":%s,\"B\":%ld,\"T\":%ld,\"H\":%ld,"
        "\"E\":%ld,\"dtype\":\"%s\",\"ms_best\":%.3f,\"ms_median\":%.3f,\"forward_ms_median\":%.3f,"
        "\"backward_ms_median\":%.3f}\n",
        host.c_str(), omp_get_max_threads(), cold ? "true" : "false", long(b), long(t), long(heads), long(c / heads),
        std::string(dtype_name(dt)).c_str(), times.best(), times.median(), fwd.median(), bwd.median());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "gpt") {
    const int reps = argc > 2 ? std::atoi(argv[2]) : 100;
    std::string only = argc > 3 ? argv[3] : "";
    if (only == "both") only.clear();
    const bool cold = argc > 4 && std::string(argv[4]) == "cold";
    return gpt_layer(std::max(reps, 1), only, cold, cpu_model() + " (" + cpu::describe() + ")");
  }
  const int fused_reps = std::max(1, argc > 1 ? std::atoi(argv[1]) : 10),
            ref_reps = std::max(1, argc > 2 ? std::atoi(argv[2]) : 3);
  const std::string host = cpu_model() + " (" + cpu::describe() + ")";
  for (int64_t t : {128, 512, 2048}) {
    const int64_t bh = (int64_t(1) << 24) / (t * t);
    for (DType dt : {DType::bf16, DType::f32}) {
      Inputs in = make(bh, t, dt);
      Times fused, ref;
      int64_t saved = 0;
      step(in, &saved);  // warm-up: allocator cache, page faults
      for (int r = 0; r < std::max(fused_reps, ref_reps); ++r) {
        if (r < fused_reps) fused.ms.push_back(step(in, &fused.saved));
        if (r < ref_reps) {
          const kernels::BackendGuard guard(kernels::Backend::ref);
          ref.ms.push_back(step(in, &ref.saved));
        }
      }
      std::printf(
          "{\"bench\":\"attention\",\"host\":\"%s\",\"threads\":%d,\"T\":%ld,\"B\":1,\"H\":%ld,\"E\":32,\"causal\":"
          "true,"
          "\"dtype\":\"%s\",\"fused_ms_best\":%.3f,\"fused_ms_median\":%.3f,\"ref_ms_best\":%.3f,\"ref_ms_median\":%."
          "3f,"
          "\"speedup_best\":%.2f,\"fused_saved_bytes\":%ld,\"ref_saved_bytes\":%ld}\n",
          host.c_str(), omp_get_max_threads(), long(t), long(bh), std::string(dtype_name(dt)).c_str(), fused.best(),
          fused.median(), ref.best(), ref.median(), ref.best() / fused.best(), long(fused.saved), long(ref.saved));
      std::fflush(stdout);
    }
  }
}
