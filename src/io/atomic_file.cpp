// AtomicFile: temporary file, fsync, rename over the target, fsync of the directory (see the .h).
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "mixprec/error.h"

namespace mixprec::io {
namespace {

namespace fs = std::filesystem;
using mixprec::detail::concat;

constexpr size_t kMaxWriteBytes = size_t{1} << 30;  // Linux moves at most ~2 GiB per write() anyway
constexpr int kNameAttempts = 100;                  // fresh random names to try before giving up

// A rename is durable only once its directory is synced.
void sync_directory(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MIXPREC_CHECK(fd >= 0, path, ": written, but its directory ", dir,
                " cannot be opened to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: a filesystem without directory sync (nothing to make durable there).
  MIXPREC_CHECK(rc == 0 || err == EINVAL, path, ": written, but syncing its directory ", dir,
                " failed: ", std::strerror(err));
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const fs::path p(path_);
  MIXPREC_CHECK(p.has_filename(), path_, ": cannot write: not a file name");
  dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
  std::error_code ec;
  MIXPREC_CHECK(!fs::is_directory(p, ec), path_, ": cannot write: is a directory");
  MIXPREC_CHECK(fs::is_directory(dir_, ec), path_, ": cannot write: no directory ", dir_);

  if (const char* at = std::getenv("MIXPREC_TEST_KILL_WRITE_AT")) {
    const std::string v = at;
    if (v == "synced") {
      kill_at_ = KillAt::synced;
    } else if (v == "linked") {
      kill_at_ = KillAt::linked;
    } else if (v == "renamed") {
      kill_at_ = KillAt::renamed;
    } else {
      char* end = nullptr;
      kill_bytes_ = std::strtoull(v.c_str(), &end, 10);
      MIXPREC_CHECK(!v.empty() && *end == '\0', "MIXPREC_TEST_KILL_WRITE_AT=", v,
                    ": expected a byte count, synced, linked or renamed");
      kill_at_ = KillAt::bytes;
    }
  }

#ifdef O_TMPFILE
  // Linking an O_TMPFILE inode goes through /proc/self/fd (linkat with AT_EMPTY_PATH needs a
  // capability), so it is used only where /proc is mounted.
  if (::access("/proc/self/fd", X_OK) == 0) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
#endif
  for (int attempt = 0; fd_ < 0 && attempt < kNameAttempts; ++attempt) {
    temp_path_ = temp_name();
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) {
    const int err = errno;
    temp_path_.clear();
    throw Error(concat(path_, ": cannot create a temporary file in ", dir_, ": ", std::strerror(err)));
  }
  maybe_kill(KillAt::bytes);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
}

std::string AtomicFile::temp_name() const {
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(rd()));
  std::string name = ".";  // built by appending: GCC 12 warns falsely on "." + string (-Wrestrict)
  name += fs::path(path_).filename().string();
  name += ".tmp-";
  name += suffix;
  return (fs::path(dir_) / name).string();
}

void AtomicFile::maybe_kill(KillAt stage) const {
  if (stage != kill_at_ || (stage == KillAt::bytes && written_ < kill_bytes_)) return;
  std::raise(SIGKILL);
}

void AtomicFile::write(const void* src, size_t bytes) {
  MIXPREC_ASSERT(fd_ >= 0 && !committed_, "AtomicFile::write after commit");
  const auto* p = static_cast<const char*>(src);
  while (bytes > 0) {
    size_t chunk = std::min(bytes, kMaxWriteBytes);
    // The test hook stops exactly at its byte (maybe_kill: written_ < kill_bytes_ here).
    if (kill_at_ == KillAt::bytes) chunk = std::min<uint64_t>(chunk, kill_bytes_ - written_);
    const ssize_t r = ::write(fd_, p, chunk);
    if (r < 0 && errno == EINTR) continue;
    MIXPREC_CHECK(r > 0, path_, ": write failed at byte ", written_, ": ", r < 0 ? std::strerror(errno) : "no space");
    p += r;
    bytes -= size_t(r);
    written_ += uint64_t(r);
    maybe_kill(KillAt::bytes);
  }
}

void AtomicFile::commit() {
  MIXPREC_ASSERT(fd_ >= 0 && !committed_, "AtomicFile::commit twice");
  MIXPREC_CHECK(::fsync(fd_) == 0, path_, ": syncing the written file (", written_,
                " bytes) failed: ", std::strerror(errno));
  maybe_kill(KillAt::synced);
  if (temp_path_.empty()) {
    // rename() needs a name; linkat cannot replace the target itself (it fails on an existing one).
    const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
    for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
      const std::string name = temp_name();
      if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
        temp_path_ = name;
        break;
      }
      MIXPREC_CHECK(errno == EEXIST, path_, ": cannot name the temporary file in ", dir_, ": ", std::strerror(errno));
    }
    MIXPREC_CHECK(!temp_path_.empty(), path_, ": cannot find a free temporary name in ", dir_);
  }
  maybe_kill(KillAt::linked);
  MIXPREC_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, path_, ": cannot rename ", temp_path_,
                " over it: ", std::strerror(errno));
  temp_path_.clear();
  committed_ = true;
  ::close(fd_);
  fd_ = -1;
  maybe_kill(KillAt::renamed);
  sync_directory(dir_, path_);
}

}  // namespace mixprec::io
