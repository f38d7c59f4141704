// Autocast: the guard (thread-local, nests, RAII) that runs each op in the precision its
// autocast class asks for, its queries, and the trace of what ran in which dtype.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "mixprec/device.h"
#include "mixprec/dtype.h"

namespace mixprec::amp {

// The dtype autocast uses on a device type when none is given, as in PyTorch: bf16 on the CPU,
// fp16 on CUDA. The fenced test device stands in for a GPU, so it takes CUDA's default (its
// kernels are the CPU's: for one dtype its results equal the CPU's bit for bit).
constexpr DType kDefaultCpuAutocastDType = DType::bf16;
constexpr DType kDefaultCudaAutocastDType = DType::f16;
constexpr DType default_autocast_dtype(DeviceType type) {
  return type == DeviceType::cpu ? kDefaultCpuAutocastDType : kDefaultCudaAutocastDType;
}

// While alive, ops whose inputs are on a device of the guard's type run in the precision their
// autocast class (src/ops/ops.def) asks for: `lower` ops in `dtype`, `fp32` ops in f32, `promote`
// ops in their widest input dtype. Each device type keeps its own state (PyTorch's
// torch.autocast(device_type, dtype)): a CUDA guard leaves CPU ops alone and the other way round.
// Guards nest; an inner guard with enabled=false runs its device type's ops in their input
// dtypes. The 16-bit copies of leaf parameters that require grad are cached until the outermost
// guard (of any device type) exits; cache_enabled=false (PyTorch's cache_enabled) casts them afresh
// at every use while this guard is the innermost, and caches nothing.
class Autocast {
 public:
  // The CPU's autocast (torch.autocast("cpu", dtype)).
  explicit Autocast(DType dtype = kDefaultCpuAutocastDType, bool enabled = true, bool cache_enabled = true)
      : Autocast(DeviceType::cpu, dtype, enabled, cache_enabled) {}
  explicit Autocast(bool enabled) : Autocast(kDefaultCpuAutocastDType, enabled) {}
  // Autocast on one device type; without a dtype, the type's current one (its default outside any
  // guard of that type, as torch.get_autocast_dtype).
  explicit Autocast(DeviceType device_type, std::optional<DType> dtype = std::nullopt, bool enabled = true,
                    bool cache_enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType type_;
  bool prev_enabled_;
  DType prev_dtype_;
  bool prev_cache_enabled_;
};

// The state ops on `type`'s devices follow; without an argument, the CPU's.
bool is_autocast_enabled(DeviceType type = DeviceType::cpu);
DType autocast_dtype(DeviceType type = DeviceType::cpu);
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
