// Fused CPU attention, FlashAttention's way: blocks of 64 queries against blocks of 64 keys, an
// online softmax in f32, key blocks past the causal diagonal skipped, and only the output and the
// log-sum-exp [B, H, Tq] kept; the backward (FlashAttention-2's) recomputes each block's
// probabilities from the log-sum-exp, so no [Tq, Tk] matrix is ever stored. bf16 inputs multiply
// on bf16 pairs with f32 accumulation where bf16 computes natively (AVX512-BF16; the probabilities
// and dS are rounded to bf16 before their products, as FlashAttention does; tiles_for says where);
// f32 and f16 inputs, and bf16 elsewhere, compute in f32 with FMA (converted on load: no 16-bit
// arithmetic here). The probabilities' exponentials are exp_ps's (f32's accuracy) on f32 tiles and
// exp_bf16_ps's (3e-6 relative, half the instructions: vec_exp.h) on bf16 ones. Dropout's keep bits
// come from the same Philox words as the reference's (attention.h), recomputed by the backward.
// Where bf16 products run on AMX the forward (without dropout) transposes its scores instead
// (forward_transposed): a query's softmax runs down a column of S^T, 16 queries to a vector. OpenMP
// over (batch x head, query block) forward and over batch x head backward (each task owns its dK,
// dV and dQ).
// This file chooses the kernel and its tiles; the tiles' forward and backward are
// attention_forward.cpp and attention_backward.cpp, over the blocks of attention_blocks.h.
#include <cstdlib>
#include <string_view>
#include <utility>

#include "core/profile_detail.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/dnnl_common.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

using attn_blocks::backward;
using attn_blocks::forward;
using attn_blocks::forward_transposed;

bool supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  const DType t = q.dtype();
  return (t == DType::f32 || t == DType::bf16 || t == DType::f16) && k.dtype() == t && v.dtype() == t &&
         simd_lanes() != Lanes::none;
}
// Hosts without AVX-512 run the row kernel (cpu/attention_rows.cpp) instead of the tiles.
bool rows_kernel() { return simd_lanes() == Lanes::avx2; }
thread_local bool emulate_bf16_tiles = false;

// Which tiles a dtype's attention runs on: bf16 data on bf16 tiles where AVX512-BF16 is there and
// bf16 products compute natively (or, under EmulatedBf16Tiles, on emulated ones), everything else
// on f32 tiles (16-bit data widened on load). On the by_size kind (dnnl_common.h: Intel's
// AVX512-BF16 without AMX, whose VDPBF16PS runs at FMA's flop rate) the bf16 tiles' pair packing
// and roundings made the gpt's layer slower than f32 tiles (docs/hosts.md), so bf16 takes f32
// tiles there as on the f32 road; MIXPREC_BF16_PRODUCTS=native forces the bf16 tiles.
enum class Tiles { f32, bf16, emulated_bf16 };
Tiles tiles_for(DType t) {
  if (t != DType::bf16) return Tiles::f32;
  if (emulate_bf16_tiles) return Tiles::emulated_bf16;
  return mixprec::cpu::has_avx512_bf16() && !bf16_in_f32(true) ? Tiles::bf16 : Tiles::f32;
}
thread_local int transposed_override = -1;  // TransposedScores alive: 0 or 1
bool transposed_asked_off() {
  static const bool off = [] {
    const char* env = std::getenv("MIXPREC_ATTENTION_TRANSPOSED");
    return env != nullptr && std::string_view(env) == "off";
  }();
  return off;
}
// Whether the bf16 tiles' forward transposes its scores (forward_transposed): without dropout,
// where the products run on AMX or natively on AVX512-BF16 (measured on AMX and on AMD Zen 4, where
// the gpt's forward calls took 4.4-5.2 ms a step against 5.5-7.9 in rows: docs/hosts.md), unless
// MIXPREC_ATTENTION_TRANSPOSED=off; a TransposedScores decides instead while one lives.
bool transposed_scores(Tiles t, const AttentionParams& p) {
  if (t == Tiles::f32 || p.dropout > 0.0) return false;
  if (transposed_override >= 0) return transposed_override == 1;
  return (t == Tiles::bf16 || attn::amx_products()) && !transposed_asked_off();
}
// The kernel's name in the profile's implementation column.
constexpr const char* kRowsImpl = "mixprec:attention_rows_avx2";
const char* impl_of(Tiles t, bool transposed = false) {
  switch (t) {
    case Tiles::bf16:
      if (attn::amx_products())
        return transposed ? "mixprec:attention_tiles_bf16_amx_transposed" : "mixprec:attention_tiles_bf16_amx";
      return transposed ? "mixprec:attention_tiles_bf16_transposed" : "mixprec:attention_tiles_bf16";
    case Tiles::emulated_bf16:
      return transposed ? "mixprec:attention_tiles_emulated_bf16_transposed" : "mixprec:attention_tiles_emulated_bf16";
    case Tiles::f32:
      break;
  }
  return "mixprec:attention_tiles_f32";
}

}  // namespace

