// Fast CPU convolution (kernels::cpu::conv2d_*, see dnnl_conv.h): oneDNN for NCHW tensors, f32 and
// bf16 (AMX where present), f16 through f32, on the primitives of cpu/conv_entries.h, which
// reorders the user's NCHW/OIHW buffers into oneDNN's preferred layouts and back, weights once per
// version. 16-bit layers on the f32 road fuse their casts with those layout changes (fused_casts). Stride-1 layers take
// their weight gradient (bf16, f32) and bf16 input gradient as forward convolutions, which oneDNN 2.6 runs faster than
// its backward kernels (docs/conv.md, item 3); the rules for which path a pass takes are in cpu/conv_paths.cpp.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "kernels/activation.h"
#include "kernels/cpu/conv_entries.h"
#include "kernels/cpu/dnnl_conv.h"
#include "kernels/reduce.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

using conv_detail::CallState;
using conv_detail::ConvEntry;
using conv_detail::entry;
using conv_detail::execute;
using conv_detail::Input;
using conv_detail::Operand;
using dnnl::memory;

bool shapes_ok(const ConvGeometry& g) {
  return g.n > 0 && g.c > 0 && g.oc > 0 && g.oh > 0 && g.ow > 0 && g.h > 0 && g.w > 0;
}
bool dense(const Tensor& t) { return !t.defined() || t.is_contiguous(); }
Tensor as_f32(const Tensor& t) { return t.defined() && t.dtype() != DType::f32 ? kernels::cast(t, DType::f32) : t; }

// Bytes per image of `full` ([N, ...], images outermost and not blocked) when `part` lays out a
// share of its images the same way, so that the share is a slice of full's buffer; else 0.
int64_t image_bytes_if_slices(const memory::desc& full, const memory::desc& part) {
  const dnnl_memory_desc_t& f = full.data;
  const dnnl_memory_desc_t& p = part.data;
  if (f.format_kind != dnnl_blocked || p.format_kind != dnnl_blocked || f.ndims != p.ndims ||
      f.data_type != p.data_type || f.offset0 != 0 || p.offset0 != 0 || f.extra.flags != 0 || p.extra.flags != 0)
    return 0;
  const auto& fb = f.format_desc.blocking;
  const auto& pb = p.format_desc.blocking;
  if (fb.inner_nblks != pb.inner_nblks) return 0;
  for (int i = 0; i < fb.inner_nblks; ++i)
    if (fb.inner_blks[i] != pb.inner_blks[i] || fb.inner_idxs[i] != pb.inner_idxs[i] || fb.inner_idxs[i] == 0) return 0;
  int64_t elems = 1;  // one image's, padded
  for (int i = 0; i < f.ndims; ++i) {
    if (fb.strides[i] != pb.strides[i] || (i > 0 && f.padded_dims[i] != p.padded_dims[i])) return 0;
    if (i > 0) elems *= f.padded_dims[i];
  }
  if (fb.strides[0] != elems || f.padded_dims[0] != f.dims[0] || p.padded_dims[0] != p.dims[0]) return 0;
  const size_t bytes = full.get_size();
  if (bytes % size_t(f.dims[0] * elems) != 0) return 0;
  const int64_t image = int64_t(bytes / size_t(f.dims[0]));
  return part.get_size() == size_t(image * p.dims[0]) ? image : 0;
}

// Backward-weights split over the batch: each OpenMP thread runs a single-threaded primitive on
// its share of the images (reordering its share in and its f32 partial gradient out), and the
// partials are summed. oneDNN 2.6's own multi-threaded backward-weights reduces across threads
// behind spinning barriers, which stall for whole scheduler slices when the cores are shared:
// measured 1.5 ms or 750 ms for one 64x64x3x3 layer depending on the neighbours (docs/conv.md).
// SplitPlan: the shares and their primitives (of dtype t: x's, or f32 with bf16 operands widened by
// the reorders; es null where oneDNN has none), and whether each part can read its share of grad_y
// as a slice of gy_md, grad_y's layout for the whole batch where backward-data reordered it first.
struct SplitPlan {
  int64_t share = 0, parts = 0, last = 0;
  ConvEntry hold_s, hold_l;
  const ConvEntry* es = nullptr;
  const ConvEntry* el = nullptr;
  int64_t gy_image_bytes = 0;  // one image's bytes of gy_md where every share is a slice of it, else 0

