// parse_dtype: the dtype spellings users type (CLI flags, config files), mapped to DType.
#include "mixprec/dtype.h"

#include <array>
#include <utility>

namespace mixprec {

std::optional<DType> parse_dtype(std::string_view s) {
  // Exact, case-sensitive spellings: PyTorch's names plus the usual short forms.
  static constexpr std::array<std::pair<std::string_view, DType>, 17> kNames{{
      {"f64", DType::f64},
      {"float64", DType::f64},
      {"double", DType::f64},
      {"f32", DType::f32},
      {"float32", DType::f32},
      {"float", DType::f32},
      {"fp32", DType::f32},
      {"bf16", DType::bf16},
      {"bfloat16", DType::bf16},
      {"f16", DType::f16},
      {"fp16", DType::f16},
      {"float16", DType::f16},
      {"half", DType::f16},
      {"i64", DType::i64},
      {"int64", DType::i64},
      {"u8", DType::u8},
      {"uint8", DType::u8},
  }};
  for (const auto& [name, t] : kNames)
    if (name == s) return t;
  return std::nullopt;
}

}  // namespace mixprec
