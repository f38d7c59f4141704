// The process-wide kernel backend (see backend.h).
#include "kernels/backend.h"

#include <cstdlib>
#include <string>

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

}  // namespace mixprec::kernels