  SplitPlan(const ConvGeometry& g, DType t, bool with_bias, DType x_t, const memory::desc* gy_md) {
    const int64_t threads = omp_get_max_threads();
    share = (g.n + threads - 1) / threads, parts = (g.n + share - 1) / share;
    last = g.n - (parts - 1) * share;
    ConvGeometry gs = g, gl = g;
    gs.n = share, gl.n = last;
    es = entry(gs, t, with_bias, DType::f32, ConvPass::backward_weights, hold_s, true, false, x_t);
    el = last == share ? es : entry(gl, t, with_bias, DType::f32, ConvPass::backward_weights, hold_l, true, false, x_t);
    if (!es || !el || !gy_md) return;
    const int64_t image = image_bytes_if_slices(*gy_md, es->inputs[1].prim);
    const int64_t last_image = el != es ? image_bytes_if_slices(*gy_md, el->inputs[1].prim) : image;
    gy_image_bytes = image == last_image ? image : 0;
  }
  SplitPlan(const SplitPlan&) = delete;
  SplitPlan& operator=(const SplitPlan&) = delete;
};

// The split on plan sp (its entries there): gy_user, the caller's grad_y (x's dtype), or null where
// gy_prim, grad_y in the layout sp was planned on, is sliced instead (sp.gy_image_bytes > 0).
bool backward_weights_split(const SplitPlan& sp, const void* gy_user, const Tensor& x, const ConvGeometry& g,
                            ConvGrads& out, const memory* gy_prim) {
  if (!sp.es || !sp.el) return false;
  const ConvEntry* es = sp.es;
  const ConvEntry* el = sp.el;
  const int64_t share = sp.share, parts = sp.parts;
  const bool with_bias = out.bias.defined();
  const bool gy_sliced = gy_prim != nullptr && sp.gy_image_bytes > 0;
  const int64_t gy_image_bytes = sp.gy_image_bytes;
  MIXPREC_ASSERT(gy_sliced || gy_user != nullptr, "conv split: grad_y neither given nor sliced");
  const int64_t w_count = out.weight.numel();
  const int64_t x_share = share * g.c * g.h * g.w, y_share = share * g.oc * g.oh * g.ow;
  const size_t es_bytes = dtype_size(x.dtype());  // the caller's x and grad_y
  // Every buffer of every part is allocated here, before the parallel region: an OutOfMemory cannot
  // leave an OpenMP region (it would terminate the process), and this way it leaves the call cleanly.
  // The f32 partial gradients are workspace bytes like the rest (one weight's size per part).
  struct Part {
    CallState cs;
    std::unordered_map<int, memory> args;
    std::vector<std::unique_ptr<Scratchpad>> in_pads, out_pads;  // per input/output reorder
    std::unique_ptr<Scratchpad> pad;                             // the primitive's
    std::vector<memory> in_user, staged;
    WorkspaceBuffer dw, db;
  };
  std::vector<Part> parts_of(static_cast<size_t>(parts));
  for (int64_t p = 0; p < parts; ++p) {
    Part& pt = parts_of[size_t(p)];
    const ConvEntry& e = p == parts - 1 ? *el : *es;
    const void* src[2] = {static_cast<const char*>(x.data_ptr()) + p * x_share * int64_t(es_bytes),
                          gy_sliced ? nullptr : static_cast<const char*>(gy_user) + p * y_share * int64_t(es_bytes)};
    for (size_t i = 0; i < 2; ++i) {
      const Operand& op = e.inputs[i];
      const bool sliced = i == 1 && gy_sliced;
      pt.in_user.emplace_back(op.user, dnnl_engine(), const_cast<void*>(src[i]));
      if (sliced)
        pt.args[op.arg] =
            memory(op.prim, dnnl_engine(), static_cast<char*>(gy_prim->get_data_handle()) + p * share * gy_image_bytes);
      else
        pt.args[op.arg] = op.reorder ? pt.cs.buffer(op.prim) : pt.in_user.back();
      pt.in_pads.push_back(op.reorder && !sliced ? std::make_unique<Scratchpad>(op.reorder_pd) : nullptr);
    }
    pt.dw = WorkspaceBuffer(size_t(w_count) * sizeof(float));
    if (with_bias) pt.db = WorkspaceBuffer(size_t(g.oc) * sizeof(float));
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      const Operand& op = e.outputs[i];
      pt.staged.push_back(op.reorder ? pt.cs.buffer(op.prim)
                                     : memory(op.user, dnnl_engine(), i == 0 ? pt.dw.data() : pt.db.data()));
      pt.args[op.arg] = pt.staged.back();
      pt.out_pads.push_back(op.reorder ? std::make_unique<Scratchpad>(op.reorder_pd) : nullptr);
    }
    pt.pad = std::make_unique<Scratchpad>(e.pd);
    pt.pad->add_to(pt.args);
  }
  profile::detail::note_impl(es->impl);  // on this thread: the profiler's state is per thread
  profile::detail::note_impl(el->impl);
