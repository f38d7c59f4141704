// f32 <-> bf16/f16 conversions: integer-exact scalar reference, AVX-512 bulk loops, any-to-any.
#include "mixprec/convert.h"

#include "core/parallel.h"
#include "core/simd.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>

namespace mixprec {

// ---------------------------------------------------------------------------------------
// Scalar reference. Pure integer arithmetic, so results do not depend on MXCSR (rounding
// mode, FTZ, DAZ). NaN results are chosen to equal what the x86 instructions produce, so
// the bulk loops can agree with this code bit for bit.
// ---------------------------------------------------------------------------------------

uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  // NaN: VCVTNEPS2BF16 keeps sign and the top 7 payload bits and sets the quiet bit.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  // RNE on the low 16 bits; a carry into the exponent is the correct result (incl. -> inf).
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // inf, or NaN with payload kept; VCVTPH2PS quiets signalling NaNs, so do we.
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal mant * 2^-24 is a normal f32: renormalise around its leading one.
    uint32_t top = uint32_t(std::bit_width(mant)) - 1;  // 0..9
    bits = sign | ((top + 127 - 24) << 23) | ((mant << (23 - top)) & 0x7fffffu);
  }
  return bits_to_f32(bits);
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  // NaN: VCVTPS2PH keeps sign and the top 10 payload bits and sets the quiet bit.
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  // 65520 = 65504 + half an ulp: the tie rounds to the even neighbour 65536, i.e. inf.
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // >= 2^-14: normal f16
    a += 0x0fffu + ((a >> 13) & 1u);
    return uint16_t(sign | ((a >> 13) - ((127 - 15) << 10)));
  }
  // <= 2^-25 (half the smallest subnormal, a tie that goes to the even 0): signed zero.
  if (a <= 0x33000000u) return sign;
  // Subnormal f16: value = m * 2^(e-150) = (m >> shift) units of 2^-24, shift in 14..24.
  uint32_t e = a >> 23;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e;
  uint32_t q = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal
  return uint16_t(sign | q);
}

// ---------------------------------------------------------------------------------------
// Bulk loops. The library is built without -march, so each SIMD function carries its own
// target attribute and is only called after the runtime CPU check below.
// ---------------------------------------------------------------------------------------

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr size_t kParallelMin = size_t(1) << 16;
constexpr size_t kChunk = size_t(1) << 14;  // 64 KiB of f32 per task: fits L2 with dst

using F32ToHalf = void (*)(const float*, uint16_t*, size_t);
using HalfToF32 = void (*)(const uint16_t*, float*, size_t);

void f32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void bf16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void f32_to_f16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
void f16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

__attribute__((target("avx512f,avx512bf16"))) void f32_to_bf16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i*)(dst + i), bf16_from_ps(_mm512_loadu_ps(src + i)));
  if (i < n) {
    __mmask16 m = first_lanes(int64_t(n - i));
    __m256i r = bf16_from_ps(_mm512_maskz_loadu_ps(m, src + i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, _mm512_cvtepu16_epi32(r));
  }
}

__attribute__((target("avx512f"))) void f32_to_bf16_avx512f(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(dst + i), _mm512_cvtepi32_epi16(bf16_round_epi32(_mm512_loadu_ps(src + i))));
  if (i < n) {
    __mmask16 m = first_lanes(int64_t(n - i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, bf16_round_epi32(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// 16-bit loads have no AVX512F masked form (that needs AVX512BW): the tail goes through a
// zero-padded stack copy instead.
__attribute__((target("avx512f"))) void bf16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, bf16_widen_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
  }
  if (i < n) {
    uint16_t buf[16] = {};
    std::memcpy(buf, src + i, (n - i) * sizeof(uint16_t));
    _mm512_mask_storeu_ps(dst + i, first_lanes(int64_t(n - i)), bf16_widen_ps(_mm256_loadu_si256((const __m256i*)buf)));
  }
}

// VCVTPS2PH with an explicit RNE immediate ignores the MXCSR rounding mode; f32 denormal
// inputs (DAZ or not) round to a signed zero either way, f16 subnormal outputs are never
// flushed, and NaNs keep sign and top payload bits: it matches the scalar path exactly
// (checked on all 2^32 inputs with MIXPREC_EXHAUSTIVE=1, and under FTZ/DAZ).
__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* src, uint16_t* dst, size_t n) {
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRne));
  if (i < n) {
    __mmask16 m = first_lanes(int64_t(n - i));
    __m256i r = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), kRne);
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, _mm512_cvtepu16_epi32(r));
  }
}

