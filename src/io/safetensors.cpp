// safetensors files: saving through AtomicFile, loading from a read-only mapping of the file once
// its whole header is checked (the format and the checks: safetensors_header.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/atomic_file.h"
#include "io/safetensors_header.h"
#include "mixprec/error.h"
#include "mixprec/io.h"

namespace mixprec::io {
namespace {

using mixprec::detail::concat;

// A file mapped read-only for the lifetime of the object.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MIXPREC_CHECK(fd_ >= 0, path, ": cannot open safetensors file: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd_);
      MIXPREC_CHECK(!S_ISDIR(st.st_mode), path, ": cannot open safetensors file: is a directory");
      throw Error(concat(path, ": cannot open safetensors file: ", err ? std::strerror(err) : "not a regular file"));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return;  // mmap refuses length 0; the parser reports the short file
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd_);
      throw Error(concat(path, ": cannot map safetensors file (", size_, " bytes): ", std::strerror(err)));
    }
    data_ = static_cast<const uint8_t*>(p);
    ::madvise(p, size_, MADV_SEQUENTIAL);  // read once, front to back
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything is checked, and the header built, before the file is created.
  std::vector<Tensor> dense;
  dense.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    MIXPREC_CHECK(t.defined(), path, ": cannot save tensor '", name, "': it is undefined");
    dense.push_back(t.detach().to(Device::cpu()).contiguous());  // host bytes in logical order, any device
  }
  std::vector<detail::EntrySpec> specs;
  specs.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    specs.push_back({tensors[i].first, dense[i].dtype(), &dense[i].shape(), dense[i].nbytes()});
  const std::string header = detail::encode_header(specs, metadata, path);

  AtomicFile file(path);
  file.write(header.data(), header.size());
  for (const Tensor& t : dense)
    if (t.nbytes() > 0) file.write(t.data_ptr(), t.nbytes());
  file.commit();
}

SafetensorsFile load_safetensors(const std::string& path) {
  const MappedFile file(path);
  const detail::Header header = detail::parse_header(file.data(), file.size(), path);
  SafetensorsFile out;
  out.metadata = header.metadata;
  out.tensors.reserve(header.tensors.size());
  for (const detail::HeaderEntry& e : header.tensors) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.data_ptr(), file.data() + header.data_start + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace mixprec::io
