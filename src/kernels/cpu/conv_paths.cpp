// Which path each pass of a CPU convolution takes besides oneDNN's own primitive for it (dnnl_conv.h,
// "Paths"): mixprec's first-layer kernels, the weight gradient as matmuls or as a forward
// convolution, backward-weights split over the batch, backward-data as a forward convolution; the
// measurements behind each rule are in docs/conv.md.
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/allocator.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

bool native_asked(const char* env_var) {
  const char* env = std::getenv(env_var);
  return env != nullptr && std::string_view(env) == "native";
}
std::atomic<bool>& dgrad_as_forward_flag() {
  static std::atomic<bool> on{!native_asked("MIXPREC_CONV_DGRAD")};
  return on;
}
std::atomic<WgradForward>& wgrad_as_forward_mode() {
  static std::atomic<WgradForward> mode{native_asked("MIXPREC_CONV_WGRAD") ? WgradForward::off
                                                                           : WgradForward::where_faster};
  return mode;
}

std::atomic<WgradGemm>& wgrad_gemm_mode() {
  static std::atomic<WgradGemm> mode{[] {
    const char* env = std::getenv("MIXPREC_CONV_WGRAD");
    const std::string_view v = env != nullptr ? env : "";
    if (v == "gemm") return WgradGemm::force;  // wherever the geometry allows (measuring a host kind)
    return v == "native" || v == "forward" ? WgradGemm::off : WgradGemm::where_faster;
  }()};
  return mode;
}

std::atomic<WgradAmx>& wgrad_amx_mode() {
  static std::atomic<WgradAmx> mode{[] {
    const char* env = std::getenv("MIXPREC_CONV_WGRAD");
    const std::string_view v = env != nullptr ? env : "";
    if (v == "amx") return WgradAmx::force;
    return v == "native" || v == "forward" || v == "gemm" ? WgradAmx::off : WgradAmx::where_faster;
  }()};
  return mode;
}

// conv_in_f32's narrowest layer on the by_size kind, in weights per tap (32 -> 64).
constexpr int64_t kBf16InF32MinProducts = 2048;

// One group, stride 1, no dilation, padding at most k - 1 on each side: what both rewrites need.
bool rewritable(const ConvGeometry& g) {
  if (g.groups != 1) return false;
  if (g.stride_h != 1 || g.stride_w != 1 || g.dil_h != 1 || g.dil_w != 1) return false;
  const int64_t pad_r_h = g.oh - 1 + g.kh - g.h - g.pad_h, pad_r_w = g.ow - 1 + g.kw - g.w - g.pad_w;
  auto in_range = [](int64_t p, int64_t k) { return p >= 0 && p <= k - 1; };
  return in_range(g.pad_h, g.kh) && in_range(g.pad_w, g.kw) && in_range(pad_r_h, g.kh) && in_range(pad_r_w, g.kw);
}

}  // namespace

// Whether backward-weights runs split over the batch (see backward_weights_split).
bool split_wgrad(const ConvGeometry& g) { return omp_get_max_threads() > 1 && g.n >= 2; }

// A first layer's weight gradient (at most kFirstLayerChannels input channels and kSmallKTaps taps,
// one group) runs mixprec's own kernel (cpu/conv_small_k.cpp) in f32 and f16 on AVX2 and AVX-512
// hosts, in bf16 on AVX2 hosts and with AVX512-BF16 (where a layer's 16-bit convolutions compute in
// f32, this gradient reads the 16-bit tensors all the same: conv2d_backward; an AVX-512 CPU without
// AVX512-BF16 widens bf16 and runs the f32 kernel). oneDNN 2.6's kernels for it pad
// the input channels to a block of 8 (AVX2) or 16 (AVX-512) or, in bf16 at widths that are not a
// multiple of 16, fall back to its im2col GEMM; mixprec's ran 1.5-2x faster on each (docs/conv.md).
bool small_k_wgrad(const ConvGeometry& g, DType t) {
  if (g.groups != 1 || g.c > kFirstLayerChannels || g.c * g.kh * g.kw > kSmallKTaps) return false;
  const Lanes lanes = simd_lanes();
  return t == DType::bf16 ? lanes == Lanes::avx2 || mixprec::cpu::has_avx512_bf16()
                          : lanes != Lanes::none && (t == DType::f32 || t == DType::f16);
}

// On the by_size kind (dnnl_common.h: Intel's AVX512-BF16 without AMX, where VDPBF16PS has the f32
// FMAs' flops a cycle) a bf16 layer of at least kBf16InF32MinProducts weights per tap (first layers
// aside: they keep mixprec's bf16 kernels) computes in f32: oneDNN 2.6's f32 kernels ran its forward
// and both gradients faster than its bf16 ones, the casts included; narrower layers tie. One layer
// at 14 x 14, forward and both gradients, best of 5 interleaved (`bench/bf16_road_probe conv`,
// Emerald Rapids guest, 2 cores, 2026-12-03), f32/bf16 time: 8 -> 16 1.01, 16 -> 32 1.00, 32 -> 32
// (28 x 28) 0.99, 32 -> 64 0.90, 64 -> 64 0.86, 128 -> 128 0.76, 256 -> 256 0.65, 420 -> 1000 0.68.
bool conv_in_f32(const ConvGeometry& g, DType t) {
  if (t == DType::f16) return true;
  return t == DType::bf16 && bf16_in_f32(g.c > kFirstLayerChannels && g.c * g.oc >= kBf16InF32MinProducts);
}

