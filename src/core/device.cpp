// Device names, and the CUDA queries of a build without the CUDA backend (src/core/cuda/ has the
// real ones).
#include "mixprec/device.h"

#include <charconv>

#include "kernels/shape.h"
#include "mixprec/cuda_stream.h"
#include "mixprec/error.h"

namespace mixprec {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text == "fenced") return fenced();
  if (text.starts_with("cuda:")) {
    const std::string_view num = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && !num.empty() && index >= 0) return cuda(index);
  }
  throw Error(detail::concat("unknown device '", text, "': expected cpu, cuda or cuda:N"));
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::fenced:
      return "fenced";
    case DeviceType::cuda:
      break;
  }
  return "cuda:" + std::to_string(index);
}

int64_t device_to_host_copies() { return kernels::device_to_host_copies(); }

namespace cuda {

void require(const Device& d) {
  if (!d.is_cuda()) return;
  const int n = device_count();
  MIXPREC_CHECK(n > 0, "device ", d.str(), " asked for, but there is no usable GPU: ", unavailable_reason());
  MIXPREC_CHECK(d.index < n, "device ", d.str(), " asked for, but this machine has ", n, " GPU", n == 1 ? "" : "s",
                " (cuda:0", n > 1 ? detail::concat("..cuda:", n - 1) : std::string(), ")");
}

#ifndef MIXPREC_WITH_CUDA
bool built() { return false; }
std::string toolkit_version() { return ""; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this mixprec was built without CUDA support"; }
std::vector<DeviceProperties> devices() { return {}; }

// Without CUDA a Graph can be made and destroyed; capturing throws (there is no GPU).
struct Graph::Impl {};
Graph::Graph() = default;
Graph::~Graph() = default;
void Graph::capture_begin(int device) {
  require(Device::cuda(device));  // throws in a build without CUDA
  throw Error("cuda::Graph: this mixprec was built without CUDA support");
}
void Graph::capture_end() { throw Error("cuda::Graph::capture_end without capture_begin"); }
void Graph::replay() { throw Error("cuda::Graph::replay: nothing captured"); }
bool Graph::captured() const { return false; }
Graph::Nodes Graph::nodes() const { throw Error("cuda::Graph::nodes: nothing captured"); }
std::vector<double> time_each(int device, int64_t, const std::function<void()>&) {
  require(Device::cuda(device));  // throws in a build without CUDA
  return {};
}
#endif

}  // namespace cuda
}  // namespace mixprec
