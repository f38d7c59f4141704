// Autocast: the guard (thread-local, nests, RAII) that runs each op in the precision its
// autocast class asks for, its queries, and the trace of what ran in which dtype.
#pragma once
#include <string>
#include <vector>

#include "mixprec/dtype.h"

namespace mixprec::amp {

// The dtype autocast uses on this device when none is given: bf16 on CPU, as in PyTorch.
constexpr DType kDefaultCpuAutocastDType = DType::bf16;

// While alive, ops run in the precision their autocast class (src/ops/ops.def) asks for:
// `lower` ops in `dtype`, `fp32` ops in f32, `promote` ops in their widest input dtype.
// Guards nest; an inner guard with enabled=false runs ops in their input dtypes. The 16-bit
// copies of leaf parameters that require grad are cached until the outermost guard exits;
// cache_enabled=false (PyTorch's cache_enabled) casts them afresh at every use while this
// guard is the innermost, and caches nothing.
class Autocast {
 public:
  explicit Autocast(DType dtype = kDefaultCpuAutocastDType, bool enabled = true, bool cache_enabled = true);
  explicit Autocast(bool enabled) : Autocast(kDefaultCpuAutocastDType, enabled) {}
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
  bool prev_cache_enabled_;
};

bool is_autocast_enabled();
DType autocast_dtype();
bool is_autocast_cache_enabled();  // the innermost guard's cache_enabled (true outside any guard)

// One-time trace of which op ran in which dtype under autocast (diagnostics).
struct TraceEntry {
  std::string op;
  std::string input_dtypes;  // e.g. "f32,f32"
  std::string run_dtype;     // dtype the op computed in
};
void start_trace();                    // begins recording on this thread
std::vector<TraceEntry> stop_trace();  // ends recording and returns the distinct entries

}  // namespace mixprec::amp
