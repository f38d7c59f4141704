// core/simd.h's AVX2 rounding helpers against convert()'s scalar rule, bit for bit: every bf16
// (and, through f32, every f16) neighbourhood, with the low halves where rounding decides (ties
// to even either way, one above and below them), infinities, NaNs (quieted, sign and top payload
// kept), subnormals and overflow into infinity.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/simd.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"

namespace mixprec {
namespace {

// f32 bit patterns: every high half with low halves around bf16's ties (bit 15) and f16's (bit 12
// of a normal f16's f32 mantissa, and its subnormals' further up), and the extremes.
std::vector<uint32_t> patterns() {
  std::vector<uint32_t> v;
  for (uint32_t high = 0; high < 0x10000u; ++high)
    for (uint32_t low :
         {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu})
      v.push_back(high << 16 | low);
  while (v.size() % 8 != 0) v.push_back(0);
  return v;
}

__attribute__((target("avx2,f16c"))) void round_avx2(const float* x, size_t n, uint16_t* b16, float* b16_kept,
                                                     uint16_t* f16, float* f16_kept) {
  for (size_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b16 + i), round16_avx2(v, false));
    _mm256_storeu_ps(b16_kept + i, round16_keep_avx2(v, false));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(f16 + i), round16_avx2(v, true));
    _mm256_storeu_ps(f16_kept + i, round16_keep_avx2(v, true));
  }
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Simd, Avx2RoundingGivesConvertsBits) {
  if (!cpu::has_avx2_fma()) GTEST_SKIP() << "no AVX2 on this CPU: the helpers are not run";
  const std::vector<uint32_t> p = patterns();
  const size_t n = p.size();
  std::vector<float> x(n);
  std::memcpy(x.data(), p.data(), n * 4);
  std::vector<uint16_t> b16(n), f16(n), want16(n);
  std::vector<float> b16_kept(n), f16_kept(n), want_kept(n);
  round_avx2(x.data(), n, b16.data(), b16_kept.data(), f16.data(), f16_kept.data());
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    convert(x.data(), DType::f32, want16.data(), t, n);
    convert(want16.data(), t, want_kept.data(), DType::f32, n);
    const std::vector<uint16_t>& got16 = t == DType::bf16 ? b16 : f16;
    const std::vector<float>& kept = t == DType::bf16 ? b16_kept : f16_kept;
    int64_t bad = 0;
    for (size_t i = 0; i < n && bad < 5; ++i)
      if (got16[i] != want16[i] || bits(kept[i]) != bits(want_kept[i])) {
        ADD_FAILURE() << std::hex << "input 0x" << p[i] << ": 16 bits 0x" << got16[i] << " (convert 0x" << want16[i]
                      << "), kept 0x" << bits(kept[i]) << " (0x" << bits(want_kept[i]) << ")";
        ++bad;
      }
  }
}

}  // namespace
}  // namespace mixprec