// For a stride-1, undilated, one-group convolution with padding at most k - 1 on each side, the
// input gradient is the forward convolution of grad_y with the weight transposed (O <-> I) and
// flipped in both spatial axes, padded k - 1 - p: the same products and sums as backward-data.
// oneDNN 2.6's bf16 forward kernel runs them faster than its backward-data kernel on the AVX512-BF16
// kind (docs/conv.md: 196-203 against 221-233 ms for the 420 -> 1000 layer at batch 64, 2 threads);
// in f32 the two are equal, so f32 keeps backward-data. MIXPREC_CONV_DGRAD=native turns it off.
bool dgrad_as_forward(const ConvGeometry& g, DType t) {
  return t == DType::bf16 && dgrad_as_forward_flag().load() && rewritable(g) && g.c > kFirstLayerChannels &&
         g.oc > kFirstLayerChannels;
}

// The weight gradient as a forward convolution (wgrad_geometry): the same products, summed by a
// kernel whose threads own their outputs, against oneDNN 2.6's backward-weights split over the
// batch (one single-threaded primitive per thread and f32 partials summed after). bf16: 213-221 ms
// against 236-261 for the 420 -> 1000 layer at batch 64; f32: as fast (the fp32 step 1473 against
// 1476 ms), without the per-thread partial gradients (docs/conv.md). Its input channels are the
// batch: from 16 images, so that the blocked kernel has whole channel blocks to work on. Not in f32
// on a host without AVX512-BF16 or AMX-BF16 (where bf16 also computes in f32): on an AVX-512 Xeon
// without them (Cascade Lake, 2026-11-27) the split ran the wide cnn's fp32 step in 1465-1998 ms
// against 1822-2347 with the rewrite, three alternating pairs. Nor on Intel's AVX512-BF16 without
// AMX (the by_size kind), where the split ran faster in f32 and in bf16: `bench/ab.py` with
// MIXPREC_CONV_WGRAD=native, B/A medians of 4 interleaved repeats (Emerald Rapids guest, 2 cores,
// 2026-12-03): cnn 32/64 fp32 0.85, amp-bf16 0.92, cnn-bn fp32 0.79; the default cnn and the wide
// one (whose wide layer runs as matmuls) within noise. Nor on AMX hosts, where oneDNN's split
// backward-weights (brgconv_bwd_w on AMX tiles) ran the steps far faster than the rewrite:
// alternating `mixprec bench` runs (a Xeon with AMX-BF16 and AVX512-FP16, 2 MiB L2 a core, 2 cores,
// 2026-12-05, best step in ms, rewrite against MIXPREC_CONV_WGRAD=native): cnn 420/1000 at 64
// amp-bf16 390-400 against 206-211, fp32 1157-1184 against 913-925; cnn 32/64 at 256 amp-bf16
// 23-26 against 12.0-12.3, fp32 40-41 against 29.6-30.3; cnn-bn at 128 amp-bf16 53-54 against 34,
// fp32 92-94 against 71-72.
bool wgrad_as_forward(const ConvGeometry& g, DType t) {
  const WgradForward mode = wgrad_as_forward_mode().load();
  if (mode == WgradForward::off || (t != DType::bf16 && t != DType::f32) || !rewritable(g) || g.n < 16 ||
      g.c <= kFirstLayerChannels)
    return false;
  return mode == WgradForward::force || (!by_size_kind() && !has_amx_bf16() && (t == DType::bf16 || bf16_unit()));
}

// The bf16 weight gradient on mixprec's AMX kernel (cpu/conv_wgrad_amx.cpp) on AMX hosts, where it
// ran faster than oneDNN 2.6's backward-weights split over the batch (jit:avx512_core_amx_bf16, two
// single-threaded primitives of 32 images each, 85-88 ms, then their f32 partials reordered and
// summed) on the 420 -> 1000 layer at batch 64: alternating `mixprec bench --profile` runs (a Xeon
// with AMX-BF16, 2 cores, 2026-12-06, against MIXPREC_CONV_WGRAD=native), the layer's backward
// 106-112 ms against 138-148 and the wide cnn's amp-bf16 step 179-186 against 214-225 (the kernel's
// products about 47 ms, its packing 6, the f32 sums' transposition 2). Narrower layers were slower
// on it (forced with MIXPREC_CONV_WGRAD=amx): the cnn 32/64's 32 -> 64 layer 4.6-4.7 ms a backward
// against 4.0-4.1, the cnn-bn's 12.6-13.4 against 12.1-12.2. Hence from kWgradGemmMinProducts
// weights per tap, as the matmuls.
bool wgrad_amx(const ConvGeometry& g, DType t) {
  const WgradAmx mode = wgrad_amx_mode().load();
  if (mode == WgradAmx::off || t != DType::bf16 || !rewritable(g) || !has_amx_bf16()) return false;
  if (mode == WgradAmx::force) return true;
  return g.oc * g.c >= kWgradGemmMinProducts && g.c > kFirstLayerChannels;
}

