// e^x on 16 f32 lanes (AVX-512), shared by the fast activation and attention kernels, and on 8 (AVX2).
#pragma once
#include "core/simd.h"

namespace mixprec::kernels::cpu {

// e^x, Cephes expf: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact n ln2),
// e^r = 1 + r + r^2 p(r), then 2^n by scalef, which also gives inf above 88.72 and 0 far below.
// x is clamped first so inf and -inf give inf and 0, not inf - inf; NaN passes through.
__attribute__((target("avx512f"))) inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));  // NaN stays x
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

// e^x to 3e-6 relative, for values rounded to bf16 next (8 significant bits: the bf16 attention
// tiles' probabilities, which its products read rounded, and the f32 sums of them, whose error it
// leaves three orders under bf16's): exp_ps's reduction (x = n ln2 + r, |r| <= ln2/2, ln2 in two
// parts), then e^r by a degree-4 polynomial fitted for relative error on that interval (2.6e-6 at
// most, plus f32's roundings) where exp_ps has degree 7, and 2^n by scalef: 10 instructions
// against 17. For x <= 0 (a score less its row's max or log-sum-exp, in the uses): x is clamped at
// -86 (e^-86 = 4.5e-38, over the normal range's foot, 1.2e-38), so no result is subnormal (each
// would take a microcode assist) and e^-inf is 4.5e-38, not 0: the uses mask the lanes that must
// be zero. NaN passes through.
__attribute__((target("avx512f"))) inline __m512 exp_bf16_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-86.f), x);  // NaN stays x
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(0.04145865887403488f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.16790908575057983f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5000435709953308f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.9999634027481079f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.9999992847442627f));
  return _mm512_scalef_ps(p, n);
}

// The same e^x on 8 lanes (AVX2 and FMA, hosts without AVX-512): the same reduction and polynomial;
// 2^n, which AVX2 has no scalef for, as two factors 2^(n/2) and 2^(n - n/2) built in the exponent
// bits, each a normal number over the clamped range, so inf above 88.72 and 0 far below come out
// of the two products as they do of scalef.
// 2^k for integer k in [-126, 127], from its exponent bits.
__attribute__((target("avx2"))) inline __m256 pow2_256(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

__attribute__((target("avx2,fma"))) inline __m256 exp256_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(89.f), _mm256_max_ps(_mm256_set1_ps(-104.f), x));  // NaN stays x
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is integral; a NaN lane's y is NaN anyway
  const __m256i half = _mm256_srai_epi32(ni, 1), rest = _mm256_sub_epi32(ni, half);
  return _mm256_mul_ps(_mm256_mul_ps(y, pow2_256(half)), pow2_256(rest));
}

}  // namespace mixprec::kernels::cpu
