// Fast CPU convolution (kernels::cpu::conv2d_*, see dnnl_conv.h): oneDNN for NCHW tensors, f32 and
// bf16 (AMX where present), f16 through f32. Primitives take oneDNN's preferred layouts; the user's
// NCHW/OIHW buffers are reordered in and out around them, weights once per version via the weight cache.
// bf16 layers on the f32 road have their inputs widened by those reorders (widening_reorders).
// Stride-1 layers take their weight gradient (bf16, f32) and bf16 input gradient as forward
// convolutions, which oneDNN 2.6 runs faster than its backward kernels (docs/conv.md, item 3); the
// rules for which path a pass takes are in cpu/conv_paths.cpp.
#include "kernels/cpu/dnnl_conv.h"
#include "kernels/reduce.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "core/profile_detail.h"
#include "core/simd.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

struct ConvKey {
  std::array<int64_t, 17> geometry;
  DType t, bias_t;
  bool has_bias, relu;
  bool wgrad_f32;  // backward-weights writes an f32 weight gradient from bf16 operands
  ConvPass pass;
  bool split;  // backward-weights over one thread's share of the batch (see backward_weights_split)
  DType in_t;  // the caller's inputs (x, weight, grad_y): t, or bf16 widened by the reorders (f32 t)
  bool operator==(const ConvKey&) const = default;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t h = 0;
    for (int64_t v : k.geometry) h = hash_mix(h, uint64_t(v));
    h = hash_mix(h, uint64_t(k.t) | uint64_t(k.bias_t) << 8 | uint64_t(k.has_bias) << 16 | uint64_t(k.relu) << 17 |
                        uint64_t(k.pass) << 18 | uint64_t(k.split) << 20 | uint64_t(k.wgrad_f32) << 21 |
                        uint64_t(k.in_t) << 24);
    return h;
  }
};

ConvKey make_key(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, bool relu, ConvPass pass, bool split,
                 bool wgrad_f32, DType in_t) {
  return ConvKey{{g.n, g.c, g.h, g.w, g.oc, g.kh, g.kw, g.oh, g.ow, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dil_h,
                  g.dil_w, g.groups, 0},
                 t,
                 has_bias ? bias_t : DType::f32,
                 has_bias,
                 relu,
                 wgrad_f32,
                 pass,
                 split,
                 in_t};
}

// One operand: the caller's dense layout and the primitive's; a reorder between them (user ->
// primitive for inputs, primitive -> user for outputs) when they differ.
struct Operand {
  int arg = 0;
  memory::desc user, prim;
  dnnl::reorder reorder;
  dnnl::primitive_desc_base reorder_pd;
};

struct ConvEntry {
  dnnl::primitive prim;
  dnnl::primitive_desc_base pd;
  std::vector<Operand> inputs, outputs;
  std::string impl;
};

PrimitiveCache<ConvKey, ConvEntry, ConvKeyHash>& cache() {
  static PrimitiveCache<ConvKey, ConvEntry, ConvKeyHash> c;
  return c;
}

memory::desc act_md(int64_t n, int64_t c, int64_t h, int64_t w, DType t, Tag tag) {
  return memory::desc({n, c, h, w}, to_dnnl(t), tag);
}
// OIHW, or GOIHW with groups (oneDNN's grouped weights carry the group as a leading dim).
memory::desc wei_md(const ConvGeometry& g, DType t, bool any) {
  if (g.groups == 1) return memory::desc({g.oc, g.c, g.kh, g.kw}, to_dnnl(t), any ? Tag::any : Tag::oihw);
  return memory::desc({g.groups, g.oc / g.groups, g.c / g.groups, g.kh, g.kw}, to_dnnl(t), any ? Tag::any : Tag::goihw);
}

