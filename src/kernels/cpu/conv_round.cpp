// A convolution's f32 output in oneDNN's nChw16c layout rounded once into the caller's 16-bit NCHW
// tensor (dnnl_conv.h, round_nchw16c): the f32 road's last cast done from the primitive's layout,
// where oneDNN's reorder into NCHW f32 and a cast pass after it each went through memory.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

// r[i][j] <- r[j][i] for a 16 x 16 block of f32: pairs, quads, then 128-bit lanes twice.
__attribute__((target("avx512f"))) void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
  }
}

// One block of 16 channels of one image: s [hw][16] f32 -> `channels` planes of hw 16-bit values at
// d, d + hw, ...; 16 positions at a time, transposed so that each channel's 16 values round as one
// vector (bf16 by the scalar rule, bf16_round_epi32; f16 by VCVTPS2PH to nearest: convert()'s bits).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void round_block(const float* s, int64_t hw, int64_t channels,
                                                                      bool f16, uint16_t* d) {
  for (int64_t p = 0; p < hw; p += 16) {
    const int64_t len = std::min<int64_t>(16, hw - p);
    __m512 r[16];
    for (int64_t i = 0; i < 16; ++i) r[i] = i < len ? _mm512_loadu_ps(s + (p + i) * 16) : _mm512_setzero_ps();
    transpose16(r);
    const __mmask16 m = first_lanes(len);
    for (int64_t c = 0; c < channels; ++c) {
      const __m256i h = f16 ? _mm512_cvtps_ph(r[c], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                            : _mm512_cvtepi32_epi16(bf16_round_epi32(r[c]));
      _mm256_mask_storeu_epi16(d + c * hw + p, m, h);
    }
  }
}

}  // namespace

bool is_f32_nchw16c(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& m = md.data;
  if (m.ndims != 4 || m.data_type != dnnl_f32 || m.format_kind != dnnl_blocked || m.offset0 != 0 ||
      m.extra.flags != 0 || !mixprec::cpu::has_avx512bw())
    return false;
  const auto& b = m.format_desc.blocking;
  const int64_t n = m.dims[0], c = m.dims[1], hw = m.dims[2] * m.dims[3], cp = (c + 15) / 16 * 16;
  return b.inner_nblks == 1 && b.inner_blks[0] == 16 && b.inner_idxs[0] == 1 && m.padded_dims[0] == n &&
         m.padded_dims[1] == cp && m.padded_dims[2] == m.dims[2] && m.padded_dims[3] == m.dims[3] &&
         b.strides[0] == cp * hw && b.strides[1] == 16 * hw && b.strides[2] == 16 * m.dims[3] && b.strides[3] == 16;
}

void round_nchw16c(const float* src, int64_t n, int64_t c, int64_t hw, DType t, void* dst) {
  const int64_t blocks = (c + 15) / 16;
  auto* const d = static_cast<uint16_t*>(dst);
  const bool f16 = t == DType::f16;
#pragma omp parallel for schedule(static) if (n * blocks * hw >= 4096)
  for (int64_t nb = 0; nb < n * blocks; ++nb) {
    const int64_t i = nb / blocks, b = nb % blocks;
    round_block(src + nb * 16 * hw, hw, std::min<int64_t>(16, c - b * 16), f16, d + (i * c + b * 16) * hw);
  }
}

}  // namespace mixprec::kernels::cpu
