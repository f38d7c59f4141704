// The oneDNN convolution primitives behind cpu/conv.cpp (conv_entries.h): their cache keyed by
// shape, dtypes, flags and pass, the primitives created with oneDNN's preferred layouts
// (format_tag::any) and the reorders between them and the caller's buffers, the reordered-weight
// cache, and one entry run on the caller's buffers.
#include "kernels/cpu/conv_entries.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "core/profile_detail.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {
namespace conv_detail {
namespace {

using Tag = memory::format_tag;

struct ConvKey {
  std::array<int64_t, 17> geometry;
  DType t, bias_t;
  bool has_bias;
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
    h = hash_mix(h, uint64_t(k.t) | uint64_t(k.bias_t) << 8 | uint64_t(k.has_bias) << 16 | uint64_t(k.pass) << 18 |
                        uint64_t(k.split) << 20 | uint64_t(k.wgrad_f32) << 21 | uint64_t(k.in_t) << 24);
    return h;
  }
};

ConvKey make_key(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, ConvPass pass, bool split, bool wgrad_f32,
                 DType in_t) {
  return ConvKey{{g.n, g.c, g.h, g.w, g.oc, g.kh, g.kw, g.oh, g.ow, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dil_h,
                  g.dil_w, g.groups, 0},
                 t,
                 has_bias ? bias_t : DType::f32,
                 has_bias,
                 wgrad_f32,
                 pass,
                 split,
                 in_t};
}

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
    // No ReLU post-op: its jit form (max(x, 0)) makes a NaN +0 on AVX-512 hosts; the caller applies
    // mixprec's ReLU after the primitive (cpu/conv.cpp, forward_on).
    auto pd = forward_pd(d, key.has_bias, attr);
    if (g.c <= kFirstLayerChannels && key.t != DType::f32 && pd.dst_desc() != d.user_dst) {
      // A 16-bit first layer (1-4 input channels) writes NCHW directly: oneDNN's im2col kernel
      // costs what its blocked kernel does at K = 9*C, and the blocked output would need a reorder
      // of the largest activation in the net. Not in f32, where the im2col kernel runs at a tenth
      // of the blocked one's speed, reorder included (docs/conv.md).
      Descs plain = d;
      plain.dst = d.user_dst;
      try {
        auto pd_plain = forward_pd(plain, key.has_bias, attr);
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
  cs.reordered.push_back({user_ptr, op.prim, prim, cs.bufs.size() - 1});
  return prim;
}

// An f32 primitive's output rounded into the caller's 16-bit buffer (out.t) in the user layout:
// straight from nChw16c, else from the user layout in f32 (reordered into it when the primitive's
// differs). One rounding to nearest either way, convert()'s bits.
void round_out(const Operand& op, const memory& staged, const Output& out, CallState& staging) {
  MIXPREC_ASSERT(op.user.data_type() == memory::data_type::f32, "conv: rounds only an f32 output");
  const memory::dims d = op.user.dims();
  const auto* f32 = static_cast<const float*>(staged.get_data_handle());
  if (d.size() == 4 && is_f32_nchw16c(op.prim)) {
    round_nchw16c(f32, d[0], d[1], d[2] * d[3], out.t, out.ptr);
    return;
  }
  if (op.reorder) {
    const memory plain = staging.buffer(op.user);
    run_reorder(op, staged, plain);
    f32 = static_cast<const float*>(plain.get_data_handle());
  }
  convert(f32, DType::f32, out.ptr, out.t, op.user.get_size() / sizeof(float));
}

}  // namespace

const ConvEntry* entry(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, ConvPass pass, ConvEntry& holder,
                       bool split, bool wgrad_f32, std::optional<DType> in_t) {
  const ConvKey key = make_key(g, t, has_bias, bias_t, pass, split, wgrad_f32 && !split, in_t.value_or(t));
  holder = cache().get_or_create(key, [&] {
    try {
      return create_entry(g, key);
    } catch (const dnnl::error&) {
      return ConvEntry{};
    }
  });
  return holder.prim ? &holder : nullptr;
}

void execute(const ConvEntry& e, const std::vector<Input>& in, const std::vector<Output>& out, CallState& cs) {
  MIXPREC_ASSERT(in.size() == e.inputs.size() && out.size() == e.outputs.size(), "conv operand count");
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const Operand& op = e.inputs[i];
    args[op.arg] = in[i].weight && op.reorder ? weight_cache().get(*in[i].weight, op) : bind_input(op, in[i].ptr, cs);
  }
  // Outputs staged in the primitive's layout live until they are reordered out, not for the call.
  CallState staging;
  std::vector<memory> staged(e.outputs.size());
  std::vector<bool> rounds(e.outputs.size());
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const Operand& op = e.outputs[i];
    rounds[i] = to_dnnl(out[i].t) != op.user.data_type();
    staged[i] = op.reorder || rounds[i] || out[i].consume ? staging.buffer(op.prim)
                                                          : memory(op.user, dnnl_engine(), out[i].ptr);
    args[op.arg] = staged[i];
  }
  Scratchpad pad(e.pd);
  pad.add_to(args);
  profile::detail::note_impl(e.impl);
  e.prim.execute(dnnl_stream(), args);
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const Operand& op = e.outputs[i];
    if (out[i].consume)
      out[i].consume(staged[i]);
    else if (rounds[i])
      round_out(op, staged[i], out[i], staging);
    else if (op.reorder)
      run_reorder(op, staged[i], memory(op.user, dnnl_engine(), out[i].ptr));
  }
}

}  // namespace conv_detail

std::string conv_impl_name(const ConvGeometry& g, DType t, ConvPass pass) {
  conv_detail::ConvEntry holder;
  const conv_detail::ConvEntry* e = conv_detail::entry(g, t, false, DType::f32, pass, holder);
  return e ? e->impl : "";
}

CacheStats conv_cache_stats() { return conv_detail::cache().stats(); }
void conv_cache_clear() { conv_detail::cache().clear(); }

WeightCacheStats conv_weight_cache_stats() {
  conv_detail::WeightCache& c = conv_detail::weight_cache();
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
  conv_detail::WeightCache& c = conv_detail::weight_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.clear();
  c.hits = c.reorders = 0;
}

}  // namespace mixprec::kernels::cpu
