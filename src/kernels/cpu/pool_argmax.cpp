// Fast CPU packing of max pooling's argmax into two bits an output and back (pool.h,
// pack_argmax_2bit): four taps a step through one 32-bit word, OpenMP over the bytes where the
// tensor is large enough. Each tap's low two bits are kept (the reference refuses larger taps).
#include <array>
#include <bit>
#include <cstring>

#include "core/parallel.h"
#include "kernels/pool.h"

namespace mixprec::kernels::cpu {
namespace {

static_assert(std::endian::native == std::endian::little, "a word's first byte is its low byte");

// Both passes touch a byte or a quarter of one per tap: about as many taps as an element-wise
// pass's elements before a second thread pays.
constexpr int64_t kMinParallelTaps = int64_t(1) << 18;

// The four taps of packed byte b as the little-endian word they are stored as.
constexpr std::array<uint32_t, 256> kUnpacked = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) t[b] = (b & 3) | (b >> 2 & 3) << 8 | (b >> 4 & 3) << 16 | (b >> 6 & 3) << 24;
  return t;
}();

}  // namespace

bool pack_argmax_2bit(const Tensor& argmax, Tensor& packed) {
  if (argmax.dtype() != DType::u8 || !argmax.is_contiguous()) return false;
  const int64_t n = argmax.numel(), whole = n / 4;
  const uint8_t* in = argmax.data<uint8_t>();
  uint8_t* out = packed.data<uint8_t>();
#pragma omp parallel for schedule(static) if (detail::parallel_worth(n, kMinParallelTaps))
  for (int64_t b = 0; b < whole; ++b) {
    uint32_t u;
    std::memcpy(&u, in + 4 * b, 4);
    u &= 0x03030303u;
    out[b] = uint8_t(u | u >> 6 | u >> 12 | u >> 18);
  }
  if (whole * 4 < n) {
    uint8_t last = 0;
    for (int64_t i = whole * 4; i < n; ++i) last = uint8_t(last | (in[i] & 3) << (2 * (i % 4)));
    out[whole] = last;
  }
  return true;
}

const uint8_t* ArgmaxTaps::taps(int64_t begin, int64_t n, uint8_t* buf) const {
  if (!two_bit) return data + begin;
  const auto tap = [&](int64_t i) { return uint8_t(data[i / 4] >> (2 * (i % 4)) & 3); };
  int64_t i = 0;
  for (; i < n && (begin + i) % 4 != 0; ++i) buf[i] = tap(begin + i);  // to a whole byte
  for (; i + 4 <= n; i += 4) std::memcpy(buf + i, &kUnpacked[data[(begin + i) / 4]], 4);
  for (; i < n; ++i) buf[i] = tap(begin + i);
  return buf;
}

bool unpack_argmax_2bit(const Tensor& packed, Tensor& argmax) {
  if (!packed.is_contiguous()) return false;
  const int64_t n = argmax.numel(), whole = n / 4;
  const uint8_t* in = packed.data<uint8_t>();
  uint8_t* out = argmax.data<uint8_t>();
#pragma omp parallel for schedule(static) if (detail::parallel_worth(n, kMinParallelTaps))
  for (int64_t b = 0; b < whole; ++b) std::memcpy(out + 4 * b, &kUnpacked[in[b]], 4);
  for (int64_t i = whole * 4; i < n; ++i) out[i] = uint8_t(in[whole] >> (2 * (i % 4)) & 3);
  return true;
}

}  // namespace mixprec::kernels::cpu
