// DType: the element types mixprec stores, with their sizes, names and promotion rule.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mixprec {

enum class DType : uint8_t { f64, f32, bf16, f16, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}
constexpr bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

// Accepts "f32", "float32", "bf16", "bfloat16", "f16", "fp16", "float16", "f64", "i64", "u8".
std::optional<DType> parse_dtype(std::string_view s);

// Widest of two floating dtypes, as PyTorch promotes: f64 > f32 > {bf16, f16}; bf16 with f16
// promotes to f32 (neither holds the other's values).
constexpr DType promote_floating(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  if (a == DType::f32 || b == DType::f32) return DType::f32;
  if (is_half(a) && is_half(b)) return DType::f32;
  return is_floating(a) ? a : b;
}

}  // namespace mixprec
