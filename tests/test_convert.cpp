// Tests for f32 <-> bf16/f16 conversion (scalar vs an independent reference, bulk vs
// scalar bit for bit), the any-to-any convert() and parse_dtype.
#include <gtest/gtest.h>
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "mixprec/convert.h"

namespace mixprec {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // ASan is ~5x slower: fewer random samples
#else
constexpr bool kSanitized = false;
#endif

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kF16Max = 65504.0;
const double kBf16Max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- independent references: decoding by ldexp, rounding by double arithmetic ----

double decode_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0x1f ? (m ? std::nan("") : kInf) : e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

double decode_bf16(uint16_t h) {
  int e = (h >> 7) & 0xff, m = h & 0x7f;
  double v = e == 0xff ? (m ? std::nan("") : kInf) : e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (h & 0x8000) ? -v : v;
}

// Nearest value with frac_bits fraction bits and minimum normal exponent emin, ties to
// even, exponent unbounded above and then > max_finite -> inf (IEEE 754 overflow rule).
// All scalings are by powers of two, so for f32/f64 inputs every step is exact.
double ref_round(double x, int frac_bits, int emin, double max_finite) {
  if (x == 0 || std::isinf(x)) return x;
  int ex;
  std::frexp(std::fabs(x), &ex);  // |x| in [2^(ex-1), 2^ex)
  double ulp = std::ldexp(1.0, std::max(ex - 1, emin) - frac_bits);
  double q = std::fabs(x) / ulp;
  int64_t fl = int64_t(q);  // q < 2^(frac_bits + 1): the cast is floor, and exact
  double frac = q - double(fl);
  int64_t r = (frac > 0.5 || (frac == 0.5 && (fl & 1))) ? fl + 1 : fl;
  double v = double(r) * ulp;
  if (v > max_finite) v = kInf;
  return std::copysign(v, x);
}
double ref_f16(double x) { return ref_round(x, 10, -14, kF16Max); }
double ref_bf16(double x) { return ref_round(x, 7, -126, kBf16Max); }

bool same_value(double got, double want) { return got == want && std::signbit(got) == std::signbit(want); }

// NaN rule (what VCVTPS2PH / VCVTNEPS2BF16 do): sign and top payload bits kept, quiet bit set.
uint16_t nan_f16(uint32_t u) { return uint16_t(((u >> 16) & 0x8000) | 0x7e00 | ((u >> 13) & 0x3ff)); }
uint16_t nan_bf16(uint32_t u) { return uint16_t((u >> 16) | 0x40); }

bool f16_ok(uint32_t u) {
  float f = bits_to_f32(u);
  uint16_t h = f32_to_f16(f);
  if (std::isnan(f)) return h == nan_f16(u);
  return same_value(decode_f16(h), ref_f16(f));
}
bool bf16_ok(uint32_t u) {
  float f = bits_to_f32(u);
  uint16_t h = f32_to_bf16(f);
  if (std::isnan(f)) return h == nan_bf16(u);
  return same_value(decode_bf16(h), ref_bf16(f));
}

// Runs check on gen(i) for i in [0, n) in parallel; counts failures, prints the first few.
template <class Gen, class Check>
void expect_all(uint64_t n, Gen gen, Check check, const char* what) {
  long failures = 0;
#pragma omp parallel for reduction(+ : failures) schedule(static)
  for (long i = 0; i < long(n); ++i) {
    uint32_t u = gen(uint64_t(i));
    if (!check(u)) {
      ++failures;
#pragma omp critical
      if (failures < 5) ADD_FAILURE() << what << " wrong for f32 bits 0x" << std::hex << u;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

template <class Check>
void expect_all(const std::vector<uint32_t>& bits, Check check, const char* what) {
  expect_all(
      bits.size(), [&](uint64_t i) { return bits[i]; }, check, what);
}

// Whole binades (every mantissa of each biased f32 exponent), positive; negative ones
// every 7th pattern (sign is one OR in the code under test). ASan: 1/8 of each binade.
struct Binades {
  std::vector<uint32_t> exps;
  uint64_t step = kSanitized ? 8 : 1;
  uint64_t per_binade() const { return (uint64_t(1) << 23) / step; }
  uint64_t positives() const { return exps.size() * per_binade(); }
  uint64_t size() const { return positives() + positives() / 7; }
  uint32_t operator()(uint64_t i) const {
    uint32_t sign = 0;
    if (i >= positives()) i = (i - positives()) * 7, sign = 0x80000000u;
    return sign | (exps[i / per_binade()] << 23) | uint32_t((i % per_binade()) * step);
  }
};

std::vector<uint32_t> special_bits() {
  std::vector<float> v = {0.0f,
                          1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          1e30f,
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -25),
                          std::ldexp(1.0f, -26),
                          std::ldexp(1.5f, -24),
                          std::ldexp(1.5f, -25),
                          std::ldexp(1.0f, -14),
                          std::ldexp(1023.0f, -24),
                          std::ldexp(2047.0f, -25),
                          FLT_MIN,
                          FLT_MAX,
                          FLT_TRUE_MIN,
                          std::nextafter(FLT_MIN, 0.0f),
                          FLT_EPSILON,
                          std::numeric_limits<float>::infinity()};
  v.push_back(std::nextafter(65520.0f, 0.0f));
  v.push_back(std::nextafter(std::ldexp(1.0f, -25), 1.0f));
  v.push_back(std::nextafter(std::ldexp(1.0f, -25), 0.0f));
  std::vector<uint32_t> out;
  for (float f : v) out.insert(out.end(), {f32_to_bits(f), f32_to_bits(-f)});
  // NaNs: quiet, signalling, payload only in low bits (truncation would give inf), all ones.
  for (uint32_t nan :
       {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7f801fffu, 0x7f80ffffu, 0x7fffffffu, 0x7fbfffffu, 0x7f812345u})
    out.insert(out.end(), {nan, nan | 0x80000000u});
  return out;
}

// ---- 16-bit -> f32 -> 16-bit ----

TEST(Convert, F16ToF32MatchesLdexpFormulaForAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    double want = decode_f16(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << h;
    } else {
      ASSERT_TRUE(same_value(f, want)) << std::hex << h;
    }
  }
}

TEST(Convert, Bf16ToF32MatchesLdexpFormulaForAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double want = decode_bf16(uint16_t(h));
    float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(want))
      ASSERT_TRUE(std::isnan(f)) << h;
    else
      ASSERT_TRUE(same_value(f, want)) << std::hex << h;
  }
}

