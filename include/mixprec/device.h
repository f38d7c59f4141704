// Devices: where a tensor's bytes live (cpu, cuda:N, and the test-only fenced device), and which
// GPUs this build and machine offer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mixprec {

// fenced: host memory that host code may not touch (mprotect'ed PROT_NONE except while a kernel
// runs), whose kernels are the CPU ones. It stands in for a GPU in tests that run everywhere: a
// loop over tensor data outside the kernel interface crashes there as it would on a GPU, and
// results must be bit-identical to the CPU's. Not for real work (one mmap per allocation).
enum class DeviceType : uint8_t { cpu, cuda, fenced };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // the GPU ordinal for cuda; always 0 for cpu

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  static Device fenced() { return {DeviceType::fenced, 0}; }
  // "cpu", "cuda", "cuda:N" (PyTorch's spelling), "fenced"; throws mixprec::Error naming the text
  // otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_fenced() const { return type == DeviceType::fenced; }
  std::string str() const;  // "cpu", "cuda:0", "fenced"
  friend bool operator==(const Device&, const Device&) = default;
};

// Tensor copies so far in this process from a device (a GPU, the fenced device) to the host, each
// one a wait for the device. A training step of ours makes none: `mixprec bench` reports its timed
// steps' count.
int64_t device_to_host_copies();

namespace cuda {

// True when this build has the CUDA backend (MIXPREC_CUDA was ON at configure time).
bool built();
// The CUDA toolkit version this build was compiled with ("13.0"), or "" without CUDA.
std::string toolkit_version();
// GPUs visible to this process; 0 without a GPU, without a driver, or in a build without CUDA.
int device_count();
// Why device_count() is 0, in a few words ("built without CUDA", "no NVIDIA driver: ..."); "" when
// there are GPUs.
std::string unavailable_reason();

struct DeviceProperties {
  int index = 0;
  std::string name;
  size_t total_bytes = 0;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
};
std::vector<DeviceProperties> devices();

// Throws mixprec::Error (one line: the device asked for and why it is not there) unless `d` is the
// CPU, the fenced device or a GPU this process can use.
void require(const Device& d);

}  // namespace cuda
}  // namespace mixprec