#pragma omp parallel for num_threads(int(parts)) schedule(static, 1)
  for (int64_t p = 0; p < parts; ++p) {
    Part& pt = parts_of[size_t(p)];
    const ConvEntry& e = p == parts - 1 ? *el : *es;
    static thread_local dnnl::stream strm(dnnl_engine());  // one stream per thread
    for (size_t i = 0; i < 2; ++i) {
      const Operand& op = e.inputs[i];
      if (!op.reorder || (i == 1 && gy_sliced)) continue;
      std::unordered_map<int, memory> rargs{{DNNL_ARG_FROM, pt.in_user[i]}, {DNNL_ARG_TO, pt.args[op.arg]}};
      pt.in_pads[i]->add_to(rargs);
      op.reorder.execute(strm, rargs);
    }
    e.prim.execute(strm, pt.args);
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      const Operand& op = e.outputs[i];
      if (!op.reorder) continue;
      void* dst = i == 0 ? pt.dw.data() : pt.db.data();
      std::unordered_map<int, memory> rargs{{DNNL_ARG_FROM, pt.staged[i]},
                                            {DNNL_ARG_TO, memory(op.user, dnnl_engine(), dst)}};
      pt.out_pads[i]->add_to(rargs);
      op.reorder.execute(strm, rargs);
    }
  }
  // Sum the partials in part order (deterministic), round once into the gradients' dtype.
  float* dw0 = static_cast<float*>(parts_of[0].dw.data());
  float* db0 = static_cast<float*>(parts_of[0].db.data());
  for (int64_t p = 1; p < parts; ++p) {
    const float* add = static_cast<const float*>(parts_of[size_t(p)].dw.data());
#pragma omp parallel for schedule(static) if (w_count > (1 << 16))
    for (int64_t i = 0; i < w_count; ++i) dw0[i] += add[i];
    if (with_bias) {
      const float* add_b = static_cast<const float*>(parts_of[size_t(p)].db.data());
      for (int64_t i = 0; i < g.oc; ++i) db0[i] += add_b[i];
    }
  }
  convert(dw0, DType::f32, out.weight.data_ptr(), out.weight.dtype(), size_t(w_count));
  if (with_bias) convert(db0, DType::f32, out.bias.data_ptr(), out.bias.dtype(), size_t(g.oc));
  return true;
}

