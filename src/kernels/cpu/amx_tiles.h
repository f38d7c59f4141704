// The AMX tile configuration of mixprec's own AMX kernels (the attention's tiles,
// attention_amx.cpp; the wide convolutions' weight gradient, conv_wgrad_amx.cpp): palette 1, all
// eight tiles 16 rows of 64 bytes, loaded by LDTILECFG and dropped by TILERELEASE around each use
// (oneDNN's AMX kernels load their own configurations between ours).
#pragma once
#include <cstdint>

#include "core/simd.h"  // <immintrin.h>

namespace mixprec::kernels::cpu::amx {

// LDTILECFG's 64-byte operand.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig tiles_16x64() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  return cfg;
}
// A constant in memory: GCC's LDTILECFG asm takes only the pointer, so the stores of a local
// configuration looked dead to it and were dropped (the tiles then faulted: SIGILL).
inline constexpr TileConfig kTiles16x64 = tiles_16x64();

__attribute__((target("amx-tile"))) inline void configure() { _tile_loadconfig(&kTiles16x64); }
__attribute__((target("amx-tile"))) inline void release() { _tile_release(); }

}  // namespace mixprec::kernels::cpu::amx
