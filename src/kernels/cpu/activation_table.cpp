// The smooth activations of 16-bit tensors by table, on AVX-512 and AVX2 hosts.
// A bf16 or f16 value has 65536 bit patterns, so a smooth activation of one is a table: value[p]
// is the f32 kernel's result on pattern p widened, rounded to the dtype (what cpu/activation.cpp's
// 16-bit loops and converted blocks give, bit for bit: Kernels.ActivationBf16IsTheF32KernelRoundedOnce), and
// slope[p] the f32 kernel's derivative there (its backward with a gradient of 1). The forward is
// then a gather, the backward a gather, one multiplication and the rounding, where the arithmetic
// takes an e^x, a division and a dozen more operations a lane. A layer's activations span few
// exponents, so the entries a call touches stay in L1. Built once per op and dtype, on first use,
// by the kernels they replace (f32 tensors of the 65536 widened patterns); AVX-512 and AVX2 hosts,
// 16-bit tensors of at least kTableMin elements; MIXPREC_ACTIVATION_TABLE=0 turns it off, and a
// kernels::cpu::ActivationTable decides instead while one lives (the tests). On the AVX2 kind (AMD
// Zen 3, 2026-12-06) the gpt's amp-bf16 GELU went from 6.2-6.9 to 2.2-3.1 ms a step forward and
// from 8.4-9.0 to 3.9-4.2 backward (`mixprec bench --model gpt --precision amp-bf16 --profile`,
// three runs of each build, alternating), where the arithmetic ran on converted blocks.
#include "kernels/cpu/activation_table.h"

#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "kernels/cpu/f32_blocks.h"
#include "mixprec/convert.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {
namespace table {
namespace {

constexpr int64_t kTableMin = 4096;
constexpr int kPatterns = 1 << 16;
struct Table16 {
  std::vector<uint16_t> value;  // kPatterns + 1: the forward's 4-byte gathers read one entry past p
  std::vector<float> slope;
};

thread_local int table_override = -1;  // ActivationTable alive: 0 or 1
bool table_asked_off() {
  static const bool off = [] {
    const char* e = std::getenv("MIXPREC_ACTIVATION_TABLE");
    return e != nullptr && std::string_view(e) == "0";
  }();
  return off;
}

Table16 build_table(Activation op, DType t) {
  std::vector<uint16_t> patterns(kPatterns);
  for (int p = 0; p < kPatterns; ++p) patterns[size_t(p)] = uint16_t(p);
  // Host tensors whatever the calling kernel's DefaultDevice (the tables serve every call after).
  const Device host = Device::cpu();
  const Tensor wide = Tensor::empty({kPatterns}, DType::f32, host);
  convert(patterns.data(), t, wide.data_ptr(), DType::f32, size_t(kPatterns));  // exact
  Tensor y = Tensor::empty({kPatterns}, DType::f32, host), d = Tensor::empty({kPatterns}, DType::f32, host);
  const Tensor ones = Tensor::full({kPatterns}, 1.0, DType::f32, host);
  // The pattern is the saved tensor's value, the input or the output (grad_from_output) alike.
  if (!activation(op, wide, y) || !activation_grad(op, ones, wide, d))
    throw Error("activation table: the f32 kernel declined");
  Table16 tab;
  tab.value.assign(size_t(kPatterns) + 1, 0);
  convert(y.data_ptr(), DType::f32, tab.value.data(), t, size_t(kPatterns));
  const auto* dv = static_cast<const float*>(d.data_ptr());
  tab.slope.assign(dv, dv + kPatterns);
  return tab;
}

const Table16& table16(Activation op, DType t) {
  constexpr int kOps = int(Activation::tanh) + 1;
  static std::once_flag once[kOps][2];
  static Table16 tables[kOps][2];
  const int o = int(op), k = t == DType::bf16 ? 0 : 1;
  std::call_once(once[o][k], [&] { tables[o][k] = build_table(op, t); });
  return tables[o][k];
}

// dst = value[x] over len values, 16 a gather (4 bytes from entry p: its low half is value[p]).
__attribute__((target("avx512f"))) void lookup_16(const uint16_t* value, const uint16_t* x, uint16_t* dst,
                                                  int64_t len) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    fetch_ahead(x + i, 64);
    const __m512i lo = _mm512_cvtepu16_epi32(load_16(x + i)), hi = _mm512_cvtepu16_epi32(load_16(x + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(lo, value, 2)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16),
                        _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(hi, value, 2)));
  }
  for (; i < len; ++i) dst[i] = value[x[i]];
}

