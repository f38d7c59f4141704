// The bf16 tiles' products on AMX (attention_tile.h, amx_gemm): TDPBF16PS multiplies a 16-row
// tile of A (32 bf16 of the contraction a row) by a tile of B packed as the vector kernels pack it
// ([k / 2][n][2]: AMX's own B layout), 16 x 16 f32 sums a tile. The tile configuration is loaded,
// and the tiles released, by each call or by the AmxScope around a task's calls (oneDNN's AMX
// kernels load their own configuration between attention calls), so no tile state outlives them.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/simd.h"  // <immintrin.h>, with GCC 12's false warnings off
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention_tile.h"
#include "mixprec/cpu.h"

#define MIXPREC_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace mixprec::kernels::cpu::attn {
namespace {

thread_local int tl_scopes = 0;  // AmxScopes alive on this thread

// The tiles for one call: configured at its start and released at its end, unless a scope holds them.
class CallTiles {
 public:
  CallTiles() : own_(tl_scopes == 0) {
    if (own_) amx::configure();  // every tile 16 rows of 64 bytes (amx_tiles.h)
  }
  ~CallTiles() {
    if (own_) amx::release();
  }
  CallTiles(const CallTiles&) = delete;
  CallTiles& operator=(const CallTiles&) = delete;

 private:
  bool own_;
};

bool amx_asked_off() {
  const char* env = std::getenv("MIXPREC_ATTENTION_AMX");
  return env != nullptr && std::string_view(env) == "off";
}
std::atomic<bool>& amx_flag() {
  static std::atomic<bool> on{mixprec::cpu::has_amx_bf16() && !amx_asked_off()};
  return on;
}

// C[16 MR x 16 NR] (+)= A[16 MR x (k0, k1)] B over the contraction k0 .. k1 (multiples of 32).
// Tiles: C 0-3 (row block, column block: 0 = (0, 0), 1 = (0, 1), 2 = (1, 0), 3 = (1, 1)), A 4-5,
// B 6-7. b points at the block's first column in the packed rows (n_pad wide).
template <int MR, int NR>
MIXPREC_AMX_TARGET void block(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t n_pad, int64_t k0, int64_t k1,
                              float* c, int64_t ldc, bool accumulate) {
  const int64_t sa = lda * 2, sb = n_pad * 4, sc = ldc * 4;
  float* c1 = c + 16 * ldc;
  if (accumulate) {
    _tile_loadd(0, c, sc);
    if constexpr (NR == 2) _tile_loadd(1, c + 16, sc);
    if constexpr (MR == 2) _tile_loadd(2, c1, sc);
    if constexpr (MR == 2 && NR == 2) _tile_loadd(3, c1 + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NR == 2) _tile_zero(1);
    if constexpr (MR == 2) _tile_zero(2);
    if constexpr (MR == 2 && NR == 2) _tile_zero(3);
  }
  for (int64_t kk = k0; kk < k1; kk += 32) {
    const uint16_t* bk = b + kk * n_pad;  // pair row kk / 2, n_pad pairs a row
    _tile_loadd(4, a + kk, sa);
    _tile_loadd(6, bk, sb);
    if constexpr (NR == 2) _tile_loadd(7, bk + 32, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NR == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MR == 2) {
      _tile_loadd(5, a + 16 * lda + kk, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NR == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, sc);
  if constexpr (NR == 2) _tile_stored(1, c + 16, sc);
  if constexpr (MR == 2) _tile_stored(2, c1, sc);
  if constexpr (MR == 2 && NR == 2) _tile_stored(3, c1 + 16, sc);
}

}  // namespace

AmxScope::AmxScope(bool use) : on_(use && amx_products()) {
  if (on_ && tl_scopes++ == 0) amx::configure();
}
AmxScope::~AmxScope() {
  if (on_ && --tl_scopes == 0) amx::release();
}

bool amx_products() { return amx_flag().load(std::memory_order_relaxed); }
void set_amx_products(bool on) { amx_flag().store(on && mixprec::cpu::has_amx_bf16()); }

MIXPREC_AMX_TARGET int64_t amx_gemm(int64_t m, int64_t n_pad, int64_t k, const uint16_t* a, int64_t lda,
                                    const uint16_t* b, float* c, int64_t ldc, bool accumulate, Live live) {
  const int64_t m16 = m / 16 * 16;
  const CallTiles tiles;
  for (int64_t r0 = 0; r0 < m16; r0 += 32) {
    const int mr = r0 + 32 <= m16 ? 2 : 1;
    // One past the last live key of the block's rows (scores, k_end), as gemm's.
    const int64_t end = r0 + 16 * mr + live.diag;
    for (int64_t n0 = 0; n0 < n_pad; n0 += 32) {
      int nr = n0 + 32 <= n_pad ? 2 : 1;
      int64_t k0 = 0, k1 = k;
      if (live.kind == Live::scores) {
        if (n0 >= end) continue;  // every column of the block is past every row's last key
        if (n0 + 16 >= end) nr = 1;
      } else if (live.kind == Live::k_end) {
        k1 = std::clamp<int64_t>(round_up(end, 32), 0, k);  // the keys past it add zeros
      } else if (live.kind == Live::k_begin) {
        k0 = std::clamp<int64_t>((n0 - live.diag) / 32 * 32, 0, k);  // the queries before it add zeros
      }
      const uint16_t* ab = a + r0 * lda;
      const uint16_t* bb = b + n0 * 2;
      float* cb = c + r0 * ldc + n0;
      if (mr == 2 && nr == 2)
        block<2, 2>(ab, lda, bb, n_pad, k0, k1, cb, ldc, accumulate);
      else if (mr == 2)
        block<2, 1>(ab, lda, bb, n_pad, k0, k1, cb, ldc, accumulate);
      else if (nr == 2)
        block<1, 2>(ab, lda, bb, n_pad, k0, k1, cb, ldc, accumulate);
      else
        block<1, 1>(ab, lda, bb, n_pad, k0, k1, cb, ldc, accumulate);
    }
  }
  return m16;
}

MIXPREC_AMX_TARGET void amx_row_dots(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t rows,
                                     int64_t k, float* dst, uint16_t* pack, float* tile) {
  const CallTiles tiles;
  for (int64_t r0 = 0; r0 + 16 <= rows; r0 += 16) {
    pack_bt(b + r0 * ldb, ldb, k, 16, 16, pack);  // b's 16 rows as the B operand: [k / 2][16][2]
    block<1, 1>(a + r0 * lda, lda, pack, 16, 0, k, tile, 16, false);
    for (int64_t i = 0; i < 16; ++i) dst[r0 + i] = tile[i * 17];
  }
}

}  // namespace mixprec::kernels::cpu::attn
