// Timing probe (not a test): what one empty OpenMP parallel region costs on this host, back to
// back and after a stretch of serial work (a kernel's region after the step's serial code), under
// whatever OMP_WAIT_POLICY the run has; and one whose `if` clause is false (a team of one, which
// still ends in a futex wake: `strace -c` counts one a region). docs/design.md (Threads) and
// docs/hosts.md quote it.
//
//   cmake --build build --target omp_region_cost
//   OMP_WAIT_POLICY=passive build/omp_region_cost [regions=2000] [gap_us=100]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

volatile int sink = 0;
volatile bool never = false;  // the `if` clause's value, read at run time as a kernel's test is

// Mean microseconds of one empty region, each after gap_us of serial spinning (0: back to back).
double mean_region_us(int regions, double gap_us) {
  double total = 0;
  for (int i = 0; i < regions; ++i) {
    if (gap_us > 0)
      for (const auto t = Clock::now(); us_since(t) < gap_us;) {
      }
    const auto t0 = Clock::now();
#pragma omp parallel
    { sink = omp_get_thread_num(); }
    total += us_since(t0);
  }
  return total / regions;
}

// Mean microseconds of one region whose `if` is false, back to back.
double mean_if_false_us(int regions) {
  const auto t0 = Clock::now();
  for (int i = 0; i < regions; ++i) {
#pragma omp parallel if (never)
    { sink = omp_get_thread_num(); }
  }
  return us_since(t0) / regions;
}

}  // namespace

int main(int argc, char** argv) {
  const int regions = argc > 1 ? std::atoi(argv[1]) : 2000;
  const double gap_us = argc > 2 ? std::atof(argv[2]) : 100.0;
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  for (int round = 0; round < 3; ++round)
    std::printf(
        "{\"bench\":\"omp_region\",\"threads\":%d,\"wait_policy\":\"%s\",\"round\":%d,\"after_gap_us\":%.0f,"
        "\"region_us_after_gap\":%.2f,\"region_us_back_to_back\":%.2f,\"region_us_if_false\":%.2f}\n",
        omp_get_max_threads(), policy ? policy : "(default)", round, gap_us, mean_region_us(regions, gap_us),
        mean_region_us(regions, 0), mean_if_false_us(regions));
  return 0;
}
