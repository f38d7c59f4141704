// Counts the OpenMP parallel regions a process starts with more than one thread, by the address
// that started them: an LD_PRELOAD library around libgomp's GOMP_parallel (what GCC emits for
// `#pragma omp parallel`, in mixprec and in oneDNN alike). At exit it writes "count object offset"
// lines to $COUNT_REGIONS_OUT; bench/count_regions.py turns two runs into regions per step by
// caller. A region whose `if` clause was false (one thread) wakes nobody and is not counted; with
// COUNT_REGIONS_ONE_THREAD=1 only those are (each still costs a team of one and a futex call:
// docs/design.md, Threads).
//   cmake --build build --target count_regions   (build/libcount_regions.so)
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

constexpr unsigned kSlots = 4096;
std::atomic<void*> callers[kSlots];
std::atomic<long> counts[kSlots];

void count(void* at) {
  for (unsigned h = unsigned((reinterpret_cast<uintptr_t>(at) >> 2) % kSlots), probes = 0; probes < kSlots;
       h = (h + 1) % kSlots, ++probes) {
    void* seen = nullptr;
    if (callers[h].compare_exchange_strong(seen, at) || seen == at) {
      counts[h].fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

__attribute__((destructor)) void write_counts() {
  const char* path = std::getenv("COUNT_REGIONS_OUT");
  FILE* out = path ? std::fopen(path, "w") : nullptr;
  if (!out) return;
  for (unsigned i = 0; i < kSlots; ++i) {
    Dl_info info;
    void* at = callers[i].load();
    if (!at || !dladdr(at, &info)) continue;
    std::fprintf(out, "%ld %s 0x%lx\n", counts[i].load(), info.dli_fname,
                 static_cast<unsigned long>(static_cast<char*>(at) - static_cast<char*>(info.dli_fbase)));
  }
  std::fclose(out);
}

}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  static const auto real = reinterpret_cast<GompParallel>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  static const bool one_thread = [] {
    const char* v = std::getenv("COUNT_REGIONS_ONE_THREAD");
    return v != nullptr && v[0] == '1';
  }();
  if ((num_threads == 1) == one_thread) count(__builtin_return_address(0));
  real(fn, data, num_threads, flags);
}
