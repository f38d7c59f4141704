// oneDNN matmul against a naive double-accumulation reference: dtypes, transposes via strides,
// odd sizes, batches, bias, relu, accumulate, dense fallback, scratchpad accounting, the cache.
#include "kernels/cpu/dnnl_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/error.h"

namespace {

using namespace mixprec;
using namespace mixprec::kernels::cpu;

// RNE to bf16 (finite inputs only); our own so this test needs no convert.cpp.
uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Elements of one dtype; values read back as float are exactly what the kernel sees.
struct Buffer {
  DType t;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Buffer(DType type, int64_t n) : t(type) {
    if (t == DType::f32)
      f32.assign(size_t(n), 0.f);
    else
      bf16.assign(size_t(n), 0);
  }
  void* data() { return t == DType::f32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  int64_t size() const { return int64_t(f32.size() + bf16.size()); }
  float get(int64_t i) const { return t == DType::f32 ? f32[size_t(i)] : bf16_value(bf16[size_t(i)]); }
  void set(int64_t i, float v) {
    if (t == DType::f32)
      f32[size_t(i)] = v;
    else
      bf16[size_t(i)] = round_bf16(v);
  }
};

constexpr float kSentinel = 1234.5f;  // exact in bf16: padding the kernel must not write

struct Case {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  DType in_t = DType::f32, dst_t = DType::f32;
  bool trans_src = false, trans_wei = false;      // stored as [k,m] / [n,k]
  int64_t src_pad = 0, wei_pad = 0, dst_pad = 0;  // extra elements per stored row
  int64_t src_step = 1, wei_step = 1;             // element stride inside a stored row
  bool bias = false;
  DType bias_t = DType::f32;
  bool relu = false, accumulate = false;
  bool wei_broadcast = false;  // one wei for every batch (stride 0)
};

std::string describe(const Case& c) {
  return detail::concat(dtype_name(c.in_t), "->", dtype_name(c.dst_t), " b=", c.batch, " m=", c.m, " n=", c.n,
                        " k=", c.k, c.trans_src ? " srcT" : "", c.trans_wei ? " weiT" : "", c.bias ? " bias:" : "",
                        c.bias ? dtype_name(c.bias_t) : "", c.relu ? " relu" : "", c.accumulate ? " acc" : "",
                        c.wei_broadcast ? " wei-bcast" : "");
}

struct Problem {
  MatmulArgs args;
  Buffer src, wei, dst, bias;
  std::vector<float> dst_before;
};

Problem make_problem(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  MatmulArgs a;
  a.batch = c.batch, a.m = c.m, a.n = c.n, a.k = c.k;
  a.src_t = a.wei_t = c.in_t, a.dst_t = c.dst_t;
  // src [m,k]: stored as [m, k*step+pad], or transposed as [k, m*step+pad]; wei likewise.
  const int64_t src_ld = (c.trans_src ? c.m : c.k) * c.src_step + c.src_pad;
  a.src_stride_m = c.trans_src ? c.src_step : src_ld;
  a.src_stride_k = c.trans_src ? src_ld : c.src_step;
  a.src_stride_batch = (c.trans_src ? c.k : c.m) * src_ld;
  const int64_t wei_ld = (c.trans_wei ? c.k : c.n) * c.wei_step + c.wei_pad;
  a.wei_stride_k = c.trans_wei ? c.wei_step : wei_ld;
  a.wei_stride_n = c.trans_wei ? wei_ld : c.wei_step;
  a.wei_stride_batch = c.wei_broadcast ? 0 : (c.trans_wei ? c.n : c.k) * wei_ld;
  a.dst_stride_m = c.n + c.dst_pad;
  a.dst_stride_batch = c.m * a.dst_stride_m;
  a.relu = c.relu, a.accumulate = c.accumulate;

  Problem p{a,
            Buffer(c.in_t, c.batch * a.src_stride_batch),
            Buffer(c.in_t, (c.wei_broadcast ? 1 : c.batch) * (c.trans_wei ? c.n : c.k) * wei_ld),
            Buffer(c.dst_t, c.batch * a.dst_stride_batch),
            Buffer(c.bias_t, c.n),
            {}};
  for (int64_t i = 0; i < p.src.size(); ++i) p.src.set(i, uni(rng));
  for (int64_t i = 0; i < p.wei.size(); ++i) p.wei.set(i, uni(rng));
  for (int64_t i = 0; i < c.n; ++i) p.bias.set(i, uni(rng));
  const int64_t dst_elems = c.batch * a.dst_stride_batch;
  for (int64_t i = 0; i < dst_elems; ++i) p.dst.set(i, (i % a.dst_stride_m) < c.n ? uni(rng) : kSentinel);
  for (int64_t i = 0; i < dst_elems; ++i) p.dst_before.push_back(p.dst.get(i));
  p.args.src = p.src.data();
  p.args.wei = p.wei.data();
  p.args.dst = p.dst.data();
  if (c.bias) {
    p.args.bias = p.bias.data();
    p.args.bias_t = c.bias_t;
  }
  return p;
}

// Runs the case and compares with double accumulation over the (already rounded) inputs.
// Bound: 1e-5 of the magnitude sum (f32 accumulation order), plus half a bf16 ulp of the
// result (2^-8 relative) when dst is bf16.
void check_case(const Case& c, uint32_t seed = 1) {
  SCOPED_TRACE(describe(c));
  Problem p = make_problem(c, seed);
  const MatmulArgs& a = p.args;
  matmul(a);
  int64_t bad = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double x = p.src.get(b * a.src_stride_batch + i * a.src_stride_m + kk * a.src_stride_k);
          const double w = p.wei.get(b * a.wei_stride_batch + kk * a.wei_stride_k + j * a.wei_stride_n);
          acc += x * w;
          mag += std::abs(x * w);
        }
        const int64_t at = b * a.dst_stride_batch + i * a.dst_stride_m + j;
        if (c.bias) {
          acc += p.bias.get(j);
          mag += std::abs(p.bias.get(j));
        }
        if (c.relu) acc = std::max(acc, 0.0);
        if (c.accumulate) {
          acc += p.dst_before[size_t(at)];
          mag += std::abs(p.dst_before[size_t(at)]);
        }
        double tol = 1e-5 * mag + 1e-12;
        if (c.dst_t == DType::bf16) tol += std::ldexp(std::abs(acc), -8);
        const double got = p.dst.get(at);
        if (!(std::abs(got - acc) <= tol) && bad++ < 5)
          ADD_FAILURE() << "dst[" << b << "][" << i << "][" << j << "] = " << got << ", expected " << acc << " +- "
                        << tol;
      }
  EXPECT_EQ(bad, 0);
  // Padding between rows is not part of dst: it must keep its sentinel.
  for (size_t i = 0; i < p.dst_before.size(); ++i)
    if (p.dst_before[i] == kSentinel) {
      ASSERT_EQ(p.dst.get(int64_t(i)), kSentinel) << "padding written at " << i;
    }
}

