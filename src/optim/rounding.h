// Stochastic rounding of f32 into bf16/f16 (round up with probability equal to the distance
// from the lower neighbour, so the expected stored value is the f32 value), and its random
// stream: the Philox words of Generator(seed).split(step).split(parameter), element e taking
// word e, so the bits are the same for any thread count and need no saved state (the step
// count is in the optimizer's state_dict).
#pragma once
#include <cmath>
#include <cstdint>

#include "mixprec/convert.h"
#include "mixprec/random.h"

namespace mixprec::optim {

inline Generator rounding_stream(uint64_t seed, uint64_t step, uint64_t param) {
  return Generator(seed).split(step).split(param);
}

// bf16 keeps the top 16 bits of the f32: adding 16 random bits below them rounds up with
// probability low16 / 2^16 (llm.c's stochastic_rounding). NaN stays NaN; inf stays inf.
inline uint16_t f32_to_bf16_stochastic(float x, uint32_t r) {
  if (std::isnan(x)) return f32_to_bf16(x);
  return uint16_t((f32_to_bits(x) + (r & 0xffffu)) >> 16);
}

// f16: pick between the two neighbours of |x| with probability by distance (subnormals
// included); |x| >= 65520 goes to inf as round-to-nearest does, so overflow stays visible.
inline uint16_t f32_to_f16_stochastic(float x, uint32_t r) {
  if (!std::isfinite(x)) return f32_to_f16(x);
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  const float a = std::fabs(x);
  const uint16_t h = f32_to_f16(a);
  if (h >= 0x7c00u) return uint16_t(sign | h);
  const float y = f16_to_f32(h);
  if (y == a) return uint16_t(sign | h);
  const uint16_t lo = y < a ? h : uint16_t(h - 1), hi = uint16_t(lo + 1);
  const float flo = f16_to_f32(lo), fhi = f16_to_f32(hi);
  const float p = (a - flo) / (fhi - flo);   // in (0, 1); fhi = inf only above 65504: p = 0
  const float u = float(r >> 8) * 0x1p-24f;  // uniform in [0, 1)
  return uint16_t(sign | (u < p ? hi : lo));
}

}  // namespace mixprec::optim
