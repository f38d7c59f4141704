// The host's arithmetic peaks, in register-only loops (timing probes, not tests): one thread's f32
// FMA rate (VFMADD231PS, 512- or 256-bit) and bf16 dot-product rate (VDPBF16PS; TDPBF16PS on AMX
// tiles). bench/peak_probe.cpp runs them on every thread at once (the host's ceiling for any step,
// bench/figures.py); bench/bf16_road_probe.cpp on one. Each returns GFLOP/s over n iterations.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "core/simd.h"  // <immintrin.h>, as the kernels include it
#include "kernels/cpu/amx_tiles.h"

namespace mixprec::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Ten independent accumulators (more than either instruction's latency times its issue rate), each
// a variable of its own so that they stay in registers, and each starting from a value of its own:
// accumulators that all start at zero hold the same value at every step, and GCC folded the ten
// into one (a single dependent chain a step: the rates came out ten times the chain's latency-bound
// rate, bf16_road_probe's "rates" before 2026-12-07).
#define MIXPREC_TEN(op) \
  op(a0, 0) op(a1, 1) op(a2, 2) op(a3, 3) op(a4, 4) op(a5, 5) op(a6, 6) op(a7, 7) op(a8, 8) op(a9, 9)
#define MIXPREC_SUM(v, i) sum = _mm512_add_ps(sum, v);
#define MIXPREC_SUM256(v, i) sum = _mm256_add_ps(sum, v);

// Keeps a sum live without printing anything.
inline void keep(float s) { std::fprintf(stderr, "%s", s == 1 ? " " : ""); }
__attribute__((target("avx512f"))) inline void keep_ps(__m512 v) {
  alignas(64) float s[16];
  _mm512_store_ps(s, v);
  keep(s[0]);
}

__attribute__((target("avx512f,avx512bf16"))) inline double dot_bf16_gflops(long n) {
#define MIXPREC_ZERO(v, i) __m512 v = _mm512_set1_ps(float(i));
  MIXPREC_TEN(MIXPREC_ZERO)
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = x;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("" : "+v"(x), "+v"(y));
#define MIXPREC_DOT(v, i) v = _mm512_dpbf16_ps(v, x, y);
    MIXPREC_TEN(MIXPREC_DOT)
#undef MIXPREC_DOT
  }
  const double t = seconds_since(t0);
  __m512 sum = _mm512_setzero_ps();
  MIXPREC_TEN(MIXPREC_SUM)
  keep_ps(sum);
  return double(n) * 10 * 64 / t / 1e9;  // 32 products and 32 additions an instruction
}

__attribute__((target("avx512f"))) inline double fma_f32_gflops(long n) {
  MIXPREC_TEN(MIXPREC_ZERO)
#undef MIXPREC_ZERO
  __m512 x = _mm512_set1_ps(1), y = x;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("" : "+v"(x), "+v"(y));
#define MIXPREC_FMA(v, i) v = _mm512_fmadd_ps(x, y, v);
    MIXPREC_TEN(MIXPREC_FMA)
#undef MIXPREC_FMA
  }
  const double t = seconds_since(t0);
  __m512 sum = _mm512_setzero_ps();
  MIXPREC_TEN(MIXPREC_SUM)
  keep_ps(sum);
  return double(n) * 10 * 32 / t / 1e9;
}

__attribute__((target("avx2,fma"))) inline double fma_f32_avx2_gflops(long n) {
#define MIXPREC_ZERO256(v, i) __m256 v = _mm256_set1_ps(float(i));
  MIXPREC_TEN(MIXPREC_ZERO256)
#undef MIXPREC_ZERO256
  __m256 x = _mm256_set1_ps(1), y = x;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("" : "+x"(x), "+x"(y));
#define MIXPREC_FMA256(v, i) v = _mm256_fmadd_ps(x, y, v);
    MIXPREC_TEN(MIXPREC_FMA256)
#undef MIXPREC_FMA256
  }
  const double t = seconds_since(t0);
  __m256 sum = _mm256_setzero_ps();
  MIXPREC_TEN(MIXPREC_SUM256)
  alignas(32) float s[8];
  _mm256_store_ps(s, sum);
  keep(s[0]);
  return double(n) * 10 * 16 / t / 1e9;
}
#undef MIXPREC_SUM
#undef MIXPREC_SUM256
#undef MIXPREC_TEN

// Four independent TDPBF16PS a step (tiles 0-3 accumulate, 4-5 and 6-7 are the operands), each
// 16 x 16 outputs over 32 bf16 products: 16384 flops. The caller has asked the OS for the tile
// state (cpu::has_amx_bf16() does).
__attribute__((target("amx-tile,amx-bf16"))) inline double amx_bf16_gflops(long n) {
  alignas(64) static thread_local uint16_t a[16 * 32], c[4][16 * 16 * 2];
  for (auto& v : a) v = 0x3f80;  // 1.0
  kernels::cpu::amx::configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, a, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const double t = seconds_since(t0);
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  kernels::cpu::amx::release();
  float s;
  __builtin_memcpy(&s, c[3], sizeof s);
  keep(s);
  return double(n) * 4 * 16384 / t / 1e9;
}

}  // namespace mixprec::bench
