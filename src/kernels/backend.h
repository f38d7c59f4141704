// Which implementation a kernel call runs. Every family (src/kernels/<family>.h) has one dispatch
// function per computation that opens a DeviceScope on its inputs' device, then picks, in order:
// the device's kernels (src/kernels/cuda for a CUDA tensor), the fast CPU kernel (src/kernels/cpu)
// where it supports the case, the reference (src/kernels/ref) last. See docs/design.md (Kernels).
#pragma once
#include <optional>
#include <string_view>

#include "core/fenced.h"
#include "core/profile_detail.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// cpu: fast CPU path first, reference as fallback. ref: the reference everywhere (tests compare
// the two; MIXPREC_KERNELS=ref at start-up sets it too).
enum class Backend { cpu, ref };
Backend backend();
void set_backend(Backend b);
inline bool use_fast() { return backend() == Backend::cpu; }

// Called by a dispatch function that has a fast CPU kernel when it runs the reference instead (the
// fast kernel declined the case, or the backend is ref): the profiler shows the kernel's
// implementation as "reference", and tests that compare the fast path with the reference learn
// that they compared the reference with itself.
inline void note_reference() { profile::detail::note_impl("reference"); }

// Sets the backend for a scope and restores the previous one on exit (tests).
class BackendGuard {
 public:
  explicit BackendGuard(Backend b) : prev_(backend()) { set_backend(b); }
  ~BackendGuard() { set_backend(prev_); }
  BackendGuard(const BackendGuard&) = delete;
  BackendGuard& operator=(const BackendGuard&) = delete;

 private:
  Backend prev_;
};

// Opened by every dispatch function: the tensors the call makes land on `device` (a DefaultDevice
// scope); on the fenced test device its memory is open to the host meanwhile, so the CPU kernels
// serve it unchanged. cuda() says the call must go to src/kernels/cuda. While the profiler is on
// (mixprec/profile.h) it times the call under the dispatch function's name (`where`).
class DeviceScope {
 public:
  explicit DeviceScope(const Tensor& x, const char* where = __builtin_FUNCTION())
      : DeviceScope(x.device(), where, dtype_name(x.dtype())) {}
  // The device of the defined ones among `xs`, which must all be on it.
  explicit DeviceScope(std::initializer_list<const Tensor*> xs, const char* where = __builtin_FUNCTION())
      : DeviceScope(first_defined(xs), where) {}
  explicit DeviceScope(Device d, const char* where = __builtin_FUNCTION(), std::string_view dtype = "")
      : profile_(where, d, dtype), device_(d), default_(d) {
    if (d.is_fenced()) access_.emplace();
  }
  const Device& device() const { return device_; }
  bool cuda() const { return device_.is_cuda(); }

 private:
  // The first defined one among xs (null when none is), after checking they share its device.
  static const Tensor* first_defined(std::initializer_list<const Tensor*> xs);
  DeviceScope(const Tensor* first, const char* where)
      : DeviceScope(first ? first->device() : Device::cpu(), where, first ? dtype_name(first->dtype()) : "") {}

  // First: the kernel's time starts before, and ends after, everything else the scope does.
  profile::detail::KernelScope profile_;
  Device device_;
  DefaultDevice default_;
  std::optional<detail::FencedAccess> access_;
};

}  // namespace mixprec::kernels
