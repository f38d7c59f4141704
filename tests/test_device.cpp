// Device names and the clear error for a GPU that is not there.
#include <gtest/gtest.h>

#include "cli_util.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec {
namespace {

TEST(Device, ParsesPyTorchSpellings) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda:3").str(), "cuda:3");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""}) {
    try {
      (void)Device::parse(bad);
      ADD_FAILURE() << "parsed '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "unknown device '" + std::string(bad) + "': expected cpu, cuda or cuda:N");
    }
  }
}

TEST(Device, RequireNamesTheMissingGpu) {
  EXPECT_NO_THROW(cuda::require(Device::cpu()));
  const int n = cuda::device_count();
  try {
    cuda::require(Device::cuda(n));  // one past the last GPU, or cuda:0 where there is none
    ADD_FAILURE() << "cuda:" << n << " accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("device cuda:" + std::to_string(n) + " asked for"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    if (n == 0) {
      EXPECT_FALSE(cuda::unavailable_reason().empty());
      EXPECT_NE(msg.find(cuda::unavailable_reason()), std::string::npos) << msg;
    }
  }
}

TEST(Device, DevicesAgreeWithTheCount) {
  EXPECT_EQ(int(cuda::devices().size()), cuda::device_count());
  if (!cuda::built()) {
    EXPECT_EQ(cuda::device_count(), 0);
    EXPECT_EQ(cuda::toolkit_version(), "");
  }
}

class DeviceCli : public clitest::TempDirTest {};

TEST_F(DeviceCli, VersionAndDevicesSayWhatIsThere) {
  clitest::RunResult v = clitest::run_cli("--version", dir_);
  ASSERT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.out.find(cuda::built() ? "support built in" : "built without CUDA support"), std::string::npos) << v.out;
  clitest::RunResult d = clitest::run_cli("devices", dir_);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out.rfind("cpu: ", 0), 0u) << d.out;
  if (cuda::device_count() == 0)
    EXPECT_NE(d.out.find("cuda: none (" + cuda::unavailable_reason() + ")"), std::string::npos) << d.out;
  else
    EXPECT_NE(d.out.find("cuda:0: "), std::string::npos) << d.out;
}

}  // namespace
}  // namespace mixprec
