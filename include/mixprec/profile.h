// A kernel profiler: where a training step's time goes, kernel by kernel (torch.profiler's
// key_averages for mixprec). While it is on, every kernel call (each dispatch function of
// src/kernels: matmul, conv2d_forward, copy, adamw_step, ...) is timed from its entry to its
// return, and the calls are summed per (phase, kernel, dtype, implementation):
//   phase           "forward", "backward" (inside Tensor::backward), or a PhaseScope's label;
//   kernel          the dispatch function's name;
//   dtype           its first operand's dtype;
//   implementation  the oneDNN primitive it ran ("brg:avx512_core_amx", "jit:avx512_core_bf16"),
//                   or "" where the kernel is mixprec's own (or the GPU's);
// with the floating-point operations of the matrix kernels (matmul, conv, attention), so each row
// has an achieved GFLOP/s. A kernel called inside another kernel counts in the outer one (a
// matmul's weight reorder is the matmul's time). On a GPU the profiler synchronizes the device's
// stream around each kernel, so the times are the kernels' own, and the step is slower than without.
// Off (the default) it costs one relaxed atomic load per kernel call.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mixprec::profile {

struct Row {
  std::string phase, kernel, dtype, impl;
  int64_t calls = 0;
  double seconds = 0.0;
  double flops = 0.0;  // 0 for kernels that are not matrix products
};

// Starts a profile (clearing the previous one) or stops it; process-wide.
void start();
void stop();
bool enabled();
// The rows summed since start(), the slowest first.
std::vector<Row> rows();

// Labels the kernels called in its scope (on this thread) with `phase` instead of forward or
// backward, e.g. "optimizer". Scopes nest; the innermost label wins.
class PhaseScope {
 public:
  explicit PhaseScope(const char* phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  const char* prev_;
};

}  // namespace mixprec::profile
