// The Generator over Philox 4x32-10 (the rounds themselves: core/philox.h, shared with the GPU),
// and the uniform and normal fills.
#include "mixprec/random.h"

#include <cmath>
#include <numbers>

#include "core/philox.h"
#include "core/random_fill.h"
#include "mixprec/error.h"

namespace mixprec {

namespace {

// XORed into the seed for split(): the derivation of a stream id never reuses the key (and so
// never reproduces a word) of the streams themselves. The first words of pi's fraction.
constexpr uint32_t kSplit0 = 0x243F6A88u, kSplit1 = 0x85A308D3u;

inline uint32_t lo32(uint64_t x) { return uint32_t(x); }
inline uint32_t hi32(uint64_t x) { return uint32_t(x >> 32); }

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  const detail::PhiloxWords w = detail::philox4x32_10({{c[0], c[1], c[2], c[3]}}, k[0], k[1]);
  return {w.w[0], w.w[1], w.w[2], w.w[3]};
}

double unit_from_u32(uint32_t w) { return detail::unit24(w); }
double unit_from_u64(uint64_t w) { return detail::unit53(w); }

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  stream_ = 0;
  offset_ = 0;
}

Generator Generator::split(uint64_t key) const {
  const auto w = philox4x32_10({lo32(key), hi32(key), lo32(stream_), hi32(stream_)},
                               {lo32(seed_) ^ kSplit0, hi32(seed_) ^ kSplit1});
  Generator g(seed_);
  g.stream_ = uint64_t(w[0]) | uint64_t(w[1]) << 32;
  return g;
}

std::array<uint32_t, 4> Generator::block(uint64_t index) const {
  const detail::PhiloxWords w = detail::philox_block(seed_, stream_, index);
  return {w.w[0], w.w[1], w.w[2], w.w[3]};
}

uint64_t Generator::reserve(uint64_t n) {
  const uint64_t first = (offset_ + 3) / 4;
  offset_ = first * 4 + n;
  return first;
}

uint32_t Generator::next_u32() {
  const uint64_t w = offset_++;
  return block(w / 4)[w % 4];
}

uint64_t Generator::next_u64() {
  const uint64_t lo = next_u32();
  return lo | uint64_t(next_u32()) << 32;
}

double Generator::uniform() { return detail::unit53(next_u64()); }

double Generator::normal() {
  const auto w = block(reserve(4));
  const double u1 = 1.0 - detail::unit53(uint64_t(w[0]) | uint64_t(w[1]) << 32);  // (0, 1]: log is finite
  const double u2 = detail::unit53(uint64_t(w[2]) | uint64_t(w[3]) << 32);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

uint64_t Generator::uniform_below(uint64_t bound) {
  MIXPREC_CHECK(bound > 0, "Generator::uniform_below: the bound must be > 0");
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound: the low values that would bias
  uint64_t r;
  do r = next_u64();
  while (r < threshold);
  return r % bound;
}

StateDict Generator::state_dict() const {
  return {{"seed", state_i64(int64_t(seed_))},
          {"stream", state_i64(int64_t(stream_))},
          {"offset", state_i64(int64_t(offset_))}};
}

void Generator::load_state_dict(const StateDict& sd) {
  for (const auto& [k, t] : sd) {
    MIXPREC_CHECK(k == "seed" || k == "stream" || k == "offset", "Generator.load_state_dict: unexpected key '", k, "'");
    check_state("Generator", k, t, DType::i64, {});
  }
  for (const char* k : {"seed", "stream", "offset"})
    MIXPREC_CHECK(find_state(sd, k), "Generator.load_state_dict: missing key '", k, "'");
  seed_ = uint64_t(state_to_i64(*find_state(sd, "seed")));
  stream_ = uint64_t(state_to_i64(*find_state(sd, "stream")));
  offset_ = uint64_t(state_to_i64(*find_state(sd, "offset")));
}

Generator& default_generator() {
  thread_local Generator gen(0);
  return gen;
}

// ------------------------------------------------------------------------------------ fills

void fill_uniform(void* dst, DType dtype, int64_t n, double lo, double hi, Generator& gen) {
  MIXPREC_CHECK(is_floating(dtype), "uniform: ", dtype_name(dtype), " is not a floating dtype");
  const double span = hi - lo;
  if (dtype == DType::f64) {
    detail::fill_from_blocks<2>(dst, dtype, n, gen.reserve(4 * uint64_t((n + 1) / 2)), gen,
                                [&](const std::array<uint32_t, 4>& w, double* out) {
                                  out[0] = lo + span * detail::unit53(uint64_t(w[0]) | uint64_t(w[1]) << 32);
                                  out[1] = lo + span * detail::unit53(uint64_t(w[2]) | uint64_t(w[3]) << 32);
                                });
    return;
  }
  detail::fill_from_blocks<4>(dst, dtype, n, gen.reserve(uint64_t(n)), gen,
                              [&](const std::array<uint32_t, 4>& w, double* out) {
                                for (int j = 0; j < 4; ++j) out[j] = lo + span * detail::unit24(w[j]);
                              });
}

void fill_normal(void* dst, DType dtype, int64_t n, double mean, double std, Generator& gen) {
  MIXPREC_CHECK(is_floating(dtype), "normal: ", dtype_name(dtype), " is not a floating dtype");
  // One block per pair of elements: two 53-bit uniforms, the pair (r cos t, r sin t).
  detail::fill_from_blocks<2>(dst, dtype, n, gen.reserve(4 * uint64_t((n + 1) / 2)), gen,
                              [&](const std::array<uint32_t, 4>& w, double* out) {
                                const double u1 = 1.0 - detail::unit53(uint64_t(w[0]) | uint64_t(w[1]) << 32);
                                const double u2 = detail::unit53(uint64_t(w[2]) | uint64_t(w[3]) << 32);
                                const double r = std::sqrt(-2.0 * std::log(u1)), t = 2 * std::numbers::pi * u2;
                                out[0] = mean + std * r * std::cos(t);
                                out[1] = mean + std * r * std::sin(t);
                              });
}

}  // namespace mixprec
