// oneDNN 2-d convolution behind kernels::cpu::conv2d_*: primitives cached by shape with
// oneDNN-chosen layouts (format_tag::any), activations reordered per call, weights reordered once
// per weight version (cached), bias and ReLU fused as post-ops. f16 is computed through f32.
#pragma once
#include <string>

#include "kernels/conv.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/pool.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cpu {

// weights_as_forward: the weight gradient as a forward convolution (cpu/conv_entries.cpp,
// wgrad_geometry), keyed by the layer's own geometry.
enum class ConvPass { forward, backward_data, backward_weights, weights_as_forward };

// The oneDNN implementation a pass of this convolution runs, e.g. "brgconv:avx512_core_amx_bf16"
// (creates and caches the primitive; "" when oneDNN has none and the reference runs instead).
std::string conv_impl_name(const ConvGeometry& g, DType t, ConvPass pass);

// mixprec's own weight gradient (and the bias's, when out.bias is defined) of a one-group
// convolution of at most kSmallKTaps taps (C x KH x KW), into out's tensors (f32 or bf16):
// cpu/conv_small_k.cpp. x and grad_y f32 (AVX2 or AVX-512) or bf16 (AVX-512). conv2d_backward runs
// it for first layers (small_k_wgrad, below).
constexpr int64_t kSmallKTaps = 32;
// With `up`, grad_y is not read (nor needed): it is the backward of the max pool that followed the
// convolution, each image's planes routed from the pool's gradient by its argmax (max_unpool_plane)
// as the kernel reads them, so the full-size grad_y is never written; the same bits.
struct UnpooledGrad {
  const Tensor* pooled;  // the pool's gradient [n, oc, pool.oh, pool.ow], x's dtype
  ArgmaxTaps argmax;     // its taps, one a byte or two bits each
  const PoolGeometry* pool;
  // Where a ReLU followed the convolution: the pool's output (the same shape and dtype), whose
  // values > 0 let the gradient through (max_unpool_plane's relu_y); else null.
  const Tensor* relu_y = nullptr;
};
void backward_weights_small_k(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out,
                              const UnpooledGrad* up = nullptr);
// The weight gradient (bf16 or f32 operands) of a stride-1, undilated, one-group convolution
// (padding at most k - 1 on each side) as one oneDNN matmul per tap over x and grad_y copied onto
// a shared zero-padded grid (cpu/conv_wgrad_gemm.cpp has the identity), f32 sums rounded once into
// weight_grad (f32, or bf16 from bf16 operands). conv2d_backward runs it for wide layers on hosts
// with AVX512-BF16 and no AMX (wgrad_as_gemm, below).
constexpr int64_t kWgradChunkPositions = 4096;  // grid positions per chunk of images (whole eights), at least
struct WgradGrid {
  int64_t hp = 0, wp = 0;  // each image's grid: rows and row length
  int64_t images = 0;      // images per chunk
  int64_t positions = 0;   // images hp wp: a chunk's grid positions (the products run over `stride`)
  int64_t lead = 0;        // the last tap's offset, (kh - 1) wp + kw - 1: grad_y's leading zeros
  int64_t stride = 0;      // elements per channel of a whole chunk's grids: the products' contraction
};
WgradGrid wgrad_grid(const ConvGeometry& g);
int64_t wgrad_stride(const WgradGrid& grid, int64_t images);  // a chunk of `images` images' row length
// Channel ch of images n0 .. n0 + count of src ([N, channels, h, w], es-byte elements) onto a
// zeroed grid row of len positions, each image's plane at row top, column left of its grid.
void lay_on_grid(const void* src, int64_t channels, int64_t ch, int64_t n0, int64_t count, int64_t h, int64_t w,
                 const WgradGrid& grid, int64_t top, int64_t left, int64_t len, size_t es, void* row);