__attribute__((target("avx512f"))) void f16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
  if (i < n) {
    uint16_t buf[16] = {};
    std::memcpy(buf, src + i, (n - i) * sizeof(uint16_t));
    _mm512_mask_storeu_ps(dst + i, first_lanes(int64_t(n - i)),
                          _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)buf)));
  }
}

// AVX2 forms (hosts without AVX-512: AMD Zen 2, 2026-12-02), 8 lanes, bit-identical to the scalar
// rules: bf16 by the same integer RNE and NaN rule as bf16_round_epi32, f16 by F16C's VCVTPS2PH
// with an explicit RNE immediate (as the AVX-512 form above), both dtypes' lanes in core/simd.h.
// Tails go through stack copies. One group of 8: from src to dst.
__attribute__((target("avx2"))) inline void bf16_group_avx2(const float* src, uint16_t* dst) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bf16_round_avx2(_mm256_loadu_ps(src)));
}
__attribute__((target("avx2"))) inline void bf16_widen_group_avx2(const uint16_t* src, float* dst) {
  _mm256_storeu_ps(dst, bf16_widen_avx2(src));
}
__attribute__((target("avx2,f16c"))) inline void f16_group_avx2(const float* src, uint16_t* dst) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), f16_round_avx2(_mm256_loadu_ps(src)));
}
__attribute__((target("avx2,f16c"))) inline void f16_widen_group_avx2(const uint16_t* src, float* dst) {
  _mm256_storeu_ps(dst, f16_widen_avx2(src));
}

// n elements in groups of 8, the tail through zero-padded stack copies.
template <class Src, class Dst, void (*Group)(const Src*, Dst*)>
__attribute__((target("avx2,f16c"))) void groups_of_8(const Src* src, Dst* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) Group(src + i, dst + i);
  if (i < n) {
    Src in[8] = {};
    Dst out[8];
    std::memcpy(in, src + i, (n - i) * sizeof(Src));
    Group(in, out);
    std::memcpy(dst + i, out, (n - i) * sizeof(Dst));
  }
}

// Fastest-first dispatch, resolved once. __builtin_cpu_supports also checks that the OS
// saves zmm state, which a bare cpuid test would miss.
struct Kernels {
  F32ToHalf f32_to_bf16 = f32_to_bf16_scalar;
  HalfToF32 bf16_to_f32 = bf16_to_f32_scalar;
  F32ToHalf f32_to_f16 = f32_to_f16_scalar;
  HalfToF32 f16_to_f32 = f16_to_f32_scalar;
};

Kernels pick_kernels(bool without_avx512_bf16) {
  Kernels k;
  __builtin_cpu_init();
  // F16C comes with AVX2 on every CPU that has AVX2 (Intel since Haswell, AMD since Excavator).
  if (__builtin_cpu_supports("avx2")) {
    k.f32_to_bf16 = groups_of_8<float, uint16_t, bf16_group_avx2>;
    k.bf16_to_f32 = groups_of_8<uint16_t, float, bf16_widen_group_avx2>;
    k.f32_to_f16 = groups_of_8<float, uint16_t, f16_group_avx2>;
    k.f16_to_f32 = groups_of_8<uint16_t, float, f16_widen_group_avx2>;
  }
  if (__builtin_cpu_supports("avx512f")) {
    k.f32_to_bf16 = f32_to_bf16_avx512f;
    k.bf16_to_f32 = bf16_to_f32_avx512;
    k.f32_to_f16 = f32_to_f16_avx512;
    k.f16_to_f32 = f16_to_f32_avx512;
    if (__builtin_cpu_supports("avx512bf16") && !without_avx512_bf16) k.f32_to_bf16 = f32_to_bf16_avx512;
  }
  return k;
}