std::atomic<bool>& fused_casts_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// The f32 road's casts (conv_in_f32: a 16-bit layer computed by oneDNN's f32 primitives) fused
// with the layout changes around those primitives, on AVX-512 hosts: bf16 inputs widened by the
// reorders into the primitives' layouts, which read them anyway, and 16-bit outputs rounded by
// mixprec from the primitive's layout (conv_entries.h, Output), keeping f32 subnormals where
// oneDNN's AVX512-BF16 conversion flushes them. f16 inputs are still cast first: oneDNN 2.6 has no
// jit reorder from f16 (its reference one took 130 ms for a 256x64x14x14 tensor, against about 1);
// an entry whose bf16 reorder would be the reference kernel is refused, and the casts run. Without
// it, a cast pass before each input, and each output reordered into f32 NCHW and cast after.
constexpr const char* kFusedCasts = "casts_in_reorders";  // the profile's name for it
bool fused_casts() { return fused_casts_flag().load() && simd_lanes() == Lanes::avx512; }

// A convolution on oneDNN's primitives of dtype t; the caller's x and weight in t, or bf16 for t f32
// (widened by the reorders); dst in t, or 16-bit for t f32 (rounded by mixprec). With `pooled`, the
// output is max-pooled by *pool from the primitive's layout into pooled's dst (dst's dtype) and
// argmax instead of written: false, nothing run, where the pool cannot read that layout.
bool forward_on(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                Tensor& dst, DType t, const PoolGeometry* pool = nullptr, MaxPoolResult* pooled = nullptr) {
  ConvEntry holder;
  const ConvEntry* e = entry(g, t, bias.defined(), bias.defined() ? bias.dtype() : DType::f32, ConvPass::forward,
                             holder, false, false, x.dtype());
  if (!e) return false;
  if (pooled && !pool_reads_layout(e->outputs[0].prim, *pool)) return false;
  // A pooled 16-bit output is rounded by the pool, whatever the road's casts.
  if (x.dtype() != t || (dst.dtype() != t && !pooled)) profile::detail::note_impl(kFusedCasts);
  CallState cs;
  std::vector<Input> in{{x.data_ptr()}, {weight.data_ptr(), &weight}};
  if (bias.defined()) in.push_back({bias.data_ptr()});
  conv_detail::Output out{dst.data_ptr(), dst.dtype()};
  if (pooled) {
    profile::detail::note_impl(kPoolFused);
    out.consume = [&](const memory& y) {
      max_pool_from_layout(y.get_desc(), y.get_data_handle(), *pool, pooled->dst, pooled->argmax);
    };
  }
  execute(*e, in, {out}, cs);
  // The ReLU after the primitive, not as its post-op (oneDNN's jit post-op makes a NaN +0 on
  // AVX-512 hosts: docs/conv.md, "The fused ReLU"); on the pooled output where there is one, a
  // quarter of the elements for a 2x2 pool: a ReLU commutes with a window's max.
  if (relu) {
    const Tensor& y = pooled ? pooled->dst : dst;
    relu_inplace(y.data_ptr(), y.dtype(), y.numel());
  }
  return true;
}

