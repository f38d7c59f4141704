// `mixprec devices` and `mixprec --version`: what this build and this machine offer.
#include <cstdio>
#include <string>

#include "commands.h"
#include "mixprec/cpu.h"
#include "mixprec/device.h"

namespace mixprec::cli {

std::string version_text() {
  return std::string("mixprec ") + MIXPREC_VERSION + " (" +
         (cuda::built() ? "CUDA " + cuda::toolkit_version() + " support built in" : "built without CUDA support") + ")";
}

namespace {

int cmd_devices() {
  std::printf("cpu: %s (%s)\n", mixprec::cpu::describe().c_str(), mixprec::cpu::describe_bf16_products().c_str());
  const auto gpus = cuda::devices();
  if (gpus.empty()) {
    std::printf("cuda: none (%s)\n", cuda::unavailable_reason().c_str());
    std::printf("--device auto: cpu\n");
    return 0;
  }
  for (const auto& g : gpus)
    std::printf("cuda:%d: %s, %.1f GiB, compute capability %d.%d, %d SMs\n", g.index, g.name.c_str(),
                double(g.total_bytes) / double(1ull << 30), g.major, g.minor, g.multiprocessors);
  std::printf("--device auto: cuda:0\n");
  return 0;
}

}  // namespace

std::function<int()> declare_devices(Command&) { return cmd_devices; }

}  // namespace mixprec::cli
