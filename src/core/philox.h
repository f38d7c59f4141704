// Philox 4x32-10 and the word -> unit-interval mappings, host and device alike: the CPU generator
// (core/random.cpp, core/random_fill.h, kernels/ref/random.cpp) and the CUDA kernels
// (kernels/cuda/random.cu) compute element i of a bulk draw from word i with this one code.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace mixprec::detail {

struct PhiloxWords {
  uint32_t w[4];
};

// Ten rounds of Philox's keyed bijection over a 128-bit counter (Salmon et al., SC'11; the
// constants of Random123's philox.h), words least significant first.
MIXPREC_HOST_DEVICE inline PhiloxWords philox4x32_10(PhiloxWords c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // the round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule: golden ratio, sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = uint64_t(kMul0) * c.w[0], p1 = uint64_t(kMul1) * c.w[2];
    c = {{uint32_t(p1 >> 32) ^ c.w[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c.w[3] ^ k1, uint32_t(p0)}};
  }
  return c;
}

// Block `index` of the stream (seed, stream): counter = (index, stream), key = seed.
MIXPREC_HOST_DEVICE inline PhiloxWords philox_block(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32_10({{uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// [0, 1) from the top 24 bits of one word (exact in f32 and f64), or the top 53 of two.
MIXPREC_HOST_DEVICE inline double unit24(uint32_t w) { return double(w >> 8) * 0x1p-24; }
MIXPREC_HOST_DEVICE inline double unit53(uint64_t w) { return double(w >> 11) * 0x1p-53; }

// Dropout's rule for element i from word i of one use of the generator: dropped when the word's
// 24-bit uniform is below p (the CPU reference and the CUDA kernel both call this).
MIXPREC_HOST_DEVICE inline bool dropout_drops(uint32_t word, double p) { return unit24(word) < p; }

}  // namespace mixprec::detail
