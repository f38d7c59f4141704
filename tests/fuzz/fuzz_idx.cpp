// libFuzzer target: the idx reader (raw and gzip) on arbitrary bytes, served from an in-memory file
// (memfd) so no disk is touched. Besides crashes and sanitizer reports it checks that errors are
// one line and that an accepted file's data has the size its dims say.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mixprec/data.h"
#include "mixprec/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz_idx", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  try {
    const mixprec::data::IdxArray a = mixprec::data::read_idx(path);
    uint64_t elements = 1;
    for (int64_t d : a.dims) elements *= static_cast<uint64_t>(d);
    if (a.dims.empty() || elements != a.data.size()) std::abort();
  } catch (const mixprec::Error& e) {
    if (std::strchr(e.what(), '\n')) std::abort();  // every error is one line
  }
  return 0;
}
