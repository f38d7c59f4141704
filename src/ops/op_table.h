// OpId and each op's autocast class, generated from ops.def.
#pragma once
#include <array>
#include <cstddef>
#include <string_view>

namespace mixprec {

enum class AutocastClass : unsigned char { lower, fp32, promote, keep, mixed };

enum class OpId : unsigned char {
#define MIXPREC_OP(name, cls, family) name,
#include "ops/ops.def"
#undef MIXPREC_OP
  count_
};

// Bumped by hand with every line added to ops.def, so a new op is a deliberate act that the
// compiler checks against the table.
constexpr size_t kNumOps = 41;
static_assert(static_cast<size_t>(OpId::count_) == kNumOps, "ops.def and kNumOps disagree");

constexpr std::array<AutocastClass, kNumOps> kOpClass = {
#define MIXPREC_OP(name, cls, family) AutocastClass::cls,
#include "ops/ops.def"
#undef MIXPREC_OP
};

constexpr std::array<std::string_view, kNumOps> kOpName = {
#define MIXPREC_OP(name, cls, family) #name,
#include "ops/ops.def"
#undef MIXPREC_OP
};

// The family column: the files src/ops/<family>.cpp, src/kernels/<family>.{h,cpp},
// src/kernels/ref/<family>.cpp and src/kernels/cpu/<family>.cpp (see ops.def's header).
constexpr std::array<std::string_view, kNumOps> kOpFamily = {
#define MIXPREC_OP(name, cls, family) #family,
#include "ops/ops.def"
#undef MIXPREC_OP
};

constexpr AutocastClass op_class(OpId op) { return kOpClass[static_cast<size_t>(op)]; }
constexpr std::string_view op_name(OpId op) { return kOpName[static_cast<size_t>(op)]; }

}  // namespace mixprec
