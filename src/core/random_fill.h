// The bulk-draw loop shared by the random fills of core (uniform, normal) and the dropout-mask
// kernel: blocks of one reservation turned into values in f64, rounded once to the dtype.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "mixprec/convert.h"
#include "mixprec/random.h"

namespace mixprec::detail {

// Writes n values of `dtype` at dst: block first_block + k of gen gives values
// k * kPerBlock .. k * kPerBlock + kPerBlock - 1, computed by value(words, out) in f64. Parallel
// over chunks of whole blocks; each value depends only on its block, not on the thread count.
template <int kPerBlock, class Value>
void fill_from_blocks(void* dst, DType dtype, int64_t n, uint64_t first_block, const Generator& gen,
                      const Value& value) {
  constexpr int64_t kChunk = 1024;  // elements per task, a multiple of kPerBlock
  static_assert(kChunk % kPerBlock == 0);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const size_t es = dtype_size(dtype);
#pragma omp parallel for schedule(static) if (chunks >= 16)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    double buf[kChunk];
    for (int64_t j = 0; j < len; j += kPerBlock) {
      const std::array<uint32_t, 4> w = gen.block(first_block + uint64_t((begin + j) / kPerBlock));
      double v[kPerBlock];
      value(w, v);
      std::copy(v, v + std::min<int64_t>(kPerBlock, len - j), buf + j);
    }
    convert(buf, DType::f64, static_cast<char*>(dst) + size_t(begin) * es, dtype, size_t(len));
  }
}

}  // namespace mixprec::detail
