// e^x on 16 f32 lanes (AVX-512), shared by the fast activation and attention kernels.
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

}  // namespace mixprec::kernels::cpu
