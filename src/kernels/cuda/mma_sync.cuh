// One warp-wide tensor-core instruction, mma.sync.m16n8k16 with f32 accumulation, for bf16 and f16
// operands (sm_80 and later), and its fragments' layout (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"): with g = lane / 4 and t = lane % 4,
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
//                           a[3] = A[g+8][2t+8, 2t+9];
//   B (16 x 8, k x n):      b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//   C, D (16 x 8, f32):     d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1];
// each 32-bit register two 16-bit elements, the lower index in the low half. And ldmatrix, which
// loads such fragments from shared memory. tests/emulated/fake/ has a CPU stand-in of this header
// with the same signatures (the kernels' own code around them, the addresses and the softmax on
// fragments, runs there unchanged).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mixprec::kernels::cuda {

// d += a b, T bf16 or f16.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d, (void)a, (void)b;
#endif
}

// Two f32 values rounded to T (to nearest even), as one register: lo in the low half. One
// cvt.rn.bf16x2.f32 (or .f16x2) on sm_80 and later.
template <class T>
__device__ __forceinline__ uint32_t round_pair(float lo, float hi) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  uint32_t u;
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    std::memcpy(&u, &v, 4);
  }
  return u;
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 matrices of 16-bit elements from
// shared memory. Lane i gives the address of row i % 8 of matrix i / 8 (16 bytes, 16-byte
// aligned); lane l = 4g + t receives in r[m] matrix m's elements [g][2t], [g][2t + 1], or with
// kTrans [2t][g], [2t + 1][g] (so a matrix stored [n][k] gives B's b[0] of X Y^T, one stored
// [k][n] B's b[0] of P Y).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

}  // namespace mixprec::kernels::cuda