Operand operand(int arg, const memory::desc& user, const memory::desc& prim, bool input) {
  Operand op;
  op.arg = arg;
  op.user = user;
  op.prim = prim;
  if (user != prim) {
    const dnnl::primitive_attr attr = user_scratchpad_attr();
    auto rpd = input ? dnnl::reorder::primitive_desc(dnnl_engine(), user, dnnl_engine(), prim, attr)
                     : dnnl::reorder::primitive_desc(dnnl_engine(), prim, dnnl_engine(), user, attr);
    op.reorder = dnnl::reorder(rpd);
    op.reorder_pd = rpd;
  }
  return op;
}

struct Descs {
  memory::dims strides, dilates, pad_l, pad_r;
  memory::desc src, wei, bias, dst;  // `any` layouts for the primitive
  memory::desc user_src, user_wei, user_bias, user_dst;
  memory::desc in_src, in_wei, in_dst;  // the caller's layouts read as inputs, in in_t
};

Descs descs(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, DType in_t) {
  Descs d;
  d.strides = {g.stride_h, g.stride_w};
  d.dilates = {g.dil_h - 1, g.dil_w - 1};  // oneDNN counts the gaps: PyTorch's dilation 1 is 0
  d.pad_l = {g.pad_h, g.pad_w};
  // Right padding that makes oneDNN's output size equal ours (floor mode can leave it below pad_l).
  d.pad_r = {(g.oh - 1) * g.stride_h + (g.kh - 1) * g.dil_h + 1 - g.h - g.pad_h,
             (g.ow - 1) * g.stride_w + (g.kw - 1) * g.dil_w + 1 - g.w - g.pad_w};
  d.src = act_md(g.n, g.c, g.h, g.w, t, Tag::any);
  d.dst = act_md(g.n, g.oc, g.oh, g.ow, t, Tag::any);
  d.wei = wei_md(g, t, true);
  d.user_src = act_md(g.n, g.c, g.h, g.w, t, Tag::nchw);
  d.user_dst = act_md(g.n, g.oc, g.oh, g.ow, t, Tag::nchw);
  d.user_wei = wei_md(g, t, false);
  d.in_src = act_md(g.n, g.c, g.h, g.w, in_t, Tag::nchw);
  d.in_dst = act_md(g.n, g.oc, g.oh, g.ow, in_t, Tag::nchw);
  d.in_wei = wei_md(g, in_t, false);
  // An f32 primitive takes an f32 bias: a 16-bit one is widened by its reorder.
  if (has_bias) {
    d.user_bias = memory::desc({g.oc}, to_dnnl(bias_t), Tag::x);
    d.bias = memory::desc({g.oc}, to_dnnl(t == DType::f32 ? t : bias_t), Tag::x);
  }
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Descs& d, bool has_bias, const dnnl::primitive_attr& attr) {
  using F = dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
  const F::desc desc = has_bias
                           ? F::desc(prop, alg, d.src, d.wei, d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                           : F::desc(prop, alg, d.src, d.wei, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return F::primitive_desc(desc, attr, dnnl_engine());
}

// The forward convolution whose output is the weight gradient of g (stride 1, no dilation, one
// group): the images' channels are its batch, the images its input channels, grad_y's planes its
// kernels ([OC, N, OH, OW]) and the weight's taps its output positions, padded as g.
ConvGeometry wgrad_geometry(const ConvGeometry& g) {
  ConvGeometry f = g;
  f.n = g.c, f.c = g.n;
  f.kh = g.oh, f.kw = g.ow;
  f.oh = g.kh, f.ow = g.kw;
  return f;
}

ConvEntry create_entry(const ConvGeometry& g, const ConvKey& key) {
  const Descs d = descs(g, key.t, key.has_bias, key.bias_t, key.in_t);
  const dnnl::primitive_attr attr = user_scratchpad_attr();
  ConvEntry e;
  const auto alg = dnnl::algorithm::convolution_direct;
  if (key.pass == ConvPass::forward) {
    dnnl::primitive_attr fwd_attr = attr;
    if (key.relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      fwd_attr.set_post_ops(ops);
    }
    auto pd = forward_pd(d, key.has_bias, fwd_attr);
    if (g.c <= kFirstLayerChannels && key.t != DType::f32 && pd.dst_desc() != d.user_dst) {
      // A 16-bit first layer (1-4 input channels) writes NCHW directly: oneDNN's im2col kernel
      // costs what its blocked kernel does at K = 9*C, and the blocked output would need a reorder
      // of the largest activation in the net. Not in f32, where the im2col kernel runs at a tenth
      // of the blocked one's speed, reorder included (docs/conv.md).
      Descs plain = d;
      plain.dst = d.user_dst;
      try {
        auto pd_plain = forward_pd(plain, key.has_bias, fwd_attr);
        if (!std::string_view(pd_plain.impl_info_str()).starts_with("ref")) pd = pd_plain;
      } catch (const dnnl::error&) {
      }
    }
    e.pd = pd;
    e.prim = dnnl::convolution_forward(pd);
    e.inputs.push_back(operand(DNNL_ARG_SRC, d.in_src, pd.src_desc(), true));
    e.inputs.push_back(operand(DNNL_ARG_WEIGHTS, d.in_wei, pd.weights_desc(), true));
    if (key.has_bias) e.inputs.push_back(operand(DNNL_ARG_BIAS, d.user_bias, pd.bias_desc(), true));
    e.outputs.push_back(operand(DNNL_ARG_DST, d.user_dst, pd.dst_desc(), false));
  } else if (key.pass == ConvPass::weights_as_forward) {
    // Operands read and written in place through strides: x as [C, N, H, W], grad_y as
    // [OC, N, OH, OW], the f32 gradient [OC, C, KH, KW] written as [C, OC, KH, KW].
    const ConvGeometry f = wgrad_geometry(g);
    MIXPREC_ASSERT(key.in_t == key.t, "the weight gradient as a forward reads its operands in place");
    Descs df = descs(f, key.t, false, DType::f32, key.t);
    df.dst = act_md(f.n, f.oc, f.oh, f.ow, DType::f32, Tag::any);
    df.user_src = memory::desc({f.n, f.c, f.h, f.w}, to_dnnl(key.t), {g.h * g.w, g.c * g.h * g.w, g.w, 1});
    df.user_wei = memory::desc({f.oc, f.c, f.kh, f.kw}, to_dnnl(key.t), {g.oh * g.ow, g.oc * g.oh * g.ow, g.ow, 1});
    df.user_dst =
        memory::desc({f.n, f.oc, f.oh, f.ow}, memory::data_type::f32, {g.kh * g.kw, g.c * g.kh * g.kw, g.kw, 1});
    auto pd = forward_pd(df, false, attr);
    e.pd = pd;
    e.prim = dnnl::convolution_forward(pd);
    e.inputs.push_back(operand(DNNL_ARG_SRC, df.user_src, pd.src_desc(), true));
    e.inputs.push_back(operand(DNNL_ARG_WEIGHTS, df.user_wei, pd.weights_desc(), true));
    e.outputs.push_back(operand(DNNL_ARG_DST, df.user_dst, pd.dst_desc(), false));
  } else if (key.pass == ConvPass::backward_data) {
    using B = dnnl::convolution_backward_data;
    const auto hint = forward_pd(d, false, attr);
    const B::primitive_desc pd(B::desc(alg, d.src, d.wei, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r), attr,
                               dnnl_engine(), hint);
    e.pd = pd;
    e.prim = B(pd);
    e.inputs.push_back(operand(DNNL_ARG_DIFF_DST, d.in_dst, pd.diff_dst_desc(), true));
    e.inputs.push_back(operand(DNNL_ARG_WEIGHTS, d.in_wei, pd.weights_desc(), true));
    e.outputs.push_back(operand(DNNL_ARG_DIFF_SRC, d.user_src, pd.diff_src_desc(), false));
  } else {
    using W = dnnl::convolution_backward_weights;
    // A split primitive runs on one thread (oneDNN fixes its thread count at creation) and
    // writes f32 partial gradients, summed over the threads' shares afterwards.
    std::optional<SingleThreadScope> one_thread;
    Descs dw = d;
    if (key.split) one_thread.emplace();
    if (key.split || key.wgrad_f32 || key.in_t != key.t) {
      dw.wei = wei_md(g, DType::f32, true);
      dw.user_wei = wei_md(g, DType::f32, false);
    }
    if (key.split && key.has_bias) dw.bias = dw.user_bias = memory::desc({g.oc}, memory::data_type::f32, Tag::x);
    const auto hint = forward_pd(d, key.has_bias, attr);
    const W::desc desc = key.has_bias
                             ? W::desc(alg, dw.src, dw.wei, dw.bias, dw.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                             : W::desc(alg, dw.src, dw.wei, dw.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
    const W::primitive_desc pd(desc, attr, dnnl_engine(), hint);
    e.pd = pd;
    e.prim = W(pd);
    e.inputs.push_back(operand(DNNL_ARG_SRC, d.in_src, pd.src_desc(), true));
    e.inputs.push_back(operand(DNNL_ARG_DIFF_DST, d.in_dst, pd.diff_dst_desc(), true));
    e.outputs.push_back(operand(DNNL_ARG_DIFF_WEIGHTS, dw.user_wei, pd.diff_weights_desc(), false));
    if (key.has_bias) e.outputs.push_back(operand(DNNL_ARG_DIFF_BIAS, dw.user_bias, pd.diff_bias_desc(), false));
  }
  e.impl = e.pd.impl_info_str();
  // Widening in the reorders only where oneDNN has a jit reorder for it (its reference one runs
  // scalar): no entry otherwise, and the caller widens by casts.
  if (key.in_t != key.t)
    for (const Operand& op : e.inputs)
      if (op.reorder && !std::string_view(op.reorder_pd.impl_info_str()).starts_with("jit")) return ConvEntry{};
  return e;
}

// The cached entry, or nullptr when oneDNN cannot run this convolution (the caller falls back to
// the reference). Creation failures are cached too, as an entry without a primitive.
const ConvEntry* entry(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, bool relu, ConvPass pass,
                       ConvEntry& holder, bool split = false, bool wgrad_f32 = false,
                       std::optional<DType> in_t = std::nullopt) {
  const ConvKey key = make_key(g, t, has_bias, bias_t, relu, pass, split, wgrad_f32 && !split, in_t.value_or(t));
  holder = cache().get_or_create(key, [&] {
    try {
      return create_entry(g, key);
    } catch (const dnnl::error&) {
      return ConvEntry{};
    }
  });
  return holder.prim ? &holder : nullptr;
}

// ---- reordered-weight cache ----

struct CachedWeight {
  std::weak_ptr<Storage> storage;
  const void* data = nullptr;
  uint64_t version = 0;
  memory::desc md;
  std::shared_ptr<WorkspaceBuffer> buf;
  memory mem;
};

// 64: every conv layer of a few models in two layouts (forward and backward-data).
constexpr size_t kMaxCachedWeights = 64;

struct WeightCache {
  std::mutex mu;
  std::vector<CachedWeight> entries;  // most recently used last
  int64_t hits = 0, reorders = 0;

  // Drops entries whose tensor is gone or has changed since (a new version of the same bytes).
  void purge(const Tensor* current) {
    std::erase_if(entries, [&](const CachedWeight& c) {
      if (c.storage.expired()) return true;
      return current && c.data == current->data_ptr() && c.version != current->version();
    });
  }

  memory get(const Tensor& w, const Operand& op) {
    std::lock_guard<std::mutex> lock(mu);
    purge(&w);
    for (size_t i = 0; i < entries.size(); ++i) {
      CachedWeight& c = entries[i];
      if (c.data == w.data_ptr() && c.version == w.version() && c.md == op.prim && c.storage.lock() == w.storage()) {
        ++hits;
        std::rotate(entries.begin() + int64_t(i), entries.begin() + int64_t(i) + 1, entries.end());
        return entries.back().mem;
      }
    }
    CachedWeight c;
    c.storage = w.storage();
    c.data = w.data_ptr();
    c.version = w.version();
    c.md = op.prim;
    c.buf = std::make_shared<WorkspaceBuffer>(op.prim.get_size());
    c.mem = memory(op.prim, dnnl_engine(), c.buf->data());
    memory user(op.user, dnnl_engine(), w.data_ptr());
    Scratchpad pad(op.reorder_pd);
    std::unordered_map<int, memory> args{{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, c.mem}};
    pad.add_to(args);
    op.reorder.execute(dnnl_stream(), args);
    ++reorders;
    if (entries.size() >= kMaxCachedWeights) entries.erase(entries.begin());
    entries.push_back(c);
    return c.mem;
  }
};

WeightCache& weight_cache() {
  static WeightCache c;
  return c;
}

// What one convolution call owns: reordered activations and output staging buffers (workspace
// bytes, freed when the call returns), and the reordered inputs a second primitive of the same call
// may reuse (backward-data and backward-weights both read grad_y in the same layout).
struct CallState {
  std::vector<std::unique_ptr<WorkspaceBuffer>> bufs;
  struct Reordered {
    const void* user_ptr;
    memory::desc md;
    memory mem;
  };
  std::vector<Reordered> reordered;

  memory buffer(const memory::desc& md) {
    bufs.push_back(std::make_unique<WorkspaceBuffer>(md.get_size()));
    return memory(md, dnnl_engine(), bufs.back()->data());
  }
  // The input at user_ptr as reordered earlier in this call, or null.
  const memory* find(const void* user_ptr) const {
    for (const auto& r : reordered)
      if (r.user_ptr == user_ptr) return &r.mem;
    return nullptr;
  }
};

void run_reorder(const Operand& op, const memory& from, const memory& to) {
  Scratchpad pad(op.reorder_pd);
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  pad.add_to(args);
  op.reorder.execute(dnnl_stream(), args);
}

// An input in the primitive's layout: the user's buffer itself, a copy reordered earlier in this
// call, or a new reordered copy.
memory bind_input(const Operand& op, const void* user_ptr, CallState& cs) {
  memory user(op.user, dnnl_engine(), const_cast<void*>(user_ptr));
  if (!op.reorder) return user;
  for (const auto& r : cs.reordered)
    if (r.user_ptr == user_ptr && r.md == op.prim) return r.mem;
  memory prim = cs.buffer(op.prim);
  run_reorder(op, user, prim);
  cs.reordered.push_back({user_ptr, op.prim, prim});
  return prim;
}

// One input: the user's bytes, and the tensor itself when it is a weight (cached reorder).
struct Input {
  const void* ptr;
  const Tensor* weight = nullptr;
};

// Runs the primitive on user buffers: inputs reordered in as needed, outputs staged in the
// primitive's layout and reordered out.
void execute(const ConvEntry& e, const std::vector<Input>& in, const std::vector<void*>& out, CallState& cs) {
  MIXPREC_ASSERT(in.size() == e.inputs.size() && out.size() == e.outputs.size(), "conv operand count");
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const Operand& op = e.inputs[i];
    args[op.arg] = in[i].weight && op.reorder ? weight_cache().get(*in[i].weight, op) : bind_input(op, in[i].ptr, cs);
  }
  // Outputs staged in the primitive's layout live until they are reordered out, not for the call.
  CallState staging;
  std::vector<memory> staged(e.outputs.size());
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const Operand& op = e.outputs[i];
    staged[i] = op.reorder ? staging.buffer(op.prim) : memory(op.user, dnnl_engine(), out[i]);
    args[op.arg] = staged[i];
  }
  Scratchpad pad(e.pd);
  pad.add_to(args);
  profile::detail::note_impl(e.impl);
  e.prim.execute(dnnl_stream(), args);
  for (size_t i = 0; i < e.outputs.size(); ++i)
    if (e.outputs[i].reorder) run_reorder(e.outputs[i], staged[i], memory(e.outputs[i].user, dnnl_engine(), out[i]));
}

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
// t: the primitives' dtype (x's, or f32 with bf16 operands widened by the reorders). gy_prim:
// grad_y already reordered into the layout of the whole batch (by backward-data), or null; where
// each share's layout is a slice of it, the parts read their shares there instead of reordering.
bool backward_weights_split(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out, DType t,
                            const memory* gy_prim) {
  const int64_t threads = omp_get_max_threads();
  const int64_t share = (g.n + threads - 1) / threads, parts = (g.n + share - 1) / share;
  const int64_t last = g.n - (parts - 1) * share;
  const bool with_bias = out.bias.defined();
  ConvGeometry gs = g, gl = g;
  gs.n = share, gl.n = last;
  ConvEntry hold_s, hold_l;
  const ConvEntry* es =
      entry(gs, t, with_bias, DType::f32, false, ConvPass::backward_weights, hold_s, true, false, x.dtype());
  const ConvEntry* el = last == share ? es
                                      : entry(gl, t, with_bias, DType::f32, false, ConvPass::backward_weights, hold_l,
                                              true, false, x.dtype());
  if (!es || !el) return false;
  const int64_t gy_image_bytes = gy_prim ? image_bytes_if_slices(gy_prim->get_desc(), es->inputs[1].prim) : 0;
  const int64_t gy_last_bytes =
      gy_prim && el != es ? image_bytes_if_slices(gy_prim->get_desc(), el->inputs[1].prim) : gy_image_bytes;
  const bool gy_sliced = gy_image_bytes > 0 && gy_last_bytes == gy_image_bytes;
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
                          static_cast<const char*>(grad_y.data_ptr()) + p * y_share * int64_t(es_bytes)};
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

std::atomic<bool>& widening_reorders_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// bf16 operands of a convolution on the f32 road (conv_in_f32) widened by the reorders into the f32
// primitive's layouts, which read them anyway, instead of by a cast pass each before (f16 has no
// jit reorder in oneDNN 2.6: its reference one took 130 ms for a 256x64x14x14 tensor, so f16 keeps
// the casts), on AVX-512 hosts (the bf16 reorders' jit kernels need it; an entry whose reorder
// would run oneDNN's reference kernel is refused, and the casts run). Outputs are still reordered
// into f32 and rounded by mixprec, which keeps f32 subnormals where oneDNN's AVX512-BF16
// conversion flushes them.
constexpr const char* kWideningReorders = "widened_by_reorders";  // the profile's name for it
bool widening_reorders() { return widening_reorders_flag().load() && simd_lanes() == Lanes::avx512; }

// A convolution on oneDNN's primitives of dtype t; the caller's x and weight in t, or bf16 for t f32.
bool forward_on(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu,
                Tensor& dst, DType t) {
  ConvEntry holder;
  const ConvEntry* e = entry(g, t, bias.defined(), bias.defined() ? bias.dtype() : DType::f32, relu, ConvPass::forward,
                             holder, false, false, x.dtype());
  if (!e) return false;
  if (x.dtype() != t) profile::detail::note_impl(kWideningReorders);
  CallState cs;
  std::vector<Input> in{{x.data_ptr()}, {weight.data_ptr(), &weight}};
  if (bias.defined()) in.push_back({bias.data_ptr()});
  execute(*e, in, {dst.data_ptr()}, cs);
  return true;
}

// The gradients on primitives of dtype t (the caller's grad_y, x and weight in t, or bf16 for t f32,
// where only oneDNN's own primitives run: conv2d_backward checks), into out's tensors.
bool backward_on(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g, ConvGrads& out,
                 DType t) {
  const bool need_x = out.x.defined(), need_w = out.weight.defined(), need_b = out.bias.defined();
  const DType in_t = grad_y.dtype();
  if (need_b && out.bias.dtype() != DType::f32 && out.bias.dtype() != t) return false;
  // The weight gradient: mixprec's kernel for a short bf16 contraction, one matmul per tap (gemm),
  // a forward convolution (wf), oneDNN's backward-weights split over the batch, or one oneDNN
  // primitive (bw).
  const bool small_k = need_w && x.dtype() == t && small_k_wgrad(g, t);
  const bool gemm = need_w && !small_k && x.dtype() == t && wgrad_as_gemm(g, t);
  ConvEntry hold_d, hold_w, hold_wf;
  const ConvEntry* wf = need_w && !small_k && !gemm && x.dtype() == t && wgrad_as_forward(g, t)
                            ? entry(g, t, false, DType::f32, false, ConvPass::weights_as_forward, hold_wf)
                            : nullptr;
  const bool split = need_w && !small_k && !gemm && !wf && split_wgrad(g);
  const bool one_primitive = need_w && !small_k && !gemm && !wf && !split;
  // The bias gradient rides on backward-weights; otherwise (frozen weight, or the weight gradient
  // as matmuls or a forward convolution) it is a plain reduction.
  const bool fused_bias = need_b && need_w && !wf && !gemm;
  // The input gradient: a forward convolution of the flipped weight, else oneDNN's backward-data.
  const ConvEntry* bd = need_x && in_t == t && dgrad_as_forward(g, t)
                            ? entry(dgrad_geometry(g), t, false, DType::f32, false, ConvPass::forward, hold_d)
                            : nullptr;
  const bool as_forward = bd != nullptr;
  if (need_x && !bd) bd = entry(g, t, false, DType::f32, false, ConvPass::backward_data, hold_d, false, false, in_t);
  const bool wgrad_f32 = need_w && out.weight.dtype() == DType::f32 && t == DType::bf16;
  if (need_w && out.weight.dtype() != t && !wgrad_f32) return false;
  const ConvEntry* bw = one_primitive ? entry(g, t, fused_bias, need_b ? out.bias.dtype() : DType::f32, false,
                                              ConvPass::backward_weights, hold_w, false, wgrad_f32, in_t)
                                      : nullptr;
  if ((need_x && !bd) || (one_primitive && !bw)) return false;
  if (in_t != t) profile::detail::note_impl(kWideningReorders);
  CallState cs;
  // Backward-data first where the split follows: the parts then read their shares of grad_y from
  // the copy it reordered, where the layouts agree, instead of reordering them again.
  const bool data_first = split && need_x && !as_forward;
  if (data_first) execute(*bd, {{grad_y.data_ptr()}, {weight.data_ptr(), &weight}}, {out.x.data_ptr()}, cs);
  if (small_k || split) {
    ConvGrads wgrads;  // weight (and bias) only: backward-data runs below
    wgrads.weight = out.weight;
    if (fused_bias) wgrads.bias = out.bias;
    if (small_k)
      backward_weights_small_k(grad_y, x, g, wgrads);
    else if (!backward_weights_split(grad_y, x, g, wgrads, t, data_first ? cs.find(grad_y.data_ptr()) : nullptr))
      return false;
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
    execute(*wf, {{x.data_ptr()}, {grad_y.data_ptr()}}, {dw}, wcs);
    if (!direct) convert(dw, DType::f32, out.weight.data_ptr(), out.weight.dtype(), size_t(out.weight.numel()));
  }
  if (need_x && as_forward) {
    const Tensor flipped = flipped_transposed(weight, g);
    profile::detail::note_impl("dgrad_as_fwd");
    execute(*bd, {{grad_y.data_ptr()}, {flipped.data_ptr()}}, {out.x.data_ptr()}, cs);
  } else if (need_x && !data_first) {
    execute(*bd, {{grad_y.data_ptr()}, {weight.data_ptr(), &weight}}, {out.x.data_ptr()}, cs);
  }
  if (one_primitive) {
    std::vector<void*> outs{out.weight.data_ptr()};
    if (fused_bias) outs.push_back(out.bias.data_ptr());
    execute(*bw, {{x.data_ptr()}, {grad_y.data_ptr()}}, outs, cs);
  }
  if (need_b && !fused_bias) conv_bias_gradient(grad_y, g, out.bias);
  return true;
}

}  // namespace

void set_conv_widening_reorders(bool on) { widening_reorders_flag().store(on); }

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
    Tensor dst32 = Tensor::empty(dst.shape(), DType::f32);
    const bool by_reorders = widening_reorders() && x.dtype() == DType::bf16 && weight.dtype() == DType::bf16 &&
                             (!bias.defined() || bias.dtype() == DType::f32 || bias.dtype() == DType::bf16);
    if (!(by_reorders && forward_on(x, weight, bias, g, relu, dst32, DType::f32)) &&
        !conv2d_forward(as_f32(x), as_f32(weight), as_f32(bias), g, relu, dst32))
      return false;
    kernels::copy(dst32, dst);
    return true;
  }
  if (x.dtype() != DType::f32 && !(x.dtype() == DType::bf16 && bf16_unit())) return false;
  if (bias.defined() && bias.dtype() != DType::f32 && bias.dtype() != x.dtype()) return false;
  return forward_on(x, weight, bias, g, relu, dst, x.dtype());
}