std::atomic<detail::ConversionPath> g_path{detail::ConversionPath::best};

const Kernels& kernels() {
  static const Kernels best = pick_kernels(false), avx512f = pick_kernels(true);
  return g_path.load(std::memory_order_relaxed) == detail::ConversionPath::avx512f ? avx512f : best;
}

// Splits a large conversion into cache-sized chunks across OpenMP threads; a short one runs on the
// calling thread before any pragma, not through an `if` clause: a region whose `if` is false still
// makes libgomp a team of one, and its end barrier a futex wake (a system call, 0.4 us a region
// on our hosts: docs/design.md, Threads).
template <class Src, class Dst>
void run_chunked(void (*fn)(const Src*, Dst*, size_t), const Src* src, Dst* dst, size_t n) {
  if (!detail::parallel_worth(int64_t(n), int64_t(kParallelMin) + 1)) {
    fn(src, dst, n);
    return;
  }
  const long chunks = long((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (long c = 0; c < chunks; ++c) {
    size_t begin = size_t(c) * kChunk;
    fn(src + begin, dst + begin, std::min(kChunk, n - begin));
  }
}

bool scalar_only() { return g_path.load(std::memory_order_relaxed) == detail::ConversionPath::scalar; }

}  // namespace

detail::ConversionPath detail::set_conversion_path(ConversionPath path) { return g_path.exchange(path); }

bool detail::native_bf16_rounding() {
  return cpu::has_avx512_bf16() && g_path.load(std::memory_order_relaxed) == ConversionPath::best;
}

std::vector<detail::ConversionPath> detail::bulk_conversion_paths() {
  std::vector<ConversionPath> paths;
  if (!__builtin_cpu_supports("avx512f")) {
    if (__builtin_cpu_supports("avx2")) paths.push_back(ConversionPath::best);
    return paths;
  }
  paths.push_back(ConversionPath::best);
  if (__builtin_cpu_supports("avx512bf16")) paths.push_back(ConversionPath::avx512f);
  return paths;
}

const char* detail::conversion_path_name(ConversionPath path) {
  switch (path) {
    case ConversionPath::best:
      return __builtin_cpu_supports("avx512bf16") ? "AVX512-BF16"
             : __builtin_cpu_supports("avx512f")  ? "AVX-512F"
             : __builtin_cpu_supports("avx2")     ? "AVX2"
                                                  : "scalar";
    case ConversionPath::avx512f:
      return "AVX-512F";
    case ConversionPath::scalar:
      return "scalar";
  }
  return "?";
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  run_chunked(scalar_only() ? f32_to_bf16_scalar : kernels().f32_to_bf16, src, dst, n);
}
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  run_chunked(scalar_only() ? bf16_to_f32_scalar : kernels().bf16_to_f32, src, dst, n);
}
void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  run_chunked(scalar_only() ? f32_to_f16_scalar : kernels().f32_to_f16, src, dst, n);
}
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  run_chunked(scalar_only() ? f16_to_f32_scalar : kernels().f16_to_f32, src, dst, n);
}

// ---------------------------------------------------------------------------------------
// Any-to-any. Wider sources reach a 16-bit float through an f32 rounded to odd: rounding
// twice to nearest (f64 -> f32 -> f16) can turn "just above a tie" into a tie and then go
// the wrong way; round-to-odd keeps the sticky information, and f32 has the p + 2 bits
// that makes the second RNE step exact (Boldo & Melquiond, "Emulation of FMA and
// correctly rounded sums: proved algorithms using rounding to odd", 2008).
// ---------------------------------------------------------------------------------------