TEST(Convert, AllHalfPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t b = f32_to_bf16(bf16_to_f32(uint16_t(h)));
    uint16_t f = f32_to_f16(f16_to_f32(uint16_t(h)));
    if (std::isnan(decode_bf16(uint16_t(h)))) {
      ASSERT_TRUE(std::isnan(decode_bf16(b))) << h;
      ASSERT_EQ(b, uint16_t(h | 0x40)) << h;  // quiet bit set, rest kept
    } else {
      ASSERT_EQ(b, uint16_t(h));
    }
    if (std::isnan(decode_f16(uint16_t(h)))) {
      ASSERT_TRUE(std::isnan(decode_f16(f))) << h;
      ASSERT_EQ(f, uint16_t(h | 0x200)) << h;
    } else {
      ASSERT_EQ(f, uint16_t(h));
    }
  }
}

// ---- scalar f32 -> 16-bit against the double-arithmetic reference ----

TEST(Convert, ScalarMatchesReferenceOnSpecials) {
  auto bits = special_bits();
  expect_all(bits, f16_ok, "f32_to_f16");
  expect_all(bits, bf16_ok, "f32_to_bf16");
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);     // tie -> even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7f80);
  EXPECT_EQ(f32_to_bf16(FLT_TRUE_MIN), 0x0000);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00008000u)), 0x0000);  // denormal tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7f800001u)), 0x7fc0);  // sNaN, payload below bf16
  EXPECT_EQ(f32_to_f16(bits_to_f32(0xff800001u)), 0xfe00);
}