// The weight gradient as one matmul per tap (cpu/conv_wgrad_gemm.cpp), where it beat the
// forward-convolution rewrite on the AVX512-BF16 kind (2026-12-02, oneDNN alone, 2 threads, the
// same minute; docs/conv.md, item 4). The 420 -> 1000 layer at 64 images of 14 x 14: bf16 144-152
// ms (gemm:jit) against 186-193, f32 315-346 against 560-569. 256 x 256 at 64 images: bf16 28-29
// against 30, f32 71-76 against 84. Smaller layers not faster: bf16 128 x 128 at 128 images 15
// against 15, 32 -> 64 at 256 images 4.1-6.5 against 4.4 (f32 11.7-14.3 against 10.8). Hence from
// kWgradGemmMinProducts weights per tap. f32 where the forward rewrite runs (a host with a bf16
// unit). Not on AMX hosts, where oneDNN's split backward-weights ran the wide cnn's step faster
// (2026-12-05, alternating `mixprec bench` runs, best step in ms, split against
// MIXPREC_CONV_WGRAD=gemm: amp-bf16 206-213 against 223-230, fp32 913-925 against 933-969).
bool wgrad_as_gemm(const ConvGeometry& g, DType t) {
  const WgradGemm mode = wgrad_gemm_mode().load();
  if (mode == WgradGemm::off || !rewritable(g) || !bf16_unit()) return false;
  if (t != DType::bf16 && t != DType::f32) return false;
  if (mode == WgradGemm::force) return true;
  return g.oc * g.c >= kWgradGemmMinProducts && g.n >= 16 && !has_amx_bf16();
}

// The forward convolution that computes g's input gradient (its right padding, k - 1 - g's, follows
// from the sizes in descs()).
ConvGeometry dgrad_geometry(const ConvGeometry& g) {
  ConvGeometry f = g;
  f.c = g.oc, f.h = g.oh, f.w = g.ow;
  f.oc = g.c, f.oh = g.h, f.ow = g.w;
  f.pad_h = g.kh - 1 - g.pad_h, f.pad_w = g.kw - 1 - g.pad_w;
  return f;
}

namespace {

// Row i of flipped_transposed's output, output channels [0, oc): each kernel of `taps` 16-bit
// elements (at most 32) reversed by one VPERMW between a masked load and a masked store, where
// the scalar loop spent about 2 ms a step on the wide cnn's 1000 x 420 x 3 x 3 weight (AMX kind,
// `perf`). The same elements moved, so the same bits.
__attribute__((target("avx512f,avx512bw"))) void flip_row_avx512(const uint16_t* src, int64_t c, int64_t i, int64_t oc,
                                                                 int64_t taps, uint16_t* dst) {
  alignas(64) uint16_t index[32] = {};
  for (int64_t k = 0; k < taps; ++k) index[k] = uint16_t(taps - 1 - k);
  const __m512i reverse = _mm512_load_si512(index);
  const __mmask32 mask = (__mmask32(1) << taps) - 1;
  for (int64_t o = 0; o < oc; ++o) {
    const __m512i v = _mm512_maskz_loadu_epi16(mask, src + (o * c + i) * taps);
    _mm512_mask_storeu_epi16(dst + o * taps, mask, _mm512_permutexvar_epi16(reverse, v));
  }
}

}  // namespace

// w [OC, C, KH, KW] (16-bit) -> [C, OC, KH, KW], each kernel reversed in both axes.
Tensor flipped_transposed(const Tensor& w, const ConvGeometry& g) {
  const MemoryScope scope(MemCategory::workspace);
  Tensor out = Tensor::empty({g.c, g.oc, g.kh, g.kw}, w.dtype());
  const auto* src = static_cast<const uint16_t*>(w.data_ptr());
  auto* dst = static_cast<uint16_t*>(out.data_ptr());
  const int64_t taps = g.kh * g.kw;
  const bool vector = taps < 32 && mixprec::cpu::has_avx512bw();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.c; ++i) {
    if (vector) {
      flip_row_avx512(src, g.c, i, g.oc, taps, dst + i * g.oc * taps);
      continue;
    }
    for (int64_t o = 0; o < g.oc; ++o) {
      const uint16_t* s = src + (o * g.c + i) * taps;
      uint16_t* d = dst + (i * g.oc + o) * taps;
      for (int64_t k = 0; k < taps; ++k) d[k] = s[taps - 1 - k];
    }
  }
  return out;
}

void set_conv_dgrad_as_forward(bool on) { dgrad_as_forward_flag().store(on); }
void set_conv_wgrad_as_forward(WgradForward mode) { wgrad_as_forward_mode().store(mode); }
void set_conv_wgrad_as_gemm(WgradGemm mode) { wgrad_gemm_mode().store(mode); }
void set_conv_wgrad_amx(WgradAmx mode) { wgrad_amx_mode().store(mode); }

}  // namespace mixprec::kernels::cpu