// The gradients on primitives of dtype t (the caller's grad_y, x and weight in t, or bf16 for t f32,
// where only oneDNN's own primitives run: conv2d_backward checks), into out's tensors (out.x may be
// 16-bit for t f32). With `up`, grad_y is undefined: the pool's backward writes it straight into
// backward-data's layout (max_unpool_to_layout), where every reader of grad_y must take it, or
// nothing runs (false).
bool backward_on(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g, ConvGrads& out,
                 DType t, const UnpooledGrad* up = nullptr) {
  const bool need_x = out.x.defined(), need_w = out.weight.defined(), need_b = out.bias.defined();
  // The caller's operands' dtype (grad_y's, or with `up` the weight's: the routing widens a 16-bit
  // pool gradient for f32 primitives whose x and weight are f32 already).
  const DType in_t = !up ? grad_y.dtype() : need_x ? weight.dtype() : up->pooled->dtype();
  // grad_y's key among the call's reordered inputs (CallState::find): with `up`, the pool's gradient,
  // whose pointer stands for the full-size gradient never written in NCHW.
  const void* gy = up ? up->pooled->data_ptr() : grad_y.data_ptr();
  if (need_b && out.bias.dtype() != DType::f32 && out.bias.dtype() != t) return false;
  // The weight gradient: mixprec's kernel for a short bf16 contraction, one matmul per tap (gemm),
  // a forward convolution (wf), oneDNN's backward-weights split over the batch, or one oneDNN
  // primitive (bw).
  const bool small_k = need_w && x.dtype() == t && small_k_wgrad(g, t);
  const bool amx = need_w && !small_k && x.dtype() == t && in_t == t && wgrad_amx(g, t);
  const bool gemm = need_w && !small_k && !amx && x.dtype() == t && wgrad_as_gemm(g, t);
  ConvEntry hold_d, hold_w, hold_wf;
  const ConvEntry* wf = need_w && !small_k && !amx && !gemm && x.dtype() == t && wgrad_as_forward(g, t)
                            ? entry(g, t, false, DType::f32, ConvPass::weights_as_forward, hold_wf)
                            : nullptr;
  const bool split = need_w && !small_k && !amx && !gemm && !wf && split_wgrad(g);
  const bool one_primitive = need_w && !small_k && !amx && !gemm && !wf && !split;
  // The bias gradient rides on backward-weights or on mixprec's AMX kernel (which sums it while it
  // packs grad_y); otherwise (frozen weight, or the weight gradient as matmuls or a forward
  // convolution) it is a plain reduction.
  const bool fused_bias = need_b && need_w && !wf && !gemm;
  // The input gradient: a forward convolution of the flipped weight, else oneDNN's backward-data.
  const ConvEntry* bd = need_x && in_t == t && dgrad_as_forward(g, t)
                            ? entry(dgrad_geometry(g), t, false, DType::f32, ConvPass::forward, hold_d)
                            : nullptr;
  const bool as_forward = bd != nullptr;
  if (need_x && !bd) bd = entry(g, t, false, DType::f32, ConvPass::backward_data, hold_d, false, false, in_t);
  const bool wgrad_f32 = need_w && out.weight.dtype() == DType::f32 && t == DType::bf16;
  if (need_w && out.weight.dtype() != t && !wgrad_f32) return false;
  const ConvEntry* bw = one_primitive ? entry(g, t, fused_bias, need_b ? out.bias.dtype() : DType::f32,
                                              ConvPass::backward_weights, hold_w, false, wgrad_f32, in_t)
                                      : nullptr;
  if ((need_x && !bd) || (one_primitive && !bw)) return false;
  const memory::desc* gy_md = need_x ? &bd->inputs[0].prim : nullptr;  // grad_y as backward-data reads it
  if (up) {
    const bool wgrad_reads_it = !need_w || split || (one_primitive && bw->inputs[1].prim == *gy_md);
    if (!need_x || !wgrad_reads_it || (need_b && !fused_bias) ||
        !unpool_writes_layout(*gy_md, *up->pool, up->pooled->dtype()))
      return false;
  }
  // The input gradient (backward-data, or a forward convolution of the flipped weight) runs first
  // where the split follows: the parts then read their shares of grad_y from the copy it reordered,
  // where the layouts agree, instead of reordering them again (a forward convolution's source and
  // backward-weights' grad_y are both NHWC on AMX: the wide cnn's 64 x 1000 x 14 x 14 grad_y, 4 ms a
  // step on one thread per share). That copy is held through the split in place of the parts' own;
  // the flipped weight's reordered copy is not.
  const bool data_first = split && need_x;
  std::optional<SplitPlan> plan;
  if (split) {
    plan.emplace(g, t, fused_bias, x.dtype(), data_first ? gy_md : nullptr);
    if (!plan->es || !plan->el || (up && plan->gy_image_bytes == 0)) return false;
  }
  if (in_t != t || (need_x && out.x.dtype() != t)) profile::detail::note_impl(kFusedCasts);
  CallState cs;
  if (up) {
    const memory unpooled = cs.buffer(*gy_md);
    max_unpool_to_layout(*up->pooled, up->argmax, *up->pool, *gy_md, unpooled.get_data_handle(), up->relu_y);
    cs.reordered.push_back({gy, *gy_md, unpooled, cs.bufs.size() - 1});
    profile::detail::note_impl(kPoolFused);
  }
  const conv_detail::Output dx{need_x ? out.x.data_ptr() : nullptr, need_x ? out.x.dtype() : t};
  auto input_gradient = [&] {
    if (as_forward) {
      const Tensor flipped = flipped_transposed(weight, g);
      profile::detail::note_impl("dgrad_as_fwd");
      execute(*bd, {{gy}, {flipped.data_ptr()}}, {dx}, cs);
    } else {
      execute(*bd, {{gy}, {weight.data_ptr(), &weight}}, {dx}, cs);
    }
  };
  if (data_first) {
    input_gradient();
    cs.keep_only(gy);
  }
  if (small_k || amx || split) {
    ConvGrads wgrads;  // weight (and bias) only: backward-data runs apart
    wgrads.weight = out.weight;
    if (fused_bias) wgrads.bias = out.bias;
    if (small_k) {
      backward_weights_small_k(grad_y, x, g, wgrads);
    } else if (amx) {
      profile::detail::note_impl("mixprec:wgrad_amx");
      backward_weights_amx(grad_y, x, g, wgrads);
    } else if (!backward_weights_split(*plan, up ? nullptr : gy, x, g, wgrads, data_first ? cs.find(gy) : nullptr)) {
      return false;
    }
  }
  if (gemm) {
    profile::detail::note_impl("wgrad_as_gemm");
    backward_weights_as_gemm(grad_y, x, g, out.weight);
  }
  if (wf) {
    // The primitive writes f32; a bf16 gradient is rounded once from it. Its own call state: its
    // reordered x and grad_y are freed before the input gradient reorders grad_y its own way (held
    // together, they cost the 420->1000 cnn a fifth of its largest batch in 1 GiB).
    CallState wcs;
    const bool direct = out.weight.dtype() == DType::f32;
    WorkspaceBuffer staging(direct ? 0 : size_t(out.weight.numel()) * sizeof(float));
    void* dw = direct ? out.weight.data_ptr() : staging.data();
    profile::detail::note_impl("wgrad_as_fwd");
    execute(*wf, {{x.data_ptr()}, {grad_y.data_ptr()}}, {{dw}}, wcs);
    if (!direct) convert(dw, DType::f32, out.weight.data_ptr(), out.weight.dtype(), size_t(out.weight.numel()));
  }
  if (need_x && !data_first) input_gradient();
  if (one_primitive) {
    std::vector<conv_detail::Output> outs{{out.weight.data_ptr(), out.weight.dtype()}};
    if (fused_bias) outs.push_back({out.bias.data_ptr(), out.bias.dtype()});
    execute(*bw, {{x.data_ptr()}, {gy}}, outs, cs);
  }
  if (need_b && !fused_bias) conv_bias_gradient(grad_y, g, out.bias);
  return true;
}

}  // namespace

