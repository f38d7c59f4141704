// The one random-number generator: counter-based Philox 4x32-10 (Random123; PyTorch's CUDA
// generator), used by initialisation, dropout, stochastic rounding and the loader's shuffling.
// Not cryptographic.
#pragma once
#include <array>
#include <cstdint>

#include "mixprec/state_dict.h"
#include "mixprec/tensor.h"

namespace mixprec {

// One Philox 4x32-10 block: ten rounds of Philox's keyed bijection over a 128-bit counter
// (Random123's philox4x32_10, words least significant first).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A stream of 32-bit words: word w is word w % 4 of the Philox block with key = seed and counter
// = (w / 4 as the low 64 bits, stream as the high 64 bits). A value is a function of (seed,
// stream, word index) alone, so any thread, or a GPU kernel, computes element i of a bulk draw
// from its index, and a seed gives the same words on every device and thread count.
//
// The state is (seed, stream, offset): offset is the next unused word and advances by what each
// use takes. A bulk use (a tensor fill, a dropout mask) starts at a 4-word block boundary so that
// each block serves one use. split(key) derives an independent stream (e.g. per epoch, per
// parameter) without advancing this one.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);  // stream 0, offset 0
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }
  // Moves to word `offset` of this stream (a CUDA graph's replay advances its generators this way).
  void set_offset(uint64_t offset) { offset_ = offset; }

  // A generator with the same seed, a stream derived from (this stream, key), offset 0.
  Generator split(uint64_t key) const;

  // Words 4*index .. 4*index+3 of this stream (reads, does not advance).
  std::array<uint32_t, 4> block(uint64_t index) const;
  // Reserves n words for one bulk use and returns the index of the first block: the use reads
  // blocks first .. first + ceil(n / 4) - 1.
  uint64_t reserve(uint64_t n);

  // Sequential draws, one word after another.
  uint32_t next_u32();
  uint64_t next_u64();                     // two words, the first in the low half
  double uniform();                        // [0, 1) with 53 random bits (two words)
  double normal();                         // N(0, 1), Box-Muller over one whole block
  uint64_t uniform_below(uint64_t bound);  // uniform in [0, bound), by rejection (no modulo bias)

  // "seed", "stream", "offset": i64 0-d tensors holding the u64 bits. load_state_dict checks
  // names, dtypes and shapes; the restored generator continues with the same words.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 private:
  uint64_t seed_ = 0, stream_ = 0, offset_ = 0;
};

Generator& default_generator();  // thread-local, seed 0 until manual_seed

// Bulk draws into contiguous memory of a floating dtype, each one use of gen (parallel over
// blocks; the result does not depend on the thread count). uniform: lo + (hi - lo) * u rounded
// once to the dtype, u from 24 bits of one word per element (53 bits of two for f64). normal:
// mean + std * z, z from Box-Muller over one block per pair of elements, computed in f64.
void fill_uniform(void* dst, DType dtype, int64_t n, double lo, double hi, Generator& gen);
void fill_normal(void* dst, DType dtype, int64_t n, double mean, double std, Generator& gen);

// The unit-interval values of the words (exposed for kernels that draw from blocks themselves).
double unit_from_u32(uint32_t w);  // [0, 1), the top 24 bits
double unit_from_u64(uint64_t w);  // [0, 1), the top 53 bits

}  // namespace mixprec
