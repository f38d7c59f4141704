// Timing probe (not a test): the host's arithmetic ceiling, every thread at once, in register-only
// loops (bench/peak_rates.h): f32 FMAs at the widest vector the CPU has, and bf16 products on its
// fastest bf16 unit (AMX tiles, else AVX512-BF16's VDPBF16PS, else f32 FMAs: a host without a bf16
// unit computes bf16 products in f32). No training step of either dtype can run its FLOPs faster;
// bench/figures.py divides each model's step by it ("share of the peak") and bounds the speed-up
// over PyTorch any step could have ("at most, over PyTorch"). Best of five runs of about 0.2 s each;
// one JSON line on stdout.
//
//   cmake --build build --target peak_probe
//   OMP_NUM_THREADS=2 build/peak_probe
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench/peak_rates.h"
#include "mixprec/cpu.h"

namespace {

using namespace mixprec;

// GFLOP/s of rate(n) on every thread at once, each thread's own rate summed (the runs start at a
// barrier and take the same time); n is first sized so that one run takes about 0.2 s.
template <class Rate>
double all_threads(Rate rate) {
  long n = 1 << 12;
  for (;;) {  // one thread, to size n
    const auto t0 = std::chrono::steady_clock::now();
    rate(n);
    const double seconds = bench::seconds_since(t0);
    if (seconds > 0.02) {
      n = long(double(n) * 0.2 / seconds);
      break;
    }
    n *= 4;
  }
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
#pragma omp barrier
      total += rate(n);
    }
    best = std::max(best, total);
  }
  return best;
}

}  // namespace

int main() {
  const int threads = omp_get_max_threads();
  std::string f32_unit = "none", bf16_unit;
  double f32 = 0, bf16 = 0;
  if (cpu::has_avx512f()) {
    f32_unit = "AVX-512 FMA";
    f32 = all_threads(bench::fma_f32_gflops);
  } else if (cpu::has_avx2_fma()) {
    f32_unit = "AVX2 FMA";
    f32 = all_threads(bench::fma_f32_avx2_gflops);
  }
  if (cpu::has_amx_bf16()) {
    bf16_unit = "AMX TDPBF16PS";
    bf16 = all_threads(bench::amx_bf16_gflops);
  } else if (cpu::has_avx512_bf16()) {
    bf16_unit = "AVX512-BF16 VDPBF16PS";
    bf16 = all_threads(bench::dot_bf16_gflops);
  }
  if (bf16 < f32) {  // no bf16 unit, or one no faster than f32 (Intel without AMX): products in f32
    bf16_unit = "f32 FMA (" + f32_unit + ")";
    bf16 = f32;
  }
  std::printf(
      "{\"threads\": %d, \"f32_gflops\": %.1f, \"f32_unit\": \"%s\", \"bf16_gflops\": %.1f, \"bf16_unit\": \"%s\"}\n",
      threads, f32, f32_unit.c_str(), bf16, bf16_unit.c_str());
  return 0;
}