void set_conv_fused_casts(bool on) { fused_casts_flag().store(on); }

bool conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                    Tensor& dst) {
  if (!shapes_ok(g) || !dense(x) || !dense(weight) || !dense(bias)) return false;
  // A 16-bit first layer: mixprec's own kernel (f32 math, rounded once), on every road.
  if (weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == DType::f32 || bias.dtype() == x.dtype()) &&
      first_layer_applies(g, x.dtype())) {
    forward_first_layer(x, weight, bias, g, relu, dst);
    return true;
  }
  // oneDNN has no f16 on CPU, and without AVX512-BF16 or AMX-BF16 its bf16 convolutions are not
  // there either (ours then ran the reference loops: 4.4 s for a batch-32 cnn-bn amp-bf16 step on
  // an AVX-512 Xeon without BF16, 2026-11-27): f32 math, 16-bit storage, one rounding as before.
  // Wide bf16 layers on Intel's AVX512-BF16 without AMX take the same road (conv_in_f32).
  if (conv_in_f32(g, x.dtype())) {
    if (fused_casts()) {
      const bool widened = x.dtype() == DType::bf16 && weight.dtype() == DType::bf16 &&
                           (!bias.defined() || bias.dtype() == DType::f32 || bias.dtype() == DType::bf16);
      return (widened && forward_on(x, weight, bias, g, relu, dst, DType::f32)) ||
             forward_on(as_f32(x), as_f32(weight), as_f32(bias), g, relu, dst, DType::f32);
    }
    Tensor dst32 = Tensor::empty(dst.shape(), DType::f32);
    if (!forward_on(as_f32(x), as_f32(weight), as_f32(bias), g, relu, dst32, DType::f32)) return false;
    kernels::copy(dst32, dst);
    return true;
  }
  if (x.dtype() != DType::f32 && !(x.dtype() == DType::bf16 && bf16_unit())) return false;
  if (bias.defined() && bias.dtype() != DType::f32 && bias.dtype() != x.dtype()) return false;
  return forward_on(x, weight, bias, g, relu, dst, x.dtype());
}