EmulatedBf16Tiles::EmulatedBf16Tiles() : previous_(emulate_bf16_tiles) { emulate_bf16_tiles = true; }
EmulatedBf16Tiles::~EmulatedBf16Tiles() { emulate_bf16_tiles = previous_; }
TransposedScores::TransposedScores(bool on) : previous_(transposed_override) { transposed_override = on ? 1 : 0; }
TransposedScores::~TransposedScores() { transposed_override = previous_; }

bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       AttentionForward& dst) {
  if (!supported(q, k, v)) return false;
  // [B, H, Tq, Ev] as a view of a [B, Tq, H, Ev] tensor (as PyTorch's flash attention returns it):
  // the heads' rows of one token lie side by side, so the [B, Tq, H * Ev] input of the projection
  // after attention is a view of the output, not a copy, and the two save one tensor for backward.
  dst.out = Tensor::empty({q.size(0), q.size(2), q.size(1), v.size(3)}, q.dtype()).transpose(1, 2);
  dst.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::f32);
  if (q.numel() == 0) return true;
  if (rows_kernel()) {
    profile::detail::note_impl(kRowsImpl);
    attn::forward_rows(q, k, v, p, dst);
    return true;
  }
  const Tiles tiles = tiles_for(q.dtype());
  const bool transposed = transposed_scores(tiles, p);
  profile::detail::note_impl(impl_of(tiles, transposed));
  switch (tiles) {
    case Tiles::bf16:
      transposed ? forward_transposed<uint16_t>(q, k, v, p, dst) : forward<uint16_t>(q, k, v, p, dst);
      break;
    case Tiles::emulated_bf16:
      transposed ? forward_transposed<attn::EmulatedBf16>(q, k, v, p, dst)
                 : forward<attn::EmulatedBf16>(q, k, v, p, dst);
      break;
    case Tiles::f32:
      forward<float>(q, k, v, p, dst);
      break;
  }
  return true;
}

bool attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                        const Tensor& grad_out, const AttentionParams& p, AttentionGrads& dst) {
  if (!supported(q, k, v) || grad_out.dtype() != q.dtype() || fwd.lse.dtype() != DType::f32) return false;
  for (auto [g, like] : {std::pair{&dst.dq, &q}, std::pair{&dst.dk, &k}, std::pair{&dst.dv, &v}})
    if (!g->defined() || g->shape() != like->shape() || g->dtype() != like->dtype() || g->strides().back() != 1)
      *g = Tensor::empty(like->shape(), like->dtype());
  if (rows_kernel()) {
    profile::detail::note_impl(kRowsImpl);
    attn::backward_rows(q, k, v, fwd, grad_out, p, dst);
    return true;
  }
  profile::detail::note_impl(impl_of(tiles_for(q.dtype())));
  switch (tiles_for(q.dtype())) {
    case Tiles::bf16:
      backward<uint16_t>(q, k, v, fwd, grad_out, p, dst);
      break;
    case Tiles::emulated_bf16:
      backward<attn::EmulatedBf16>(q, k, v, fwd, grad_out, p, dst);
      break;
    case Tiles::f32:
      backward<float>(q, k, v, fwd, grad_out, p, dst);
      break;
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