TEST(Convert, ScalarMatchesReferenceOnAllHalfwayCases) {
  std::vector<uint32_t> bits;
  // bf16: the tie is low half 0x8000; with its neighbours one f32 ulp either side.
  for (uint32_t h = 0; h < 65536; ++h)
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) bits.push_back(h << 16 | low);
  // f16: the midpoint of every pair of neighbouring finite f16 values (exact in f32).
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    double next = h == 0x7bff ? 65536.0 : decode_f16(uint16_t(h + 1));
    uint32_t mid = f32_to_bits(float((decode_f16(uint16_t(h)) + next) / 2));
    for (uint32_t u : {mid - 1, mid, mid + 1}) bits.insert(bits.end(), {u, u | 0x80000000u});
  }
  expect_all(bits, bf16_ok, "f32_to_bf16");
  expect_all(bits, f16_ok, "f32_to_f16");
}

TEST(Convert, ScalarF16MatchesReferenceOnBoundaryBinades) {
  // Biased f32 exponents: 101..103 hold 2^-26..2^-23 (f16 subnormal floor and rounding
  // to zero), 112..113 the f16 subnormal/normal boundary, 142..143 the overflow to inf.
  Binades b{{101, 102, 103, 112, 113, 142, 143}};
  expect_all(b.size(), b, f16_ok, "f32_to_f16");
}

TEST(Convert, ScalarBf16MatchesReferenceOnBoundaryBinades) {
  // f32 denormals (bf16 subnormals), the smallest normal binade, the largest, and inf/NaN.
  Binades b{{0, 1, 254, 255}};
  expect_all(b.size(), b, bf16_ok, "f32_to_bf16");
}

TEST(Convert, ScalarMatchesReferenceOnRandomPatterns) {
  const uint64_t n = kSanitized ? 1'000'000 : 10'000'000;
  auto random_bits = [](uint64_t i) { return uint32_t(splitmix64(i)); };
  expect_all(n, random_bits, f16_ok, "f32_to_f16");
  expect_all(n, random_bits, bf16_ok, "f32_to_bf16");
}

// ---- bulk vs scalar, bit for bit ----

// Runs body once for each vectorised conversion path this CPU has (the fastest, and on an
// AVX512-BF16 CPU also the AVX-512F integer path of CPUs without it; AVX2 alone on a host without
// AVX-512), naming it in failures. Without any the bulk conversions are the scalar loops: nothing
// to compare, so it skips.
template <class Body>
void for_each_bulk_path(Body body) {
  const auto paths = detail::bulk_conversion_paths();
  if (paths.empty()) GTEST_SKIP() << "neither AVX-512F nor AVX2: the bulk conversions are the scalar reference itself";
  for (const auto path : paths) {
    SCOPED_TRACE(std::string("bulk path ") + detail::conversion_path_name(path));
    const detail::ConversionPathScope scope(path);
    body();
  }
}

// Bulk against scalar on gen(i), i in [0, n), in blocks small enough that each bulk call
// runs single-threaded inside this test's own parallel loop.
template <class Gen>
void expect_bulk_matches_scalar(uint64_t n, Gen gen) {
  constexpr uint64_t kBlock = 1 << 15;
  long bf16_bad = 0, f16_bad = 0;
#pragma omp parallel for reduction(+ : bf16_bad, f16_bad) schedule(dynamic, 16)
  for (long b = 0; b < long((n + kBlock - 1) / kBlock); ++b) {
    uint64_t first = uint64_t(b) * kBlock, count = std::min(kBlock, n - first);
    std::vector<float> src(count);
    std::vector<uint16_t> dst_bf16(count), dst_f16(count);
    for (uint64_t i = 0; i < count; ++i) src[i] = bits_to_f32(gen(first + i));
    convert_f32_to_bf16(src.data(), dst_bf16.data(), count);
    convert_f32_to_f16(src.data(), dst_f16.data(), count);
    for (uint64_t i = 0; i < count; ++i) {
      bf16_bad += dst_bf16[i] != f32_to_bf16(src[i]);
      f16_bad += dst_f16[i] != f32_to_f16(src[i]);
    }
  }
  EXPECT_EQ(bf16_bad, 0);
  EXPECT_EQ(f16_bad, 0);
}