bool conv2d_forward_max_pool_applies(const ConvGeometry& g) { return shapes_ok(g) && !g.channels_last; }

bool conv2d_forward_max_pool(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g,
                             bool relu, const PoolGeometry& pool, MaxPoolResult& out) {
  if (!shapes_ok(g) || !dense(x) || !dense(weight) || !dense(bias) || g.channels_last) return false;
  if (weight.dtype() != x.dtype() || (bias.defined() && bias.dtype() != DType::f32 && bias.dtype() != x.dtype()))
    return false;
  Tensor& dst = out.dst;
  // A first layer (mixprec's kernel) pools each image's planes while they are in cache.
  if (first_layer_applies(g, x.dtype())) {
    if (pool.argmax_dtype() != DType::u8) return false;
    forward_first_layer(x, weight, bias, g, relu, dst, &pool, &out);
    return true;
  }
  if (conv_in_f32(g, x.dtype())) {
    // The f32 road, as conv2d_forward takes it; the pool rounds each value into x's dtype first.
    const bool widened = fused_casts() && x.dtype() == DType::bf16 && weight.dtype() == DType::bf16;
    return (widened && forward_on(x, weight, bias, g, relu, dst, DType::f32, &pool, &out)) ||
           forward_on(as_f32(x), as_f32(weight), as_f32(bias), g, relu, dst, DType::f32, &pool, &out);
  }
  if (x.dtype() != DType::f32 && !(x.dtype() == DType::bf16 && bf16_unit())) return false;
  return forward_on(x, weight, bias, g, relu, dst, x.dtype(), &pool, &out);
}

