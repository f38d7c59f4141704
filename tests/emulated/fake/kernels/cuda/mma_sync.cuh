// tests/emulated/'s stand-in for src/kernels/cuda/mma_sync.cuh: mma.sync.m16n8k16 and ldmatrix on
// the CPU (cuda_shim.h first). Each lane leaves its A, B and C registers in a table of the block, the
// block meets at a barrier, and each lane computes its own four results from its warp's 32 lanes'
// registers, read through the fragment layout mma_sync.cuh describes, the products summed in f32 in
// k order (the hardware's order within the instruction is its own: results agree to f32 rounding);
// a second barrier before the table is written again. So a kernel that puts an element in the
// wrong register or lane gets a wrong result here, as it would on a GPU. Every thread of the block
// must reach every call in the same order (the shim's rule for its barriers). ldmatrix the same
// way: each lane leaves its row address (checked 16-byte aligned, as the hardware requires), and
// takes its elements from the rows its warp's lanes gave.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mixprec::kernels::cuda {
namespace emulated_mma {

struct Registers {
  uint32_t a[emulated::kMaxThreads][4];
  uint32_t b[emulated::kMaxThreads][2];
  const uint16_t* rows[emulated::kMaxThreads];
};
inline Registers& registers() {
  static Registers r;
  return r;
}

// Element `half` (0: low) of a register of two T.
template <class T>
float element(uint32_t reg, int half) {
  return to_f32(T{uint16_t(half ? reg >> 16 : reg & 0xffffu)});
}

}  // namespace emulated_mma

template <class T>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  emulated_mma::Registers& regs = emulated_mma::registers();
  const unsigned me = threadIdx.x, warp = me & ~31u, lane = me % 32;
  for (int i = 0; i < 4; ++i) regs.a[me][i] = a[i];
  for (int i = 0; i < 2; ++i) regs.b[me][i] = b[i];
  emulated::barrier();
  const unsigned g = lane / 4, t = lane % 4;
  float out[4];
  for (unsigned idx = 0; idx < 4; ++idx) {
    const unsigned row = g + 8 * (idx / 2), col = 2 * t + idx % 2;
    float s = d[idx];
    for (unsigned k = 0; k < 16; ++k) {
      // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register row / 8 + 2 (k / 8), half k % 2.
      const uint32_t ra = regs.a[warp + (row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
      // B[k][col]: lane col * 4 + (k % 8) / 2, register k / 8, half k % 2.
      const uint32_t rb = regs.b[warp + col * 4 + (k % 8) / 2][k / 8];
      s += emulated_mma::element<T>(ra, int(k % 2)) * emulated_mma::element<T>(rb, int(k % 2));
    }
    out[idx] = s;
  }
  emulated::barrier();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// Two f32 values rounded to T (to nearest even, convert.h), lo in the low half.
template <class T>
uint32_t round_pair(float lo, float hi) {
  return uint32_t(from_acc<T>(lo).bits) | uint32_t(from_acc<T>(hi).bits) << 16;
}

template <bool kTrans>
void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(stderr, "ldmatrix mock: a row address not 16-byte aligned\n");
    std::abort();
  }
  emulated_mma::Registers& regs = emulated_mma::registers();
  const unsigned me = threadIdx.x, warp = me & ~31u, lane = me % 32, g = lane / 4, t = lane % 4;
  regs.rows[me] = static_cast<const uint16_t*>(row);
  emulated::barrier();
  for (unsigned m = 0; m < 4; ++m) {
    const uint16_t* const* rows = regs.rows + warp + 8 * m;  // matrix m's eight rows
    r[m] = kTrans ? uint32_t(rows[2 * t][g]) | uint32_t(rows[2 * t + 1][g]) << 16
                  : uint32_t(rows[g][2 * t]) | uint32_t(rows[g][2 * t + 1]) << 16;
  }
  emulated::barrier();
}

}  // namespace mixprec::kernels::cuda