struct Combo {
  DType in_t, dst_t;
};
constexpr Combo kCombos[] = {{DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}};

// The combinations this host's oneDNN computes: bf16 only where it has a bf16 matmul (an AVX-512
// host; not an AVX2 one, where the op layer widens bf16 to f32 instead, which
// ProfileHost.Bf16InF32RunsOneDnnsF32Kernels checks). Says so when it leaves bf16 out.
std::vector<Combo> host_combos() {
  if (matmul_has_bf16()) return {std::begin(kCombos), std::end(kCombos)};
  std::printf("[ skipped  ] bf16 combinations: oneDNN has no bf16 matmul on this host (ISA %s)\n",
              dnnl_isa_name().c_str());
  return {kCombos[0]};
}

TEST(DnnlMatmul, AllTransposesViaStrides) {
  for (Combo d : host_combos())
    for (int ts = 0; ts < 2; ++ts)
      for (int tw = 0; tw < 2; ++tw)
        check_case(
            {.m = 33, .n = 17, .k = 257, .in_t = d.in_t, .dst_t = d.dst_t, .trans_src = ts == 1, .trans_wei = tw == 1});
}

TEST(DnnlMatmul, OddSizes) {
  const int64_t sizes[] = {1, 3, 17, 33, 257};
  for (Combo d : host_combos()) {
    for (int64_t s : sizes) {
      check_case({.m = s, .n = 17, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t});
      check_case({.m = 33, .n = s, .k = 17, .in_t = d.in_t, .dst_t = d.dst_t, .trans_wei = true});
      check_case({.m = 17, .n = 33, .k = s, .in_t = d.in_t, .dst_t = d.dst_t, .trans_src = true});
    }
    check_case({.m = 257, .n = 257, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .trans_wei = true});
  }
}