namespace {

// conv2d_backward, from grad_y or (with `up`, grad_y undefined) from the gradient of a max pool
// that read y: see conv2d_backward_max_unpool.
bool backward(const Tensor& grad_y, const UnpooledGrad* up, const Tensor& x, const Tensor& weight,
              const ConvGeometry& g, ConvGrads& out) {
  if (!shapes_ok(g) || !dense(grad_y) || !dense(x) || !dense(weight)) return false;
  const bool need_x = out.x.defined(), need_w = out.weight.defined(), need_b = out.bias.defined();
  const DType t = up ? up->pooled->dtype() : grad_y.dtype();
  // A first layer's weight and bias gradients: mixprec's kernel, on either road, on the 16-bit
  // tensors (the cnns' first layers need nothing else, so grad_y is never cast), the gradients in t
  // or f32.
  const auto t_or_f32 = [&](const Tensor& v) { return v.dtype() == t || v.dtype() == DType::f32; };
  const bool small_k =
      need_w && x.dtype() == t && small_k_wgrad(g, t) && t_or_f32(out.weight) && (!need_b || t_or_f32(out.bias));
  if (up && !need_x) {
    // It routes each image's planes of grad_y as it reads them.
    if (!small_k) return false;
    profile::detail::note_impl(kPoolFused);
    backward_weights_small_k(Tensor(), x, g, out, up);
    return true;
  }
  if (conv_in_f32(g, t)) {
    if (small_k) {
      if (up) return false;  // with an input gradient: not from the pool (nothing run yet)
      backward_weights_small_k(grad_y, x, g, out);
    }
    const bool wide_w = need_w && !small_k, wide_b = need_b && !small_k;
    if (!need_x && !wide_w && !wide_b) return true;
    // The input gradient rounded straight into out.x where the casts are fused, else into f32 first.
    const bool fused = fused_casts();
    ConvGrads o32;
    if (need_x) o32.x = fused ? out.x : Tensor::empty(out.x.shape(), DType::f32);
    if (wide_w) o32.weight = Tensor::empty(out.weight.shape(), DType::f32);
    if (wide_b) o32.bias = Tensor::empty(out.bias.shape(), DType::f32);
    // bf16 operands widened by the reorders where f32 would run oneDNN's primitives alone (the
    // weight gradient's other paths read f32 x and grad_y from memory). x is there for a weight
    // gradient, the weight for an input gradient.
    const bool primitives_only =
        !wide_w || (!small_k_wgrad(g, DType::f32) && !wgrad_as_gemm(g, DType::f32) && !wgrad_as_forward(g, DType::f32));
    const bool widened =
        fused && t == DType::bf16 && (!wide_w || x.dtype() == t) && (!need_x || weight.dtype() == t) && primitives_only;
    // Else the operands cast to f32 first. With `up`, grad_y (undefined) is the pool's gradient,
    // widened as it is routed into the primitives' layout: only where oneDNN's primitives alone read
    // it, and not after the widened try declined (it ran nothing, and the cast would not change why).
    const auto cast_first = [&] {
      return backward_on(as_f32(grad_y), wide_w ? as_f32(x) : x, need_x ? as_f32(weight) : weight, g, o32, DType::f32,
                         up);
    };
    const bool done = (widened && backward_on(grad_y, x, weight, g, o32, DType::f32, up)) ||
                      ((!up || (!widened && primitives_only)) && cast_first());
    if (!done) return false;
    if (need_x && !fused) kernels::copy(o32.x, out.x);
    if (wide_w) kernels::copy(o32.weight, out.weight);
    if (wide_b) kernels::copy(o32.bias, out.bias);
    return true;
  }
  if (t != DType::f32 && !(t == DType::bf16 && bf16_unit())) return false;
  return backward_on(grad_y, x, weight, g, out, t, up);
}

}  // namespace

bool conv2d_backward_max_unpool(const Tensor& grad_pooled, const Tensor& argmax, bool argmax_2bit,
                                const PoolGeometry& pool, const Tensor& relu_y, const Tensor& x, const Tensor& weight,
                                const ConvGeometry& g, ConvGrads& out) {
  const int64_t taps = grad_pooled.numel();
  if (g.channels_last || !dense(grad_pooled) || !argmax.is_contiguous() || argmax.dtype() != DType::u8 ||
      argmax.numel() != (argmax_2bit ? (taps + 3) / 4 : taps) || pool.argmax_dtype() != DType::u8 || !dense(relu_y) ||
      (relu_y.defined() && relu_y.dtype() != grad_pooled.dtype()))
    return false;
  const UnpooledGrad up{
      &grad_pooled, {argmax.data<uint8_t>(), argmax_2bit}, &pool, relu_y.defined() ? &relu_y : nullptr};
  return backward(Tensor(), &up, x, weight, g, out);
}

bool conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                     ConvGrads& out) {
  return backward(grad_y, nullptr, x, weight, g, out);
}

}  // namespace mixprec::kernels::cpu