// All 2^32 patterns take ~15 s of CPU: opt in with MIXPREC_EXHAUSTIVE=1. By default every
// 257th pattern (odd stride: low mantissa bits and SIMD lanes all vary), plus the full
// binades below, which hold every class where the instructions could differ from RNE.
TEST(Convert, BulkMatchesScalarOnF32Patterns) {
  for_each_bulk_path([&] {
    const char* env = std::getenv("MIXPREC_EXHAUSTIVE");
    const uint64_t stride = env && env[0] == '1' ? 1 : kSanitized ? 4099 : 257;
    expect_bulk_matches_scalar((uint64_t(1) << 32) / stride, [=](uint64_t i) { return uint32_t(i * stride); });
  });
}

// f32 denormals (VCVTNEPS2BF16 reads them as zero: the fix-up path), NaN payloads, the
// smallest normals, and the f16 underflow, subnormal/normal and overflow binades.
TEST(Convert, BulkMatchesScalarOnBoundaryBinades) {
  for_each_bulk_path([&] {
    Binades b{{0, 1, 101, 102, 112, 113, 142, 255}};
    expect_bulk_matches_scalar(b.size(), b);
    auto specials = special_bits();
    expect_bulk_matches_scalar(specials.size(), [&](uint64_t i) { return specials[i]; });
  });
}

TEST(Convert, BulkHalfToF32MatchesScalarForAllPatterns) {
  std::vector<uint16_t> src(65536);
  for (uint32_t h = 0; h < 65536; ++h) src[h] = uint16_t(h);
  std::vector<float> bf(65536), f(65536);
  convert_bf16_to_f32(src.data(), bf.data(), src.size());
  convert_f16_to_f32(src.data(), f.data(), src.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(f32_to_bits(bf[h]), f32_to_bits(bf16_to_f32(uint16_t(h)))) << h;
    ASSERT_EQ(f32_to_bits(f[h]), f32_to_bits(f16_to_f32(uint16_t(h)))) << h;
  }
}

// Users often run with FTZ/DAZ set for speed: the bulk path must not change its results.
// n stays below the parallel threshold so the work runs on this thread, under this MXCSR.
TEST(Convert, BulkIgnoresFtzDazAndRoundingMode) {
  for_each_bulk_path([&] {
    // f32 denormals, the f16 underflow binade, the f16 subnormal/normal boundary and the
    // smallest f32 normals; ~60k elements, below convert.cpp's 2^16 parallel threshold.
    std::vector<uint32_t> bits;
    for (uint32_t m = 0; m < (1u << 23); m += 557)
      for (uint32_t exp : {0u, 1u, 102u, 112u}) bits.push_back((exp << 23) | m);
    for (size_t i = 0; i < bits.size(); i += 3) bits[i] |= 0x80000000u;
    for (uint32_t u : special_bits()) bits.push_back(u);
    std::vector<float> src(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) src[i] = bits_to_f32(bits[i]);
    std::vector<uint16_t> all16(65536);
    for (uint32_t h = 0; h < 65536; ++h) all16[h] = uint16_t(h);

    const unsigned saved = _mm_getcsr();
    for (unsigned mode : {0x8040u, 0x8040u | _MM_ROUND_TOWARD_ZERO, 0x8040u | _MM_ROUND_UP}) {
      _mm_setcsr((saved & ~0xe040u) | mode);  // FTZ (bit 15), DAZ (bit 6), rounding (13-14)
      std::vector<uint16_t> bf(src.size()), h(src.size());
      std::vector<float> from_bf(65536), from_h(65536);
      convert_f32_to_bf16(src.data(), bf.data(), src.size());
      convert_f32_to_f16(src.data(), h.data(), src.size());
      convert_bf16_to_f32(all16.data(), from_bf.data(), 32768);
      convert_bf16_to_f32(all16.data() + 32768, from_bf.data() + 32768, 32768);
      convert_f16_to_f32(all16.data(), from_h.data(), 32768);
      convert_f16_to_f32(all16.data() + 32768, from_h.data() + 32768, 32768);
      _mm_setcsr(saved);  // compare (and let gtest run) under the default MXCSR
      for (size_t i = 0; i < src.size(); ++i) {
        ASSERT_EQ(bf[i], f32_to_bf16(src[i])) << std::hex << bits[i] << " mode " << mode;
        ASSERT_EQ(h[i], f32_to_f16(src[i])) << std::hex << bits[i] << " mode " << mode;
      }
      for (uint32_t k = 0; k < 65536; ++k) {
        ASSERT_EQ(f32_to_bits(from_bf[k]), f32_to_bits(bf16_to_f32(uint16_t(k)))) << k;
        ASSERT_EQ(f32_to_bits(from_h[k]), f32_to_bits(f16_to_f32(uint16_t(k)))) << k;
      }
    }
  });
}

