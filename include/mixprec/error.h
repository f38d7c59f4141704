// Errors: user mistakes throw mixprec::Error (one line: what, where, expected); broken internal
// invariants abort with file:line (MIXPREC_ASSERT).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mixprec {

// A user's mistake: bad shape, dtype, file, flag or call order. The message is one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The allocator's budget (the CPU stand-in for a GPU's memory limit) would be exceeded.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "mixprec: internal error: %s:%d: %s %s\n", file, line, expr, msg.c_str());
  std::abort();
}
}  // namespace detail

}  // namespace mixprec

// User error: throw mixprec::Error with the streamed message parts.
#define MIXPREC_CHECK(cond, ...)                                                 \
  do {                                                                           \
    if (!(cond)) throw ::mixprec::Error(::mixprec::detail::concat(__VA_ARGS__)); \
  } while (0)

// Internal invariant: abort with file:line.
#define MIXPREC_ASSERT(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::mixprec::detail::assert_fail(#cond, __FILE__, __LINE__,                                 \
                                     ::mixprec::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