namespace {

float f64_to_f32_round_odd(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  uint32_t sign = uint32_t(u >> 32) & 0x80000000u;
  uint64_t a = u & 0x7fffffffffffffffull;
  if (a > 0x7ff0000000000000ull)  // NaN: quiet, sign and top payload bits kept
    return bits_to_f32(sign | 0x7fc00000u | uint32_t((a >> 29) & 0x7fffffu));
  if (a == 0x7ff0000000000000ull) return bits_to_f32(sign | 0x7f800000u);
  if (a == 0) return bits_to_f32(sign);
  int biased = int(a >> 52);               // f64 exponent field, 0 for subnormals
  int exp = biased - 1023 + 127;           // f32 exponent field (unbounded)
  uint64_t mant = a & 0xfffffffffffffull;  // 52 fraction bits
  // Beyond f32 range: the largest odd f32 still rounds to inf in either 16-bit format.
  if (exp >= 255) return bits_to_f32(sign | 0x7f7fffffu);
  uint32_t shift = 29;  // 52 - 23 fraction bits dropped
  if (exp <= 0) {
    // f32 subnormal: value / 2^-149 = (1.mant) * 2^(exp + 22), so the hidden one is kept
    // and the shift grows by 1 - exp. f64 subnormals (< 2^-1022) land far below 2^-149.
    if (biased == 0) return bits_to_f32(sign | 1u);  // nonzero, far below: odd lsb
    mant |= uint64_t(1) << 52;
    shift += uint32_t(1 - exp);
    exp = 0;
    if (shift >= 64) return bits_to_f32(sign | 1u);
  }
  uint32_t kept = uint32_t(mant >> shift);
  uint32_t sticky = (mant & ((uint64_t(1) << shift) - 1)) != 0;
  return bits_to_f32(sign | (uint32_t(exp) << 23) | kept | sticky);
}

float i64_to_f32_round_odd(int64_t v) {
  uint32_t sign = v < 0 ? 0x80000000u : 0u;
  uint64_t mag = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  if (mag < (uint64_t(1) << 24)) return float(v);    // exact
  uint32_t top = uint32_t(std::bit_width(mag)) - 1;  // 24..63
  uint32_t shift = top - 23;
  uint32_t kept = uint32_t(mag >> shift) & 0x7fffffu;
  uint32_t sticky = (mag & ((uint64_t(1) << shift) - 1)) != 0;
  return bits_to_f32(sign | ((top + 127) << 23) | kept | sticky);
}

// Truncate toward zero, then saturate; NaN -> 0. (A plain cast is UB out of range.)
template <class Int>
Int float_to_int(double d) {
  if (std::isnan(d)) return 0;
  constexpr double lo = double(std::numeric_limits<Int>::min());
  constexpr double hi_excl = double(std::numeric_limits<Int>::max()) + 1.0;  // 2^63 or 256
  if (d <= lo) return std::numeric_limits<Int>::min();
  if (d >= hi_excl) return std::numeric_limits<Int>::max();
  return Int(d);
}

// Element readers: a floating element as a double (exact), a 16-bit target from each type.
template <DType T>
struct Elem;
template <>
struct Elem<DType::f64> {
  using type = double;
};
template <>
struct Elem<DType::f32> {
  using type = float;
};
template <>
struct Elem<DType::bf16> {
  using type = uint16_t;
};
template <>
struct Elem<DType::f16> {
  using type = uint16_t;
};
template <>
struct Elem<DType::i64> {
  using type = int64_t;
};
template <>
struct Elem<DType::u8> {
  using type = uint8_t;
};

template <DType S>
double load_f64(typename Elem<S>::type v) {
  if constexpr (S == DType::bf16)
    return bf16_to_f32(v);
  else if constexpr (S == DType::f16)
    return f16_to_f32(v);
  else
    return double(v);
}

// Source element as an f32 from which one RNE step gives the correctly rounded 16-bit value.
template <DType S>
float load_f32_for_half(typename Elem<S>::type v) {
  if constexpr (S == DType::f64)
    return f64_to_f32_round_odd(v);
  else if constexpr (S == DType::i64)
    return i64_to_f32_round_odd(v);
  else if constexpr (S == DType::bf16)
    return bf16_to_f32(v);
  else if constexpr (S == DType::f16)
    return f16_to_f32(v);
  else
    return float(v);  // f32, u8: exact
}

template <DType S, DType D>
typename Elem<D>::type convert_elem(typename Elem<S>::type v) {
  using Dst = typename Elem<D>::type;
  if constexpr (D == DType::bf16)
    return f32_to_bf16(load_f32_for_half<S>(v));
  else if constexpr (D == DType::f16)
    return f32_to_f16(load_f32_for_half<S>(v));
  else if constexpr (D == DType::f64)
    return load_f64<S>(v);
  else if constexpr (D == DType::f32 && is_half(S))
    return float(load_f64<S>(v));  // exact
  else if constexpr (D == DType::f32)
    return float(v);  // one rounding (i64 via f64: two)
  else if constexpr (is_floating(S))
    return float_to_int<Dst>(load_f64<S>(v));
  else
    return Dst(v);  // int -> int: modular, as C++ (and PyTorch) do for i64 -> u8
}

template <DType S, DType D>
void convert_run(const typename Elem<S>::type* src, typename Elem<D>::type* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = convert_elem<S, D>(src[i]);
}

// Through run_chunked, which leaves a short run to the calling thread: the reference kernels convert
// one element a call.
template <DType S, DType D>
void convert_loop(const void* src, void* dst, size_t n) {
  run_chunked(convert_run<S, D>, static_cast<const typename Elem<S>::type*>(src),
              static_cast<typename Elem<D>::type*>(dst), n);
}

template <DType S>
void convert_from(const void* src, void* dst, DType dst_t, size_t n) {
  switch (dst_t) {
    case DType::f64:
      return convert_loop<S, DType::f64>(src, dst, n);
    case DType::f32:
      return convert_loop<S, DType::f32>(src, dst, n);
    case DType::bf16:
      return convert_loop<S, DType::bf16>(src, dst, n);
    case DType::f16:
      return convert_loop<S, DType::f16>(src, dst, n);
    case DType::i64:
      return convert_loop<S, DType::i64>(src, dst, n);
    case DType::u8:
      return convert_loop<S, DType::u8>(src, dst, n);
  }
}

}  // namespace

