// Scalar and bulk conversions between f32 and the 16-bit floats (bf16, f16), plus any-to-any.
// Round-to-nearest-even, NaN stays NaN (quiet), overflow goes to inf, f16 subnormals kept.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mixprec/dtype.h"

namespace mixprec {

// 16-bit storage types. Plain bit containers: arithmetic goes through float.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- scalar conversions (the reference: bulk conversions must agree bit for bit) ----
inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
uint16_t f32_to_bf16(float f);  // RNE; NaN -> quiet NaN with sign kept
float f16_to_f32(uint16_t h);   // exact, subnormals included
uint16_t f32_to_f16(float f);   // RNE; |f| >= 65520 -> inf; subnormals down to 2^-24; NaN kept

inline float to_f32(bf16_t v) { return bf16_to_f32(v.bits); }
inline float to_f32(f16_t v) { return f16_to_f32(v.bits); }

// ---- bulk conversions: vectorised (AVX512-BF16 / AVX512-FP16 / F16C) when the CPU has it ----
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);

// Any dtype to any dtype over n contiguous elements (float->int truncates toward zero).
void convert(const void* src, DType src_t, void* dst, DType dst_t, size_t n);

namespace detail {
// Test hooks: which code the bulk conversions run (tests compare each with the scalar reference).
// best: the fastest this CPU has (AVX512-BF16, AVX-512F or AVX2); avx512f: f32 -> bf16 in AVX-512F integer lanes even
// where AVX512-BF16 is there (the code of CPUs without it); scalar: the reference loops.
enum class ConversionPath { best, avx512f, scalar };
ConversionPath set_conversion_path(ConversionPath path);  // returns the old one
// Sets the path for its lifetime and restores the one before (a test's loop over the paths).
class ConversionPathScope {
 public:
  explicit ConversionPathScope(ConversionPath path) : prev_(set_conversion_path(path)) {}
  ~ConversionPathScope() { set_conversion_path(prev_); }
  ConversionPathScope(const ConversionPathScope&) = delete;
  ConversionPathScope& operator=(const ConversionPathScope&) = delete;

 private:
  ConversionPath prev_;
};
// The vectorised paths this CPU can run (best alone on an AVX2 host, none without AVX2),
// and a name for each.
std::vector<ConversionPath> bulk_conversion_paths();
const char* conversion_path_name(ConversionPath path);
// Whether the kernels that round f32 to bf16 in registers (activations, attention rows, layer norm)
// use AVX512-BF16's VCVTNEPS2BF16: the CPU has it and the path is `best`; under `avx512f` they round
// in integer lanes, as on CPUs without it, so that a test can run that code here too.
bool native_bf16_rounding();
}  // namespace detail

}  // namespace mixprec
