// The process-wide kernel backend (see backend.h).
#include "kernels/backend.h"

#include <cstdlib>
#include <string>

#include "mixprec/error.h"

namespace mixprec::kernels {
namespace {
Backend initial_backend() {
  const char* env = std::getenv("MIXPREC_KERNELS");
  return env && std::string(env) == "ref" ? Backend::ref : Backend::cpu;
}
Backend g_backend = initial_backend();
}  // namespace

Backend backend() { return g_backend; }
void set_backend(Backend b) { g_backend = b; }

const Tensor* DeviceScope::first_defined(std::initializer_list<const Tensor*> xs) {
  const Tensor* first = nullptr;
  for (const Tensor* x : xs) {
    if (!x->defined()) continue;
    if (first == nullptr) first = x;
    // Ops check their inputs (amp::check_devices); this catches a kernel's caller that made a
    // tensor on the wrong device, before a CPU kernel reads device memory.
    MIXPREC_CHECK(x->device() == first->device(), "internal: kernel operands on different devices (",
                  first->device().str(), ", ", x->device().str(), ")");
  }
  return first;
}

}  // namespace mixprec::kernels
