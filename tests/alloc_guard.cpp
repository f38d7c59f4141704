// The test suite runs with the CPU allocator's guard on (src/core/allocator.cpp): a kernel that
// stores past its tensor's end aborts the test that ran it, however small the overrun. Set before
// main, so that it holds from the first allocation on, and inherited by the CLI processes the tests
// start. A variable already set (MIXPREC_ALLOC_GUARD=0, to time something) is left as it is.
#include <cstdlib>

namespace {
[[maybe_unused]] const int kAllocGuard = setenv("MIXPREC_ALLOC_GUARD", "1", 0);
}  // namespace
