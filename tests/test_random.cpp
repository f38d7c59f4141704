// The random-number module: Philox 4x32-10 against Random123's known-answer vectors, the word
// layout (counter = word / 4, stream), uniform and normal statistics, split streams that are
// independent, save/restore continuing the same words, fills and dropout masks that do not depend
// on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "kernels/kernels.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"

using namespace mixprec;

namespace {

using Words = std::array<uint32_t, 4>;

// Pearson correlation of two equally long samples.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= double(a.size());
  mb /= double(b.size());
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

std::vector<double> uniforms(Generator g, int n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = g.uniform();
  return v;
}

}  // namespace

// Random123's kat_vectors for philox4x32_10 (counter, key -> output).
TEST(Random, PhiloxKnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Word w of a stream is word w % 4 of the block at counter (w / 4, stream), key = seed.
TEST(Random, WordLayoutAndOffset) {
  Generator g(0x0123456789abcdefull);
  EXPECT_EQ(g.block(5), philox4x32_10({5, 0, 0, 0}, {0x89abcdef, 0x01234567}));
  for (int w = 0; w < 9; ++w) EXPECT_EQ(g.next_u32(), g.block(uint64_t(w) / 4)[size_t(w % 4)]) << w;
  EXPECT_EQ(g.offset(), 9u);
  // A bulk use starts at the next block and takes whole blocks.
  EXPECT_EQ(g.reserve(6), 3u);
  EXPECT_EQ(g.offset(), 18u);
  EXPECT_EQ(g.reserve(1), 5u);
  const Generator s = g.split(7);
  EXPECT_EQ(s.seed(), g.seed());
  EXPECT_EQ(s.offset(), 0u);
  EXPECT_EQ(s.block(1),
            philox4x32_10({1, 0, uint32_t(s.stream()), uint32_t(s.stream() >> 32)}, {0x89abcdef, 0x01234567}));
  EXPECT_EQ(g.split(7).stream(), s.stream());  // deterministic, and split does not advance g
  EXPECT_EQ(g.offset(), 21u);
}

TEST(Random, UniformAndNormalStatistics) {
  const int64_t n = 400000;
  Generator g(42);
  const std::vector<float> u = Tensor::uniform({n}, g, -2.0, 3.0).to_vector();
  double sum = 0, sq = 0;
  std::vector<int64_t> bins(10);
  for (float x : u) {
    ASSERT_GE(x, -2.0f);
    ASSERT_LT(x, 3.0f);
    sum += x;
    sq += double(x) * x;
    ++bins[size_t((x + 2.0) / 5.0 * 10)];
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(25.0 / 12 / n));  // 5 sigma
  EXPECT_NEAR(var, 25.0 / 12, 0.02);
  for (int64_t b : bins) EXPECT_NEAR(double(b), n / 10.0, 5 * std::sqrt(n * 0.1 * 0.9));

  const std::vector<double> z = Tensor::randn({n}, g, DType::f64, 2.0).to_vector_f64();
  double zs = 0, zq = 0, z4 = 0;
  int64_t within1 = 0;
  for (double x : z) {
    zs += x;
    zq += x * x;
    z4 += x * x * x * x;
    within1 += std::fabs(x) < 2.0;
  }
  EXPECT_NEAR(zs / n, 0.0, 5 * 2.0 / std::sqrt(double(n)));
  EXPECT_NEAR(zq / n, 4.0, 0.05);
  EXPECT_NEAR(z4 / n / 16.0, 3.0, 0.1);  // the normal's kurtosis
  EXPECT_NEAR(double(within1) / n, 0.682689, 0.005);

  // Sequential draws: uniform in [0, 1), normal N(0, 1), uniform_below without bias.
  double su = 0, sn = 0, snn = 0;
  std::vector<int64_t> below(7);
  for (int i = 0; i < 70000; ++i) {
    su += g.uniform();
    const double x = g.normal();
    sn += x;
    snn += x * x;
    ++below[g.uniform_below(7)];
  }
  EXPECT_NEAR(su / 70000, 0.5, 0.005);
  EXPECT_NEAR(sn / 70000, 0.0, 0.02);
  EXPECT_NEAR(snn / 70000, 1.0, 0.03);
  for (int64_t b : below) EXPECT_NEAR(double(b), 10000.0, 500.0);
  EXPECT_THROW(g.uniform_below(0), Error);
}

TEST(Random, SplitStreamsAreIndependent) {
  const Generator root(7);
  std::set<uint64_t> streams;
  for (uint64_t k = 0; k < 1000; ++k) streams.insert(root.split(k).stream());
  streams.insert(root.stream());
  EXPECT_EQ(streams.size(), 1001u);  // distinct keys, distinct streams
  EXPECT_NE(root.split(1).split(2).stream(), root.split(2).split(1).stream());
  EXPECT_NE(Generator(8).split(1).stream(), root.split(1).stream());
  // Uncorrelated: neighbouring keys, a parent and its child, two seeds.
  const int n = 100000;
  const double bound = 5 / std::sqrt(double(n));
  EXPECT_LT(std::fabs(correlation(uniforms(root.split(0), n), uniforms(root.split(1), n))), bound);
  EXPECT_LT(std::fabs(correlation(uniforms(root, n), uniforms(root.split(0), n))), bound);
  EXPECT_LT(std::fabs(correlation(uniforms(Generator(1), n), uniforms(Generator(2), n))), bound);
}

TEST(Random, SaveRestoreContinuesTheSameWords) {
  Generator g = Generator(99).split(3);
  (void)Tensor::randn({17}, g);
  (void)g.next_u32();
  const StateDict sd = g.state_dict();
  ASSERT_EQ(sd.size(), 3u);
  for (const auto& [k, t] : sd) {
    EXPECT_EQ(t.dtype(), DType::i64) << k;
    EXPECT_EQ(t.dim(), 0) << k;
  }
  const std::vector<float> a = Tensor::uniform({33}, g, 0, 1).to_vector();
  const double an = g.normal();
  Generator h(0);
  h.load_state_dict(sd);
  EXPECT_EQ(h.seed(), 99u);
  EXPECT_EQ(Tensor::uniform({33}, h, 0, 1).to_vector(), a);
  EXPECT_EQ(h.normal(), an);
  // u64 values above 2^63 survive the i64 tensors.
  Generator big(0xfedcba9876543210ull);
  Generator back;
  back.load_state_dict(big.state_dict());
  EXPECT_EQ(back.seed(), 0xfedcba9876543210ull);
  EXPECT_EQ(back.next_u64(), big.next_u64());
  // Errors name the key.
  StateDict bad = sd;
  bad[2].second = Tensor::scalar(1.0);
  try {
    h.load_state_dict(bad);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Generator.load_state_dict: 'offset' is f32 [], expected i64 []"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(h.load_state_dict({sd[0], sd[1]}), Error);
  bad = sd;
  bad.emplace_back("spare", state_i64(0));
  EXPECT_THROW(h.load_state_dict(bad), Error);
}

// Bulk draws are a function of the words, not of the thread count; every 32-bit and 16-bit dtype
// takes the same stream positions, so a bf16 fill is within half a bf16 ulp of the f32 fill.
TEST(Random, FillsDoNotDependOnThreads) {
  const int threads = omp_get_max_threads();
  auto draw = [](int t, DType dtype) {
    omp_set_num_threads(t);
    Generator g(5);
    std::vector<float> out = Tensor::uniform({100003}, g, -1, 1, dtype).to_vector();
    for (float x : Tensor::randn({50001}, g, dtype).to_vector()) out.push_back(x);
    for (float x : kernels::dropout_mask({70001}, dtype, 0.3, g, Device::cpu()).to_vector()) out.push_back(x);
    return out;
  };
  const std::vector<float> one = draw(1, DType::f32);
  EXPECT_EQ(draw(4, DType::f32), one);
  const std::vector<float> bf = draw(3, DType::bf16);
  omp_set_num_threads(threads);
  ASSERT_EQ(bf.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i)
    ASSERT_LE(std::fabs(bf[i] - one[i]), std::fabs(one[i]) * 0x1p-8f) << i;  // the same value, rounded
}

TEST(Random, DropoutMaskKeepsOneMinusP) {
  Generator g(11);
  const int64_t n = 200000;
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const Tensor mask = kernels::dropout_mask({n}, t, 0.25, g, Device::cpu());
    EXPECT_EQ(mask.dtype(), t);
    int64_t kept = 0;
    const double keep = Tensor::scalar(1 / 0.75, t).item();
    for (double v : mask.to_vector_f64()) {
      ASSERT_TRUE(v == 0.0 || v == keep) << v;
      kept += v != 0.0;
    }
    EXPECT_NEAR(double(kept) / n, 0.75, 5 * std::sqrt(0.75 * 0.25 / n)) << dtype_name(t);
  }
  // Element i is dropped when word i of the use is below p (the layout a GPU kernel reproduces).
  Generator a(12), b(12);
  const std::vector<float> m = kernels::dropout_mask({9}, DType::f32, 0.5, a, Device::cpu()).to_vector();
  const uint64_t first = b.reserve(9);
  for (size_t i = 0; i < 9; ++i) {
    const uint32_t w = b.block(first + i / 4)[i % 4];
    EXPECT_EQ(m[i], unit_from_u32(w) < 0.5 ? 0.0f : 2.0f) << i;
  }
  // The op uses the generator it is given, and the default one otherwise.
  Generator c(12);
  EXPECT_EQ(ops::dropout(Tensor::ones({9}), 0.5, true, &c).to_vector(), m);
  default_generator().manual_seed(12);
  EXPECT_EQ(ops::dropout(Tensor::ones({9}), 0.5, true).to_vector(), m);
}
