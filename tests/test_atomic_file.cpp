// Atomic writes: a save killed (SIGKILL) at any byte and at every step of the commit leaves the
// previous checkpoint intact and loadable; a failed write removes its temporary; a commit replaces.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "error_text.h"
#include "io/atomic_file.h"
#include "mixprec/io.h"

namespace mixprec::io {
namespace {

namespace fs = std::filesystem;
using clitest::slurp;

class AtomicWrite : public clitest::TempDirTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The names in the directory other than keep.
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != keep) names.push_back(e.path().filename().string());
    return names;
  }
};

// Runs f in a child process and returns its wait status (f's return value is the exit code).
template <class F>
int in_child(F f) {
  const pid_t pid = fork();
  if (pid == 0) _exit(f());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

StateDict checkpoint(float base, int tensors) {
  StateDict sd;
  for (int i = 0; i < tensors; ++i) {
    std::vector<float> v(size_t(40 + 17 * i));
    for (size_t j = 0; j < v.size(); ++j) v[j] = base + float(i) + 0.25f * float(j);
    sd.emplace_back("layer" + std::to_string(i) + ".weight", Tensor::from_vector(v, {int64_t(v.size())}));
  }
  sd.emplace_back("step", state_i64(int64_t(base)));
  return sd;
}

TEST_F(AtomicWrite, ASaveKilledAtAnyPointLeavesThePreviousCheckpointLoadable) {
  const std::string p = path("ck.st");
  save_safetensors(p, checkpoint(1, 3), {{"epoch", "1"}});
  const std::string old_bytes = slurp(p);
  const StateDict next = checkpoint(2, 6);
  save_safetensors(path("next.st"), next, {{"epoch", "2"}});
  const std::string new_bytes = slurp(path("next.st"));
  fs::remove(path("next.st"));
  const bool unnamed = AtomicFile(p).temporary_is_unnamed();  // how this filesystem's temporaries look

  // Every byte count over the first 128 bytes (the length and the header), then a stride through
  // the data, the last bytes, and each step of the commit.
  std::vector<std::string> points;
  for (size_t n = 0; n < new_bytes.size(); n += n < 128 ? 1 : 23) points.push_back(std::to_string(n));
  for (size_t n = new_bytes.size() - 3; n <= new_bytes.size(); ++n) points.push_back(std::to_string(n));
  points.insert(points.end(), {"synced", "linked", "renamed"});
  ASSERT_GT(new_bytes.size(), 1000u);
  for (const std::string& point : points) {
    SCOPED_TRACE("killed at " + point);
    const int status = in_child([&] {
      setenv("MIXPREC_TEST_KILL_WRITE_AT", point.c_str(), 1);
      try {
        save_safetensors(p, next, {{"epoch", "2"}});
      } catch (...) {
        return 2;
      }
      return 0;  // not killed: the test fails below
    });
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

    const bool done = point == "renamed";  // killed after the rename: the new file is complete
    const SafetensorsFile f = load_safetensors(p);
    EXPECT_EQ(f.metadata.at("epoch"), done ? "2" : "1");
    EXPECT_EQ(slurp(p), done ? new_bytes : old_bytes);
    // An unnamed temporary dies with the process; a named one (from "linked" on, or on a
    // filesystem without O_TMPFILE) stays as ".ck.st.tmp-XXXXXXXX" beside the checkpoint.
    const std::vector<std::string> left = others("ck.st");
    if (unnamed && point != "linked") {
      EXPECT_TRUE(left.empty()) << left.front();
    }
    EXPECT_LE(left.size(), 1u);
    for (const std::string& name : left) {
      EXPECT_EQ(name.rfind(".ck.st.tmp-", 0), 0u) << name;
      fs::remove(dir_ / name);
    }
    if (done) save_safetensors(p, checkpoint(1, 3), {{"epoch", "1"}});
  }
}

TEST_F(AtomicWrite, AFailedWriteRemovesItsTemporaryAndLeavesTheTarget) {
  const std::string p = path("ck.st");
  save_safetensors(p, checkpoint(1, 2));
  const std::string before = slurp(p);
  // A file size limit makes write() fail part-way (EFBIG), as a full disk would (ENOSPC).
  const int status = in_child([&] {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1000, 1000};
    setrlimit(RLIMIT_FSIZE, &limit);
    const std::string what = testutil::error_of([&] { save_safetensors(p, checkpoint(2, 8)); });
    const bool ok = what == p + ": write failed at byte 1000: File too large";
    if (!ok) fprintf(stderr, "unexpected: %s\n", what.c_str());
    return ok ? 0 : 1;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(slurp(p), before);
  EXPECT_TRUE(others("ck.st").empty());
}

TEST_F(AtomicWrite, WithoutCommitNothingChanges) {
  const std::string p = path("out.bin");
  {
    AtomicFile f(p);
    f.write("abc", 3);
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(others("").empty());
  {
    AtomicFile f(p);
    f.write("abc", 3);
    f.write("de", 2);
    EXPECT_EQ(f.bytes_written(), 5u);
    f.commit();
  }
  EXPECT_EQ(slurp(p), "abcde");
  EXPECT_EQ(others("out.bin"), std::vector<std::string>{});
}

TEST_F(AtomicWrite, ABadTestHookIsRefused) {
  const std::string p = path("out.bin");
  const int status = in_child([&] {
    setenv("MIXPREC_TEST_KILL_WRITE_AT", "soon", 1);
    const std::string what = testutil::error_of([&] { AtomicFile f(p); });
    return what == "MIXPREC_TEST_KILL_WRITE_AT=soon: expected a byte count, synced, linked or renamed" ? 0 : 1;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace mixprec::io