// The slope of 16 saved values times the widened gradient, rounded: backward_16's operations (bf16:
// convert()'s rule, native or in integer lanes) with derivative_ps's result read from the table;
// f16 with VCVTPH2PS in and VCVTPS2PH out (round to nearest even: the bulk conversion's
// instruction, whose bits the converted blocks get).
template <bool kF16, bool kNative>
MIXPREC_ACT_BF16 inline __m256i table_grad(const float* slope, __m256i g, __m256i s) {
  const __m512 d = _mm512_i32gather_ps(_mm512_cvtepu16_epi32(s), slope, 4);
  if constexpr (kF16)
    return _mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtph_ps(g), d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else
    return bf16_round_ps(_mm512_mul_ps(bf16_widen_ps(g), d), kNative);
}
template <bool kF16, bool kNative>
MIXPREC_ACT_BF16 void table_backward_16(const float* slope, const uint16_t* g, const uint16_t* s, uint16_t* dst,
                                        int64_t len) {
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    fetch_ahead(g + i, 32);
    fetch_ahead(s + i, 32);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        table_grad<kF16, kNative>(slope, load_16(g + i), load_16(s + i)));
  }
  if (i < len)
    store_tail(dst + i, table_grad<kF16, kNative>(slope, load_tail(g + i, len - i), load_tail(s + i, len - i)),
               len - i);
}

// The AVX2 forms (hosts without AVX-512): the forward's lookups one at a time (a table entry a
// load), the backward's slopes 8 a gather; the tail through zero-padded stack copies.
void lookup_1(const uint16_t* value, const uint16_t* x, uint16_t* dst, int64_t len) {
  for (int64_t i = 0; i < len; ++i) dst[i] = value[x[i]];
}
template <bool kF16>
__attribute__((target("avx2,f16c"))) inline void table_grad_8(const float* slope, const uint16_t* g, const uint16_t* s,
                                                              uint16_t* dst) {
  const __m256 d = _mm256_i32gather_ps(slope, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)s)), 4);
  const __m128i r = round16_avx2(_mm256_mul_ps(widen16_avx2(g, kF16), d), kF16);
  _mm_storeu_si128((__m128i*)dst, r);
}
template <bool kF16>
__attribute__((target("avx2,f16c"))) void table_backward_8(const float* slope, const uint16_t* g, const uint16_t* s,
                                                           uint16_t* dst, int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) table_grad_8<kF16>(slope, g + i, s + i, dst + i);
  if (i < len) {
    uint16_t gb[8] = {}, sb[8] = {}, out[8];
    std::memcpy(gb, g + i, size_t(len - i) * 2);
    std::memcpy(sb, s + i, size_t(len - i) * 2);
    table_grad_8<kF16>(slope, gb, sb, out);
    std::memcpy(dst + i, out, size_t(len - i) * 2);
  }
}

}  // namespace

bool use_table(Activation op, const Tensor& t) {
  if (op == Activation::relu || (t.dtype() != DType::bf16 && t.dtype() != DType::f16) || simd_lanes() == Lanes::none)
    return false;
  if (table_override >= 0) return table_override == 1;
  return t.numel() >= kTableMin && !table_asked_off();
}

void table_forward(Activation op, const Tensor& x, Tensor& dst) {
  const uint16_t* value = table16(op, x.dtype()).value.data();
  const auto* src = static_cast<const uint16_t*>(x.data_ptr());
  auto* out = static_cast<uint16_t*>(dst.data_ptr());
  const auto fn = simd_lanes() == Lanes::avx512 ? lookup_16 : lookup_1;
  for_blocks(x.numel(), [&](int64_t begin, int64_t len) { fn(value, src + begin, out + begin, len); });
}
void table_backward(Activation op, const Tensor& grad, const Tensor& saved, Tensor& dst) {
  const float* slope = table16(op, saved.dtype()).slope.data();
  const auto* g = static_cast<const uint16_t*>(grad.data_ptr());
  const auto* s = static_cast<const uint16_t*>(saved.data_ptr());
  auto* out = static_cast<uint16_t*>(dst.data_ptr());
  const bool f16 = saved.dtype() == DType::f16, native = detail::native_bf16_rounding();
  const auto fn = simd_lanes() != Lanes::avx512 ? (f16 ? table_backward_8<true> : table_backward_8<false>)
                  : f16                         ? table_backward_16<true, false>
                  : native                      ? table_backward_16<false, true>
                                                : table_backward_16<false, false>;
  for_blocks(saved.numel(), [&](int64_t begin, int64_t len) { fn(slope, g + begin, s + begin, out + begin, len); });
}

}  // namespace table

ActivationTable::ActivationTable(bool on) : previous_(table::table_override) { table::table_override = on ? 1 : 0; }
ActivationTable::~ActivationTable() { table::table_override = previous_; }

}  // namespace mixprec::kernels::cpu
