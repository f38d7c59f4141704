// When a CPU pass is worth an OpenMP parallel region: the one rule behind every kernel's threshold.
#pragma once
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace mixprec::detail {

// A parallel region starts by handing its work to the pool's other threads. With libgomp's default
// wait policy they spin for a while after a region and take the next one in about a microsecond;
// with OMP_WAIT_POLICY=passive they sleep at once, and each region first wakes them: a futex wake
// and, on a virtual machine, the sleeping vCPU's return, 60-80 us on our KVM hosts against 0.6-11 us
// with the default (docs/design.md, Threads). The thresholds the kernels were tuned with (the
// default policy) are therefore multiplied under `passive`: a pass then needs about 16 times the
// work, some 100 us on one thread, before a second thread pays for its wake-up.
inline int64_t parallel_work_factor() {
  static const int64_t factor = [] {
    const char* p = std::getenv("OMP_WAIT_POLICY");  // libgomp's own reading: case-insensitive
    std::string v = p ? p : "";
    for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
    return v == "passive" ? int64_t(16) : int64_t(1);
  }();
  return factor;
}

// Whether `work` (elements, blocks or bytes: the unit of the caller's `min_work`) is enough for a
// parallel region, where min_work is the kernel's threshold under the default wait policy.
inline bool parallel_worth(int64_t work, int64_t min_work) { return work >= min_work * parallel_work_factor(); }

}  // namespace mixprec::detail