void backward_weights_as_gemm(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, Tensor& weight_grad);
// The bf16 weight gradient of the same convolutions on AMX tiles (cpu/conv_wgrad_amx.cpp): the same
// grid, each tap's product by TDPBF16PS over operands packed once for all taps, f32 sums rounded
// once into out.weight (f32 or bf16); and where out.bias is defined, the bias gradient with
// conv_bias_gradient's bits, summed while grad_y is packed. conv2d_backward runs it for wide layers
// on AMX hosts (wgrad_amx, below).
void backward_weights_amx(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out);
// Input channels up to which a convolution counts as a first layer.
constexpr int64_t kFirstLayerChannels = 4;
// A first layer: at most kFirstLayerChannels input channels and kSmallKTaps taps, stride 1, no
// dilation, one group, bf16 or f16 on a CPU with AVX-512BW (with or without a bf16 unit: its math
// is f32's), f32, bf16 or f16 on one with AVX2 but no AVX-512. mixprec computes its forward itself
// (cpu/conv_first_layer.cpp): each image zero-padded in f32, four output channels at a time from the
// same tap loads, f32 accumulation, fused ReLU, one rounding; bias optional (x's dtype or f32), dst
// in x's dtype, NCHW. It replaces oneDNN 2.6's im2col GEMM, all it has for a bf16 first layer
// writing NCHW (docs/conv.md, item 1), for f16 (and bf16 without a bf16 unit) its f32 kernel on
// the f32 road (conv_in_f32), and on AVX2 hosts its blocked kernel and the reorder of its nChw8c
// output.
bool first_layer_applies(const ConvGeometry& g, DType t);
// With `pooled`: dst is not written; each image's planes are max-pooled by *pool while they are in
// cache, into pooled's dst (dst's dtype) and u8 argmax, with max_pool2d_forward's bits over the
// output dst would have held.
void forward_first_layer(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                         Tensor& dst, const PoolGeometry* pool = nullptr, MaxPoolResult* pooled = nullptr);
// The profile's note of a max pool fused with the convolution before it (cpu/conv_pool.cpp, and a
// first layer's pooled planes).
inline constexpr const char* kPoolFused = "pool_fused";

// The bias gradient: grad_y [N, OC, OH, OW] (f32 or bf16, dense) summed over N, OH and OW in f32,
// rounded once into bias (cpu/conv_bias.cpp). Each channel's planes in image order; a plane's sum
// in eight partial sums p[l] over elements l, l + 8, ... of its whole blocks of eight, added as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), then its last elements one by one. The order
// does not depend on the thread count or the host.
void conv_bias_gradient(const Tensor& grad_y, const ConvGeometry& g, Tensor& bias);
// One bf16 plane's sum in that order: a channel's gradient is the f32 sum of its planes' sums in
// image order (what backward_weights_amx adds while it packs grad_y).
float conv_bias_plane_sum(const uint16_t* plane_bf16, int64_t plane);
// Whether a bf16 backward-data that can run as the forward convolution of grad_y with the flipped,
// transposed weight does (default on; MIXPREC_CONV_DGRAD=native starts it off): cpu/conv_paths.cpp.
void set_conv_dgrad_as_forward(bool on);
// Whether the weight gradient runs as a forward convolution (wgrad_as_forward): where the host kind
// and the layer say (the default; MIXPREC_CONV_WGRAD=native starts it off), never, or wherever the
// geometry allows on any host kind (tests): cpu/conv_paths.cpp.
enum class WgradForward { off, where_faster, force };
void set_conv_wgrad_as_forward(WgradForward mode);
// Whether the weight gradient of a wide stride-1 layer runs as one matmul per tap
// (backward_weights_as_gemm) rather than as a forward convolution: by default where the layer has
// at least kWgradGemmMinProducts weight elements per tap and the host has no AMX-BF16
// (MIXPREC_CONV_WGRAD=forward or native starts it off); `force` makes it run wherever the geometry
// allows, at any size, on any host with a bf16 unit (tests; MIXPREC_CONV_WGRAD=gemm starts it so).
enum class WgradGemm { off, where_faster, force };
void set_conv_wgrad_as_gemm(WgradGemm mode);
// Whether 16-bit convolutions on the f32 road (conv_in_f32) fuse their casts with the layout
// changes around oneDNN's f32 primitives (the default): bf16 inputs widened by oneDNN's reorders
// into the primitives' layouts, 16-bit outputs rounded by mixprec straight from the primitive's
// layout (round_nchw16c); rather than a cast pass before each input and after each output (the
// probe's and tests' "before"): cpu/conv.cpp.
void set_conv_fused_casts(bool on);
// Whether md is f32 in oneDNN's nChw16c layout (channels in blocks of 16, the last zero-padded,
// images outermost), as round_nchw16c reads it, on a host with AVX-512BW.
bool is_f32_nchw16c(const dnnl::memory::desc& md);
// src: [n, c, hw] f32 in nChw16c -> dst: [n, c, hw] dense 16-bit (t bf16 or f16), each value
// rounded once to nearest, convert()'s bits (cpu/conv_round.cpp).
void round_nchw16c(const float* src, int64_t n, int64_t c, int64_t hw, DType t, void* dst);
// A max pool reading a convolution's output where the primitive left it (cpu/conv_pool.cpp): md
// blocked over channels (nChw8c, nChw16c) or NHWC, f32 or bf16, and a window of at most 256 taps
// (a u8 argmax). max_pool_from_layout writes dst [n, c, oh, ow] (NCHW, f32 or 16-bit; bf16 for a
// bf16 md) and its u8 argmax as kernels::max_pool2d_forward would over the output in NCHW rounded
// into dst's dtype: the same values and winners, bit for bit.
bool pool_reads_layout(const dnnl::memory::desc& md, const PoolGeometry& g);
void max_pool_from_layout(const dnnl::memory::desc& md, const void* src, const PoolGeometry& g, Tensor& dst,
                          Tensor& argmax);
