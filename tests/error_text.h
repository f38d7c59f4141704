// The message of the mixprec::Error a call throws, checked to be one line (the project's rule for
// user errors); a call that does not throw fails the test.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "mixprec/error.h"

namespace mixprec::testutil {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "expected mixprec::Error";
  return "";
}

}  // namespace mixprec::testutil
