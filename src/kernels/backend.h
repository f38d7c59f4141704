// Which implementation a kernel call runs. Every family (src/kernels/<family>.h) has one dispatch
// function per computation that picks, in order: the device's kernels (src/kernels/cuda, next
// issue: chosen by the inputs' device), the fast CPU kernel (src/kernels/cpu) where it supports
// the case, the reference (src/kernels/ref) last. See docs/design.md (Kernels).
#pragma once

namespace mixprec::kernels {

// cpu: fast CPU path first, reference as fallback. ref: the reference everywhere (tests compare
// the two; MIXPREC_KERNELS=ref at start-up sets it too).
enum class Backend { cpu, ref };
Backend backend();
void set_backend(Backend b);
inline bool use_fast() { return backend() == Backend::cpu; }

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

}  // namespace mixprec::kernels