// The other way (cpu/conv_pool.cpp): the max pool's backward written straight into the layout in
// which a convolution's backward primitives read grad_y. unpool_writes_layout: md as the pool reads
// it (blocked over channels or NHWC), each run's positions contiguous, of the pool's input shape,
// bf16 for a bf16 gradient t, or f32 for t f32, bf16 or f16 (widened exactly). max_unpool_to_layout
// writes dst (md's bytes, padded channels zeroed) with the values of max_pool2d_backward over the
// pool's gradient [n, c, oh, ow] (t) and u8 argmax, laid out as md: the bits of that NCHW gradient
// reordered into md.
// With relu_y (the pool's output after a ReLU), the ReLU's backward first, as max_unpool_plane's.
bool unpool_writes_layout(const dnnl::memory::desc& md, const PoolGeometry& g, DType t);
void max_unpool_to_layout(const Tensor& grad_pooled, const ArgmaxTaps& argmax, const PoolGeometry& g,
                          const dnnl::memory::desc& md, void* dst, const Tensor* relu_y = nullptr);
constexpr int64_t kWgradGemmMinProducts = int64_t(1) << 17;
// Whether the bf16 weight gradient of a wide stride-1 layer runs on mixprec's AMX kernel
// (backward_weights_amx): by default on AMX hosts where the layer is wide enough to gain
// (MIXPREC_CONV_WGRAD=native, forward or gemm starts it off); `force` wherever the geometry allows on
// an AMX host, at any size (tests; MIXPREC_CONV_WGRAD=amx starts it so).
enum class WgradAmx { off, where_faster, force };
void set_conv_wgrad_amx(WgradAmx mode);

// Paths (cpu/conv_paths.cpp, each rule with its measurements): which kernel runs a pass where it
// is not oneDNN's own primitive for it. conv2d_backward asks them in this order for the weight
// gradient, and dgrad_as_forward for the input gradient.
bool small_k_wgrad(const ConvGeometry& g, DType t);     // backward_weights_small_k
bool wgrad_amx(const ConvGeometry& g, DType t);         // backward_weights_amx
bool wgrad_as_gemm(const ConvGeometry& g, DType t);     // backward_weights_as_gemm
bool wgrad_as_forward(const ConvGeometry& g, DType t);  // ConvPass::weights_as_forward
bool split_wgrad(const ConvGeometry& g);                // backward-weights split over the batch
// A 16-bit convolution oneDNN has no kernel for on this host (f16; bf16 without a bf16 unit), or
// whose bf16 products run faster widened to f32 (Bf16Math::by_size): computed in f32, 16-bit storage.
bool conv_in_f32(const ConvGeometry& g, DType t);
// bf16 backward-data as the forward convolution (dgrad_geometry) of grad_y with the weight
// transposed (O <-> I) and flipped in both spatial axes (flipped_transposed, 16-bit weights).
bool dgrad_as_forward(const ConvGeometry& g, DType t);
ConvGeometry dgrad_geometry(const ConvGeometry& g);
Tensor flipped_transposed(const Tensor& w, const ConvGeometry& g);

// The convolution primitive cache (one entry per shape, dtype, bias/ReLU flags and pass).
CacheStats conv_cache_stats();
void conv_cache_clear();

// Weights reordered into a primitive's layout, keyed by (storage, offset, version, layout): a
// weight is reordered once per layout until it changes (optimizer steps bump its version).
struct WeightCacheStats {
  int64_t hits = 0;
  int64_t reorders = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
};
WeightCacheStats conv_weight_cache_stats();
void conv_weight_cache_clear();

}  // namespace mixprec::kernels::cpu