TEST(DnnlMatmul, PaddedLeadingDimensions) {
  for (Combo d : host_combos())
    for (int ts = 0; ts < 2; ++ts)
      check_case({.m = 17,
                  .n = 33,
                  .k = 33,
                  .in_t = d.in_t,
                  .dst_t = d.dst_t,
                  .trans_src = ts == 1,
                  .trans_wei = ts == 0,
                  .src_pad = 5,
                  .wei_pad = 3,
                  .dst_pad = 7});
}

TEST(DnnlMatmul, Batched) {
  for (Combo d : host_combos()) {
    check_case({.batch = 3, .m = 17, .n = 33, .k = 3, .in_t = d.in_t, .dst_t = d.dst_t});
    check_case({.batch = 4,
                .m = 33,
                .n = 17,
                .k = 33,
                .in_t = d.in_t,
                .dst_t = d.dst_t,
                .trans_src = true,
                .trans_wei = true});
    check_case({.batch = 3,
                .m = 3,
                .n = 17,
                .k = 33,
                .in_t = d.in_t,
                .dst_t = d.dst_t,
                .trans_wei = true,
                .bias = true,
                .relu = true,
                .accumulate = true,
                .wei_broadcast = true});
  }
}

TEST(DnnlMatmul, BiasReluAccumulate) {
  for (Combo d : host_combos()) {
    std::vector<DType> bias_types{DType::f32};
    if (d.in_t == DType::bf16) bias_types.push_back(DType::bf16);
    for (DType bt : bias_types)
      check_case(
          {.m = 33, .n = 17, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .trans_wei = true, .bias = true, .bias_t = bt});
    check_case({.m = 33, .n = 17, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .relu = true});
    check_case({.m = 33, .n = 17, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .trans_src = true, .accumulate = true});
    check_case({.m = 17,
                .n = 33,
                .k = 257,
                .in_t = d.in_t,
                .dst_t = d.dst_t,
                .bias = true,
                .bias_t = bias_types.back(),
                .relu = true,
                .accumulate = true});
  }
}

// With no unit stride oneDNN only has ref:any (~1000x slower); the operand is copied dense first.
TEST(DnnlMatmul, NoUnitStrideOperandIsCopiedDense) {
  for (Combo d : host_combos()) {
    const Case src_case{.m = 17, .n = 33, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .src_step = 2, .bias = true};
    const Case wei_case{
        .m = 17, .n = 33, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .trans_wei = true, .wei_step = 3, .relu = true};
    for (const Case& c : {src_case, wei_case}) {
      const std::string impl = matmul_impl_name(make_problem(c, 1).args);
      EXPECT_EQ(impl.rfind("ref", 0), std::string::npos) << impl;
      EXPECT_NE(impl.find(c.src_step > 1 ? "+dense(src)" : "+dense(wei)"), std::string::npos) << impl;
      check_case(c);
    }
  }
}

TEST(DnnlMatmul, EmptyAndZeroK) {
  for (Combo d : host_combos())
    check_case({.batch = 2,
                .m = 3,
                .n = 5,
                .k = 0,
                .in_t = d.in_t,
                .dst_t = d.dst_t,
                .bias = true,
                .relu = true,
                .accumulate = true});
  Problem p = make_problem({.m = 3, .n = 5, .k = 0}, 7);
  MatmulArgs a = p.args;
  a.m = 0;
  a.src = a.wei = a.dst = nullptr;  // nothing to write: no pointer needed
  matmul(a);
  a.m = 3;
  EXPECT_THROW(matmul(a), Error);  // now there is
}

TEST(DnnlMatmul, OnePrimitivePerShape) {
  matmul_cache_clear();
  const Combo d = host_combos().back();  // bf16 -> f32 where the host has it
  Case c{.m = 33, .n = 17, .k = 33, .in_t = d.in_t, .dst_t = d.dst_t, .trans_wei = true, .bias = true};
  check_case(c, 1);
  check_case(c, 2);  // new buffers, same shape: the key holds no pointers
  const CacheStats s = matmul_cache_stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.size, 1);
  c.relu = true;  // a different post-op is a different primitive
  check_case(c, 3);
  EXPECT_EQ(matmul_cache_stats().misses, 2);
}