// Lengths around the 16-lane width and the parallel threshold, at aligned and odd offsets;
// the guard elements after dst must survive (masked tails must not write past n).
TEST(Convert, BulkTailsAndOffsets) {
  for_each_bulk_path([&] {
    const auto specials = special_bits();
    uint64_t state = 7;
    for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), (size_t(1) << 17) + 3}) {
      for (size_t off : {size_t(0), size_t(1)}) {
        constexpr size_t kGuard = 40;
        std::vector<float> src(off + n + kGuard);
        for (size_t i = 0; i < src.size(); ++i) {
          uint64_t r = splitmix64(state);
          // Mix random patterns, denormals and specials so every lane position meets each.
          uint32_t u = r % 4 == 0   ? uint32_t(r >> 32) & 0x807fffffu
                       : r % 4 == 1 ? specials[(r >> 8) % specials.size()]
                                    : uint32_t(r >> 32);
          src[i] = bits_to_f32(u);
        }
        std::vector<uint16_t> h(off + n + kGuard, 0xabcd), bf(off + n + kGuard, 0xabcd);
        convert_f32_to_f16(src.data() + off, h.data() + off, n);
        convert_f32_to_bf16(src.data() + off, bf.data() + off, n);
        std::vector<float> back_h(off + n + kGuard, -7.0f), back_bf(off + n + kGuard, -7.0f);
        convert_f16_to_f32(h.data() + off, back_h.data() + off, n);
        convert_bf16_to_f32(bf.data() + off, back_bf.data() + off, n);
        for (size_t i = 0; i < off + n + kGuard; ++i) {
          bool inside = i >= off && i < off + n;
          if (!inside) {
            ASSERT_EQ(h[i], 0xabcd) << "n=" << n << " i=" << i;
            ASSERT_EQ(bf[i], 0xabcd) << "n=" << n << " i=" << i;
            ASSERT_EQ(back_h[i], -7.0f) << "n=" << n << " i=" << i;
            ASSERT_EQ(back_bf[i], -7.0f) << "n=" << n << " i=" << i;
            continue;
          }
          ASSERT_EQ(h[i], f32_to_f16(src[i])) << "n=" << n << " i=" << i;
          ASSERT_EQ(bf[i], f32_to_bf16(src[i])) << "n=" << n << " i=" << i;
          ASSERT_EQ(f32_to_bits(back_h[i]), f32_to_bits(f16_to_f32(h[i]))) << "n=" << n;
          ASSERT_EQ(f32_to_bits(back_bf[i]), f32_to_bits(bf16_to_f32(bf[i]))) << "n=" << n;
        }
      }
    }
  });
}

