// What cpu/activation.cpp and cpu/activation_table.cpp share (internal to the activation kernels):
// 16 bf16 or f16 values in a register, and the 16-bit activations by table.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/simd.h"
#include "kernels/activation.h"
#include "mixprec/tensor.h"

// The 16-bit loops of AVX-512 hosts (cpu/activation.cpp says why AVX512-BF16 is in their target).
#define MIXPREC_ACT_BF16 __attribute__((target("avx512f,avx512bf16")))

namespace mixprec::kernels::cpu {

// 16 16-bit values at p; a tail of n < 16 through a zero-padded stack copy, and its store.
__attribute__((target("avx512f"))) inline __m256i load_16(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx512f"))) inline __m256i load_tail(const uint16_t* p, int64_t n) {
  alignas(32) uint16_t buf[16] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(uint16_t));
  return load_16(buf);
}
__attribute__((target("avx512f"))) inline void store_tail(uint16_t* p, __m256i v, int64_t n) {
  alignas(32) uint16_t buf[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(buf), v);
  std::memcpy(p, buf, size_t(n) * sizeof(uint16_t));
}

namespace table {
// Whether op on t goes through its table (16-bit t on AVX-512 and AVX2 hosts, at least kTableMin
// elements, unless MIXPREC_ACTIVATION_TABLE=0 or an ActivationTable says otherwise).
bool use_table(Activation op, const Tensor& t);
void table_forward(Activation op, const Tensor& x, Tensor& dst);
void table_backward(Activation op, const Tensor& grad, const Tensor& saved, Tensor& dst);
}  // namespace table

}  // namespace mixprec::kernels::cpu