bool conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                     ConvGrads& out) {
  if (!shapes_ok(g) || !dense(grad_y) || !dense(x) || !dense(weight)) return false;
  const bool need_x = out.x.defined(), need_w = out.weight.defined(), need_b = out.bias.defined();
  const DType t = grad_y.dtype();
  if (conv_in_f32(g, t)) {
    // An f16 first layer's weight and bias gradients: mixprec's kernel on the f16 tensors (the cnns'
    // first layers need nothing else, so grad_y is never cast); the rest in f32.
    const bool small_k = need_w && t == DType::f16 && x.dtype() == t && small_k_wgrad(g, t) &&
                         out.weight.dtype() == t && (!need_b || out.bias.dtype() == t);
    if (small_k) backward_weights_small_k(grad_y, x, g, out);
    const bool wide_w = need_w && !small_k, wide_b = need_b && !small_k;
    if (!need_x && !wide_w && !wide_b) return true;
    ConvGrads o32;
    if (need_x) o32.x = Tensor::empty(out.x.shape(), DType::f32);
    if (wide_w) o32.weight = Tensor::empty(out.weight.shape(), DType::f32);
    if (wide_b) o32.bias = Tensor::empty(out.bias.shape(), DType::f32);
    // bf16 operands widened by the reorders where f32 would run oneDNN's primitives alone (the
    // weight gradient's other paths read f32 x and grad_y from memory).
    // x is there for a weight gradient, the weight for an input gradient.
    const bool by_reorders =
        widening_reorders() && t == DType::bf16 && (!wide_w || x.dtype() == t) && (!need_x || weight.dtype() == t) &&
        (!wide_w ||
         (!small_k_wgrad(g, DType::f32) && !wgrad_as_gemm(g, DType::f32) && !wgrad_as_forward(g, DType::f32)));
    if (!(by_reorders && backward_on(grad_y, x, weight, g, o32, DType::f32)) &&
        !conv2d_backward(as_f32(grad_y), wide_w ? as_f32(x) : x, need_x ? as_f32(weight) : weight, g, o32))
      return false;
    if (need_x) kernels::copy(o32.x, out.x);
    if (wide_w) kernels::copy(o32.weight, out.weight);
    if (wide_b) kernels::copy(o32.bias, out.bias);
    return true;
  }
  if (t != DType::f32 && !(t == DType::bf16 && bf16_unit())) return false;
  return backward_on(grad_y, x, weight, g, out, t);
}

std::string conv_impl_name(const ConvGeometry& g, DType t, ConvPass pass) {
  ConvEntry holder;
  const ConvEntry* e = entry(g, t, false, DType::f32, false, pass, holder);
  return e ? e->impl : "";
}

CacheStats conv_cache_stats() { return cache().stats(); }
void conv_cache_clear() { cache().clear(); }

WeightCacheStats conv_weight_cache_stats() {
  WeightCache& c = weight_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.purge(nullptr);
  WeightCacheStats s;
  s.hits = c.hits;
  s.reorders = c.reorders;
  s.entries = int64_t(c.entries.size());
  for (const auto& e : c.entries) s.bytes += int64_t(e.buf->bytes());
  return s;
}

void conv_weight_cache_clear() {
  WeightCache& c = weight_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.clear();
  c.hits = c.reorders = 0;
}

}  // namespace mixprec::kernels::cpu