TEST(Convert, ScalarOnlySwitchGivesSameBits) {
  std::vector<float> src(100'003);
  uint64_t state = 3;
  for (auto& f : src) f = bits_to_f32(uint32_t(splitmix64(state)));
  std::vector<uint16_t> fast_bf(src.size()), fast_h(src.size()), slow_bf(src.size()), slow_h(src.size());
  convert_f32_to_bf16(src.data(), fast_bf.data(), src.size());
  convert_f32_to_f16(src.data(), fast_h.data(), src.size());
  EXPECT_EQ(detail::set_conversion_path(detail::ConversionPath::scalar), detail::ConversionPath::best);
  convert_f32_to_bf16(src.data(), slow_bf.data(), src.size());
  convert_f32_to_f16(src.data(), slow_h.data(), src.size());
  EXPECT_EQ(detail::set_conversion_path(detail::ConversionPath::best), detail::ConversionPath::scalar);
  EXPECT_EQ(fast_bf, slow_bf);
  EXPECT_EQ(fast_h, slow_h);
}

// ---- convert(): any dtype to any dtype ----

constexpr DType kAll[] = {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i64, DType::u8};

// One element of type t holding v (v must be exactly representable), as raw bytes.
std::vector<unsigned char> encode(DType t, double v) {
  std::vector<unsigned char> b(dtype_size(t));
  auto put = [&](auto x) { std::memcpy(b.data(), &x, sizeof x); };
  switch (t) {
    case DType::f64:
      put(v);
      break;
    case DType::f32:
      put(float(v));
      break;
    case DType::bf16:
      put(f32_to_bf16(float(v)));
      break;
    case DType::f16:
      put(f32_to_f16(float(v)));
      break;
    case DType::i64:
      put(int64_t(v));
      break;
    case DType::u8:
      put(uint8_t(v));
      break;
  }
  return b;
}

double decode(DType t, const unsigned char* p) {
  auto get = [&](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
    case DType::f64:
      return get(0.0);
    case DType::f32:
      return get(0.0f);
    case DType::bf16:
      return decode_bf16(get(uint16_t(0)));
    case DType::f16:
      return decode_f16(get(uint16_t(0)));
    case DType::i64:
      return double(get(int64_t(0)));
    case DType::u8:
      return get(uint8_t(0));
  }
  return 0;
}

template <class Src, class Dst>
Dst convert_one(Src v, DType src_t, DType dst_t) {
  Dst out{};
  convert(&v, src_t, &out, dst_t, 1);
  return out;
}

TEST(Convert, AnyToAnyOnValuesEveryTypeHolds) {
  for (double v : {0.0, 1.0, 3.0, 100.0, 255.0}) {
    for (DType s : kAll) {
      for (DType d : kAll) {
        auto src = encode(s, v);
        std::vector<unsigned char> dst(dtype_size(d));
        convert(src.data(), s, dst.data(), d, 1);
        EXPECT_EQ(decode(d, dst.data()), v) << dtype_name(s) << "->" << dtype_name(d);
      }
    }
  }
}

TEST(Convert, AnyToAnyFloatToIntTruncatesAndSaturates) {
  for (DType s : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    auto to_i64 = [&](double v) {
      auto src = encode(s, v);
      int64_t out = 0;
      convert(src.data(), s, &out, DType::i64, 1);
      return out;
    };
    auto to_u8 = [&](double v) {
      auto src = encode(s, v);
      uint8_t out = 0;
      convert(src.data(), s, &out, DType::u8, 1);
      return out;
    };
    EXPECT_EQ(to_i64(2.75), 2) << dtype_name(s);
    EXPECT_EQ(to_i64(-2.75), -2) << dtype_name(s);
    EXPECT_EQ(to_i64(0.5), 0) << dtype_name(s);
    EXPECT_EQ(to_i64(kInf), std::numeric_limits<int64_t>::max()) << dtype_name(s);
    EXPECT_EQ(to_i64(-kInf), std::numeric_limits<int64_t>::min()) << dtype_name(s);
    EXPECT_EQ(to_i64(std::nan("")), 0) << dtype_name(s);
    EXPECT_EQ(to_u8(2.75), 2) << dtype_name(s);
    EXPECT_EQ(to_u8(300.0), 255) << dtype_name(s);
    EXPECT_EQ(to_u8(-0.5), 0) << dtype_name(s);
    EXPECT_EQ(to_u8(-3.0), 0) << dtype_name(s);
    EXPECT_EQ(to_u8(std::nan("")), 0) << dtype_name(s);
  }
  EXPECT_EQ((convert_one<double, int64_t>(-0x1p63, DType::f64, DType::i64)), std::numeric_limits<int64_t>::min());
  EXPECT_EQ((convert_one<double, int64_t>(0x1p63, DType::f64, DType::i64)), std::numeric_limits<int64_t>::max());
}

TEST(Convert, AnyToAnyIntegersAndPrecision) {
  // i64 -> u8 wraps (C++ and PyTorch semantics); u8 -> i64 widens.
  EXPECT_EQ((convert_one<int64_t, uint8_t>(257, DType::i64, DType::u8)), 1);
  EXPECT_EQ((convert_one<int64_t, uint8_t>(-1, DType::i64, DType::u8)), 255);
  EXPECT_EQ((convert_one<uint8_t, int64_t>(200, DType::u8, DType::i64)), 200);
  // i64 -> f32: one RNE step.
  EXPECT_EQ((convert_one<int64_t, float>((1 << 24) + 1, DType::i64, DType::f32)), 16777216.0f);
  EXPECT_EQ((convert_one<int64_t, float>((1 << 24) + 3, DType::i64, DType::f32)), 16777220.0f);
  EXPECT_EQ((convert_one<int64_t, float>((int64_t(1) << 60) + (int64_t(1) << 36) + 1, DType::i64, DType::f32)),
            0x1p60f + 0x1p37f);
  // Just above a tie: rounding twice (f64 -> f32 -> 16-bit) would land on the tie and go
  // to even; the result must be the single correctly rounded value.
  EXPECT_EQ((convert_one<double, uint16_t>(1 + 0x1p-11 + 0x1p-40, DType::f64, DType::f16)), 0x3c01);
  EXPECT_EQ((convert_one<double, uint16_t>(-(1 + 0x1p-11 + 0x1p-40), DType::f64, DType::f16)), 0xbc01);
  EXPECT_EQ((convert_one<double, uint16_t>(1 + 0x1p-11, DType::f64, DType::f16)), 0x3c00);
  EXPECT_EQ((convert_one<double, uint16_t>(1 + 0x1p-8 + 0x1p-40, DType::f64, DType::bf16)), 0x3f81);
  EXPECT_EQ((convert_one<double, uint16_t>(0x1.4p-132 + 0x1p-170, DType::f64, DType::bf16)), 0x0003);
  EXPECT_EQ((convert_one<int64_t, uint16_t>((int64_t(1) << 60) + (int64_t(1) << 52) + 1, DType::i64, DType::bf16)),
            0x5d81);
  EXPECT_EQ((convert_one<int64_t, uint16_t>(65519, DType::i64, DType::f16)), 0x7bff);
  EXPECT_EQ((convert_one<int64_t, uint16_t>(65520, DType::i64, DType::f16)), 0x7c00);
  EXPECT_EQ((convert_one<int64_t, uint16_t>(std::numeric_limits<int64_t>::min(), DType::i64, DType::bf16)), 0xdf00);
  EXPECT_EQ((convert_one<double, uint16_t>(1e300, DType::f64, DType::f16)), 0x7c00);
  EXPECT_EQ((convert_one<double, uint16_t>(-1e300, DType::f64, DType::bf16)), 0xff80);
  EXPECT_EQ((convert_one<double, uint16_t>(-1e-300, DType::f64, DType::bf16)), 0x8000);
  EXPECT_EQ((convert_one<double, uint16_t>(-0x1p-1070, DType::f64, DType::f16)), 0x8000);
  EXPECT_TRUE(std::isnan(decode_f16(convert_one<double, uint16_t>(std::nan(""), DType::f64, DType::f16))));
  EXPECT_TRUE(std::isnan(decode_bf16(convert_one<double, uint16_t>(-std::nan(""), DType::f64, DType::bf16))));
  // bf16 <-> f16 goes through the exact f32: one rounding.
  EXPECT_EQ((convert_one<uint16_t, uint16_t>(0x3f81, DType::bf16, DType::f16)), 0x3c08);
  EXPECT_EQ((convert_one<uint16_t, uint16_t>(0x3c01, DType::f16, DType::bf16)), 0x3f80);
}

TEST(Convert, AnyToAnyF64ToHalfMatchesReferenceOnRandomValues) {
  const size_t n = kSanitized ? 100'000 : (size_t(1) << 17) + 3;  // also the parallel path
  std::vector<double> src(n);
  uint64_t state = 11;
  for (auto& d : src) {
    // Random f64 with exponents spanning both formats' subnormal-to-overflow ranges.
    uint64_t r = splitmix64(state);
    int exp = int(r % 300) - 150;
    d = std::ldexp(1.0 + double(splitmix64(state) >> 12) * 0x1p-52, exp) * ((r >> 20) & 1 ? -1 : 1);
  }
  std::vector<uint16_t> h(n), bf(n);
  convert(src.data(), DType::f64, h.data(), DType::f16, n);
  convert(src.data(), DType::f64, bf.data(), DType::bf16, n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_value(decode_f16(h[i]), ref_f16(src[i]))) << std::hexfloat << src[i];
    ASSERT_TRUE(same_value(decode_bf16(bf[i]), ref_bf16(src[i]))) << std::hexfloat << src[i];
  }
}