void convert(const void* src, DType src_t, void* dst, DType dst_t, size_t n) {
  if (n == 0) return;
  if (src_t == dst_t) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_t));
    return;
  }
  auto* f32_src = static_cast<const float*>(src);
  auto* h_src = static_cast<const uint16_t*>(src);
  if (src_t == DType::f32 && dst_t == DType::bf16) return convert_f32_to_bf16(f32_src, static_cast<uint16_t*>(dst), n);
  if (src_t == DType::f32 && dst_t == DType::f16) return convert_f32_to_f16(f32_src, static_cast<uint16_t*>(dst), n);
  if (src_t == DType::bf16 && dst_t == DType::f32) return convert_bf16_to_f32(h_src, static_cast<float*>(dst), n);
  if (src_t == DType::f16 && dst_t == DType::f32) return convert_f16_to_f32(h_src, static_cast<float*>(dst), n);
  switch (src_t) {
    case DType::f64:
      return convert_from<DType::f64>(src, dst, dst_t, n);
    case DType::f32:
      return convert_from<DType::f32>(src, dst, dst_t, n);
    case DType::bf16:
      return convert_from<DType::bf16>(src, dst, dst_t, n);
    case DType::f16:
      return convert_from<DType::f16>(src, dst, dst_t, n);
    case DType::i64:
      return convert_from<DType::i64>(src, dst, dst_t, n);
    case DType::u8:
      return convert_from<DType::u8>(src, dst, dst_t, n);
  }
}

}  // namespace mixprec
