// The profiler's hooks for the kernels (internal; the public side is mixprec/profile.h). Every
// dispatch function's DeviceScope holds a KernelScope, so each kernel call is timed without a line
// of its own; the matrix kernels add their FLOPs and the oneDNN kernels the implementation they ran.
#pragma once
#include <atomic>
#include <chrono>
#include <string_view>

#include "mixprec/device.h"

namespace mixprec::profile::detail {

extern std::atomic<bool> g_on;
inline bool on() { return g_on.load(std::memory_order_relaxed); }

// Times the calls of the outermost kernel on this thread (nested ones count in it).
class KernelScope {
 public:
  KernelScope(const char* where, const Device& device, std::string_view dtype) {
    if (on()) begin(where, device, dtype);
  }
  ~KernelScope() {
    if (active_) end();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void begin(const char* where, const Device& device, std::string_view dtype);
  void end() noexcept;

  bool active_ = false;  // this scope is the outermost kernel and is being timed
  bool nested_ = false;  // an inner kernel: only counted the depth
  const char* function_ = nullptr;
  Device device_;
  std::string_view dtype_;  // its first operand's, or "" (a kernel given only a device)
  std::chrono::steady_clock::time_point t0_;
};

// Add to the outermost kernel running on this thread: its floating-point operations, and the
// implementation it ran (kept once; a second, different one is appended after a '+').
void add_flops(double flops);
void note_impl(std::string_view impl);

}  // namespace mixprec::profile::detail
