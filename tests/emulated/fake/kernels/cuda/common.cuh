// tests/emulated/'s stand-in for src/kernels/cuda/common.cuh: the element types and conversions a
// kernel under emulation uses, on mixprec's CPU 16-bit types (convert.h: the same round to nearest
// even as CUDA's __float2bfloat16_rn and __float2half_rn). cuda_shim.h first.
#pragma once
#include <cstdint>
#include <type_traits>

#include "mixprec/convert.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cuda {

using bf16 = bf16_t;
using f16 = f16_t;

// kVec elements of T in one aligned load or store (common.cuh's).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return to_f32(v);
  else
    return v;
}
template <class T>
T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16{f32_to_bf16(v)};
  else if constexpr (std::is_same_v<T, f16>)
    return f16{f32_to_f16(v)};
  else
    return T(v);
}

}  // namespace mixprec::kernels::cuda