TEST(Convert, AnyToAnyBulkPathsAndSameType) {
  std::vector<float> src = {1.5f, -2.25f, 65520.0f, std::ldexp(1.0f, -25), 3.0f};
  std::vector<uint16_t> via_convert(src.size()), via_bulk(src.size());
  convert(src.data(), DType::f32, via_convert.data(), DType::f16, src.size());
  convert_f32_to_f16(src.data(), via_bulk.data(), src.size());
  EXPECT_EQ(via_convert, via_bulk);
  convert(src.data(), DType::f32, via_convert.data(), DType::bf16, src.size());
  convert_f32_to_bf16(src.data(), via_bulk.data(), src.size());
  EXPECT_EQ(via_convert, via_bulk);
  std::vector<float> back(src.size());
  convert(via_convert.data(), DType::bf16, back.data(), DType::f32, back.size());
  EXPECT_EQ(back[0], 1.5f);
  std::vector<float> copy(src.size());
  convert(src.data(), DType::f32, copy.data(), DType::f32, src.size());
  EXPECT_EQ(copy, src);
  convert(src.data(), DType::f32, src.data(), DType::f32, src.size());  // in place: no-op
  EXPECT_EQ(copy, src);
  convert(nullptr, DType::f64, nullptr, DType::u8, 0);
}

// ---- parse_dtype ----

TEST(ParseDtype, AcceptsKnownSpellings) {
  const std::pair<const char*, DType> cases[] = {
      {"f64", DType::f64},       {"float64", DType::f64}, {"double", DType::f64}, {"f32", DType::f32},
      {"float32", DType::f32},   {"float", DType::f32},   {"fp32", DType::f32},   {"bf16", DType::bf16},
      {"bfloat16", DType::bf16}, {"f16", DType::f16},     {"fp16", DType::f16},   {"float16", DType::f16},
      {"half", DType::f16},      {"i64", DType::i64},     {"int64", DType::i64},  {"u8", DType::u8},
      {"uint8", DType::u8}};
  for (const auto& [name, t] : cases) {
    auto got = parse_dtype(name);
    ASSERT_TRUE(got.has_value()) << name;
    EXPECT_EQ(*got, t) << name;
  }
  for (DType t : kAll) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
}

TEST(ParseDtype, RejectsEverythingElse) {
  for (const char* bad : {"", "F32", "BF16", "bf", "fp8", "float8", "int32", "f32 ", " f16", "uint16", "bfloat", "f"})
    EXPECT_FALSE(parse_dtype(bad).has_value()) << bad;
}

}  // namespace
}  // namespace mixprec
