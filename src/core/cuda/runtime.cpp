// The CUDA queries of a build with the CUDA backend: device count and properties through the CUDA
// runtime (which loads the driver itself, so this binary still runs where there is none).
#include <cuda_runtime.h>

#include "mixprec/device.h"

namespace mixprec::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? std::string(e == cudaErrorNoDevice ? "no CUDA GPU found" : "no NVIDIA driver loaded") + " (" +
                           cudaGetErrorString(e) + ")"
                     : std::string("the CUDA runtime failed: ") + cudaGetErrorString(e);
      cudaGetLastError();  // clear the sticky error state for later calls
    } else if (r.count == 0) {
      r.reason = "no CUDA GPU found";
    }
    return r;
  }();
  return p;
}

}  // namespace

bool built() { return true; }
std::string toolkit_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}
int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().reason; }

std::vector<DeviceProperties> devices() {
  std::vector<DeviceProperties> out;
  for (int i = 0; i < device_count(); ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount});
  }
  return out;
}

}  // namespace mixprec::cuda
