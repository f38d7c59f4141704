// The device flag of an index out of its range (nll_loss's targets, embedding's indices): a kernel
// cannot throw, and a check on the host would wait for the GPU, so the first bad index is recorded
// here and thrown at the host's next wait (report_bad_targets, loss.cu). CUDA builds only.
#pragma once
#include <cstdint>

namespace mixprec::kernels::cuda {

enum BadIndexOf : int { kNllTarget = 0, kEmbeddingIndex = 1 };

struct BadIndex {
  int flag;  // 0: none recorded since the last report
  int of;    // BadIndexOf
  long long index, value, limit;
};

// True when 0 <= v < limit; else records (i, v) unless a bad index is recorded already.
__device__ __forceinline__ bool check_index(BadIndex* bad, BadIndexOf of, int64_t i, int64_t v, int64_t limit) {
  if (v >= 0 && v < limit) return true;
  if (atomicCAS(&bad->flag, 0, 1) == 0) {
    bad->of = of;
    bad->index = i;
    bad->value = v;
    bad->limit = limit;
  }
  return false;
}

// The current device's flag (one __device__ variable per GPU, in loss.cu), for kernels of other
// files: device pointers are valid across translation units, __device__ symbols are not without
// relocatable device code.
BadIndex* bad_index_flag();

}  // namespace mixprec::kernels::cuda
