// AtomicFile: writes a file so that its path holds either the old content or the whole new one,
// whatever happens to the process (crash, SIGKILL, power loss after commit() returns).
//
// The bytes go to a temporary file in the target's directory (the same filesystem, so rename is
// atomic): an unnamed O_TMPFILE inode where the filesystem has them, so a killed writer leaves
// nothing behind, else a uniquely named ".<name>.tmp-XXXXXXXX" beside the target. commit() syncs the
// file, gives it a temporary name (O_TMPFILE: linkat), renames it over the target and syncs the
// directory, so the rename itself is durable. Without commit() (an exception, an early return) the
// destructor removes the temporary and the target is untouched.
//
// Test hook: MIXPREC_TEST_KILL_WRITE_AT=N makes the writer SIGKILL its own process once N bytes are
// written (N = 0..size); =synced after the file's fsync, =linked once the temporary has a name,
// =renamed after the rename, before the directory's fsync. The crash tests (tests/test_atomic_file.cpp
// and the checkpoint tests) sweep it over a whole save.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mixprec::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates the temporary; throws mixprec::Error
  ~AtomicFile();                          // not committed: the temporary is removed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; a failure (disk full, I/O error) throws mixprec::Error naming the file and the
  // byte offset.
  void write(const void* src, size_t bytes);
  // Makes the written bytes the target's content, durably. Once only.
  void commit();

  uint64_t bytes_written() const { return written_; }
  // Whether the temporary is an unnamed O_TMPFILE inode (before commit), which a killed process
  // cannot leave behind.
  bool temporary_is_unnamed() const { return fd_ >= 0 && temp_path_.empty(); }

 private:
  enum class KillAt { never, bytes, synced, linked, renamed };
  void maybe_kill(KillAt stage) const;
  std::string temp_name() const;  // a fresh ".<name>.tmp-XXXXXXXX" in dir_

  std::string path_, dir_;
  std::string temp_path_;  // empty while the temporary is unnamed (O_TMPFILE)
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
  KillAt kill_at_ = KillAt::never;
  uint64_t kill_bytes_ = 0;
};

}  // namespace mixprec::io