TEST(DnnlMatmul, ScratchpadIsCountedAsWorkspace) {
  if (!matmul_has_bf16()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this host (ISA " << dnnl_isa_name() << ")";
  // bf16 with plain (non-blocked) weights: brgemm repacks them into a scratchpad.
  Case c{.m = 64, .n = 256, .k = 256, .in_t = DType::bf16, .dst_t = DType::bf16, .trans_wei = true};
  Problem p = make_problem(c, 9);
  const auto ws = static_cast<size_t>(MemCategory::workspace);
  const int64_t live_before = allocator::stats().live_bytes[ws];
  allocator::reset_peak();
  matmul(p.args);
  const MemoryStats s = allocator::stats();
  EXPECT_GT(s.peak_bytes[ws], live_before) << matmul_impl_name(p.args);
  EXPECT_EQ(s.live_bytes[ws], live_before);
}

TEST(DnnlMatmul, SupportedCombinations) {
  // oneDNN 2.6's bf16 kernels (native or emulated) all need AVX-512: none on an AVX2 host.
  const bool bf16 = matmul_has_bf16();
  EXPECT_EQ(bf16, dnnl_isa_name().rfind("avx512", 0) == 0) << dnnl_isa_name();
  MatmulArgs a;
  EXPECT_TRUE(matmul_supported(a));  // f32
  a.src_t = a.wei_t = a.dst_t = DType::bf16;
  EXPECT_EQ(matmul_supported(a), bf16);
  a.dst_t = DType::f32;
  EXPECT_EQ(matmul_supported(a), bf16);
  float bias = 0;
  a.bias = &bias;
  a.bias_t = DType::bf16;
  EXPECT_EQ(matmul_supported(a), bf16);
  a.src_t = a.wei_t = DType::f32;
  EXPECT_FALSE(matmul_supported(a));  // f32 matmul with a bf16 bias
  a.bias = nullptr;
  a.wei_t = DType::bf16;
  EXPECT_FALSE(matmul_supported(a));  // mixed inputs
  a.src_t = a.wei_t = a.dst_t = DType::f16;
  EXPECT_FALSE(matmul_supported(a));  // no f16 on CPU: computed through f32 by the caller
  a.m = a.n = a.k = 2;
  EXPECT_THROW(matmul(a), Error);
}

TEST(DnnlMatmul, RejectsBadShapes) {
  Problem p = make_problem({.m = 4, .n = 4, .k = 4}, 1);
  MatmulArgs a = p.args;
  a.m = -1;
  EXPECT_THROW(matmul(a), Error);
  a = p.args;
  a.dst_stride_m = 2;  // rows of dst would overlap
  EXPECT_THROW(matmul(a), Error);
}

// The MLP's three training products (forward, input gradient, weight gradient) in dtypes d.
std::vector<MatmulArgs> mlp_products(Combo d) {
  const int64_t batch = 512, in = 784, out = 1024;
  static char dummy;  // impl_name reads no data; any non-null pointer will do
  MatmulArgs fwd{.m = batch,
                 .n = out,
                 .k = in,
                 .src_t = d.in_t,
                 .wei_t = d.in_t,
                 .dst_t = d.dst_t,
                 .src = &dummy,
                 .src_stride_m = in,
                 .src_stride_k = 1,
                 .wei = &dummy,
                 .wei_stride_k = 1,
                 .wei_stride_n = in,
                 .dst = &dummy,
                 .dst_stride_m = out};
  MatmulArgs grad_x{.m = batch,
                    .n = in,
                    .k = out,
                    .src_t = d.in_t,
                    .wei_t = d.in_t,
                    .dst_t = d.dst_t,
                    .src = &dummy,
                    .src_stride_m = out,
                    .src_stride_k = 1,
                    .wei = &dummy,
                    .wei_stride_k = in,
                    .wei_stride_n = 1,
                    .dst = &dummy,
                    .dst_stride_m = in};
  MatmulArgs grad_w{.m = out,
                    .n = in,
                    .k = batch,
                    .src_t = d.in_t,
                    .wei_t = d.in_t,
                    .dst_t = d.dst_t,
                    .src = &dummy,
                    .src_stride_m = 1,
                    .src_stride_k = out,
                    .wei = &dummy,
                    .wei_stride_k = in,
                    .wei_stride_n = 1,
                    .dst = &dummy,
                    .dst_stride_m = in};
  return {fwd, grad_x, grad_w};
}

// The MLP's three training products must reach the fast kernels, on any host kind we run on:
// oneDNN's brgemm on an AVX-512 host, and on an AVX2 one (AMD Zen 2, 2026-12-02), where oneDNN 2.6
// has no brgemm matmul, its JIT GEMM. bf16 only where the host computes in bf16 (AVX512-BF16 or
// AMX-BF16): without either, oneDNN emulates bf16 through f32 in gemm:jit (an AVX-512 Xeon without
// BF16, 2026-11-27), or has no bf16 at all (AVX2), so mixprec's matmul widens bf16 to f32 there
// instead (ProfileHost.Bf16InF32RunsOneDnnsF32Kernels).
TEST(DnnlMatmul, MlpProductsUseFastKernels) {
  const bool native_bf16 = has_avx512_bf16() || has_amx_bf16();
  const std::string fast = dnnl_isa_name().rfind("avx512", 0) == 0 ? "brg:" : "gemm:jit";
  if (!native_bf16) std::printf("[ skipped  ] bf16 products: neither AVX512-BF16 nor AMX-BF16 on this host\n");
  for (Combo d : kCombos) {
    if (d.in_t == DType::bf16 && !native_bf16) continue;
    for (const MatmulArgs& a : mlp_products(d)) {
      const std::string impl = matmul_impl_name(a);
      EXPECT_EQ(impl.rfind(fast, 0), 0u) << dtype_name(d.in_t) << " " << impl << " (expected " << fast << ")";
    }
  }
}

// Each host kind's bf16 products run on its matrix unit: AMX tiles on the Intel kind (AMX-BF16),
// AVX512-BF16 dot products on the AMD Zen 5 kind (no AMX). Elsewhere nothing is asserted.
TEST(DnnlMatmul, Bf16ProductsUseTheHostsMatrixUnit) {
  std::string unit;
  if (has_amx_bf16() && dnnl_isa_name() == "avx512_core_amx")
    unit = "amx";
  else if (has_amx_bf16())
    GTEST_SKIP() << "AMX-BF16 present but oneDNN is limited to " << dnnl_isa_name() << " (ONEDNN_MAX_CPU_ISA?)";
  else if (has_avx512_bf16())
    unit = "avx512_core_bf16";
  else
    GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this host: no host kind's expectation applies";
  for (Combo d : kCombos) {
    if (d.in_t != DType::bf16) continue;
    for (const MatmulArgs& a : mlp_products(d)) {
      const std::string impl = matmul_impl_name(a);
      EXPECT_NE(impl.find(unit), std::string::npos) << impl << " (expected " << unit << ")";
    }
  }
}

TEST(PrimitiveCache, EvictsLeastRecentlyUsed) {
  PrimitiveCache<int, int> c(2);
  int made = 0;
  const auto make = [&] { return ++made; };
  EXPECT_EQ(c.get_or_create(1, make), 1);
  EXPECT_EQ(c.get_or_create(2, make), 2);
  EXPECT_EQ(c.get_or_create(1, make), 1);  // hit; 2 is now the oldest
  EXPECT_EQ(c.get_or_create(3, make), 3);  // evicts 2
  EXPECT_EQ(c.get_or_create(1, make), 1);
  EXPECT_EQ(c.get_or_create(2, make), 4);  // recreated
  const CacheStats s = c.stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 4);
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.size, 2);
  EXPECT_THROW(c.get_or_create(9, []() -> int { throw Error("no"); }), Error);
  EXPECT_EQ(c.stats().size, 2);
}

TEST(DnnlCommon, DtypesAndIsa) {
  EXPECT_EQ(to_dnnl(DType::f32), dnnl::memory::data_type::f32);
  EXPECT_EQ(to_dnnl(DType::bf16), dnnl::memory::data_type::bf16);
  EXPECT_EQ(to_dnnl(DType::f16), dnnl::memory::data_type::f16);
  EXPECT_FALSE(dnnl_isa_name().empty());
  if (has_amx_bf16()) {
    EXPECT_TRUE(has_avx512_bf16());  // every AMX CPU so far has both
  }
  std::printf("oneDNN ISA %s, avx512_bf16 %d, amx_bf16 %d\n", dnnl_isa_name().c_str(), has_avx512_bf16(),
              has_amx_bf16());
}

}  // namespace
