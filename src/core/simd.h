// <immintrin.h> for the AVX-512 kernels (each function carries its own target attribute).
#pragma once

// GCC < 12.3 warns about the deliberately undefined merge operands inside its own AVX-512
// intrinsics once they are inlined (GCC bug 105593); the pragma covers only that header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstdint>

namespace mixprec {
// The first n of 16 lanes (none for n <= 0, all from 16): a loop's masked tail or edge.
inline __mmask16 first_lanes(int64_t n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}
}  // namespace mixprec
