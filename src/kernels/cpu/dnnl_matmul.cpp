// oneDNN matmul over strided raw pointers, one cached primitive per shape (see dnnl_matmul.h).
#include "kernels/cpu/dnnl_matmul.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "core/profile_detail.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {
namespace {

using dnnl::memory;

// A reorder of one operand from the caller's layout into the one the primitive wants.
struct DenseCopy {
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder prim;
  explicit operator bool() const { return bool(prim); }
};

}  // namespace

struct MatmulEntry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory::desc src_md, wei_md, dst_md, bias_md;  // the caller's layouts
  // Set when the caller's layout of src / wei would fall to oneDNN's reference kernel: the
  // operand is first reordered into pd's dense layout (O(size) copy versus O(m*n*k) compute).
  DenseCopy src_copy, wei_copy;
  std::string impl;
};

namespace {

// Everything that shapes the primitive, with strides canonicalised (see canonical_2d); never
// the data pointers, so every training step after the first one is a cache hit.
struct MatmulKey {
  int64_t batch, m, n, k;
  DType src_t, wei_t, dst_t, bias_t;
  bool has_bias, relu, accumulate, one_thread;
  std::array<int64_t, 3> src_strides, wei_strides;  // batch, row, col; batch 0 = broadcast
  std::array<int64_t, 2> dst_strides;               // batch, row (col stride is 1)
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    size_t h = 0;
    for (int64_t v : {key.batch, key.m, key.n, key.k}) h = hash_mix(h, uint64_t(v));
    for (DType t : {key.src_t, key.wei_t, key.dst_t, key.bias_t}) h = hash_mix(h, uint64_t(t));
    h = hash_mix(h, uint64_t(key.has_bias) | uint64_t(key.relu) << 1 | uint64_t(key.accumulate) << 2 |
                        uint64_t(key.one_thread) << 3);
    for (int64_t v : key.src_strides) h = hash_mix(h, uint64_t(v));
    for (int64_t v : key.wei_strides) h = hash_mix(h, uint64_t(v));
    for (int64_t v : key.dst_strides) h = hash_mix(h, uint64_t(v));
    return h;
  }
};

DenseCopy make_dense_copy(const memory::desc& from, const memory::desc& to) {
  DenseCopy c;
  c.pd = dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to, user_scratchpad_attr());
  c.prim = dnnl::reorder(c.pd);
  return c;
}

// Entries are shared, not copied: a memory::desc is a ~1 KB struct in oneDNN 2.x.
using EntryPtr = std::shared_ptr<const MatmulEntry>;

PrimitiveCache<MatmulKey, EntryPtr, MatmulKeyHash>& cache() {
  static PrimitiveCache<MatmulKey, EntryPtr, MatmulKeyHash> c;
  return c;
}

// A size-1 dimension's stride is meaningless: give it the value a dense layout would have, so
// that equal layouts share one key and oneDNN sees a dense matrix where there is one.
void canonical_2d(int64_t rows, int64_t cols, int64_t& stride_r, int64_t& stride_c) {
  if (rows == 1 && cols == 1) {
    stride_r = stride_c = 1;
  } else if (rows == 1) {
    stride_r = stride_c == 1 ? cols : 1;
  } else if (cols == 1) {
    stride_c = stride_r == 1 ? rows : 1;
  }
}

MatmulKey make_key(const MatmulArgs& a, bool one_thread = false) {
  MatmulKey key{};
  key.batch = a.batch;
  key.m = a.m, key.n = a.n, key.k = a.k;
  key.src_t = a.src_t, key.wei_t = a.wei_t, key.dst_t = a.dst_t;
  key.has_bias = a.bias != nullptr;
  key.bias_t = key.has_bias ? a.bias_t : DType::f32;
  key.relu = a.relu, key.accumulate = a.accumulate;
  key.one_thread = one_thread;
  key.src_strides = {a.batch > 1 ? a.src_stride_batch : 0, a.src_stride_m, a.src_stride_k};
  key.wei_strides = {a.batch > 1 ? a.wei_stride_batch : 0, a.wei_stride_k, a.wei_stride_n};
  int64_t dst_stride_n = 1;
  key.dst_strides = {a.batch > 1 ? a.dst_stride_batch : 0, a.dst_stride_m};
  canonical_2d(a.m, a.k, key.src_strides[1], key.src_strides[2]);
  canonical_2d(a.k, a.n, key.wei_strides[1], key.wei_strides[2]);
  canonical_2d(a.m, a.n, key.dst_strides[1], dst_stride_n);
  return key;
}

// dims/strides of one operand: [rows, cols] when batch == 1, else [batch or 1, rows, cols].
memory::desc operand_md(const MatmulKey& key, int64_t rows, int64_t cols, DType t,
                        const std::array<int64_t, 3>& strides) {
  if (key.batch == 1) return memory::desc({rows, cols}, to_dnnl(t), {strides[1], strides[2]});
  // Batch stride 0 broadcasts: oneDNN wants that as a batch dim of 1 (a 0 stride is reference-only).
  const int64_t extent = std::max(rows * strides[1], cols * strides[2]);
  const bool bcast = strides[0] == 0;
  return memory::desc({bcast ? 1 : key.batch, rows, cols}, to_dnnl(t),
                      {bcast ? extent : strides[0], strides[1], strides[2]});
}

memory::desc dense_like(const memory::desc& md) {
  const memory::dims dims = md.dims();
  return memory::desc(dims, md.data_type(), dims.size() == 2 ? memory::format_tag::ab : memory::format_tag::abc);
}

bool is_reference(const dnnl::primitive_desc_base& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

dnnl::matmul::primitive_desc make_pd(const MatmulEntry& e, bool has_bias, const dnnl::primitive_attr& attr) {
  const auto desc = has_bias ? dnnl::matmul::desc(e.src_md, e.wei_md, e.bias_md, e.dst_md)
                             : dnnl::matmul::desc(e.src_md, e.wei_md, e.dst_md);
  return dnnl::matmul::primitive_desc(desc, attr, dnnl_engine());
}

EntryPtr create_entry(const MatmulKey& key) {
  auto entry = std::make_shared<MatmulEntry>();
  MatmulEntry& e = *entry;
  e.src_md = operand_md(key, key.m, key.k, key.src_t, key.src_strides);
  e.wei_md = operand_md(key, key.k, key.n, key.wei_t, key.wei_strides);
  e.dst_md = operand_md(key, key.m, key.n, key.dst_t, {key.dst_strides[0], key.dst_strides[1], 1});
  if (key.has_bias) {
    e.bias_md = key.batch == 1 ? memory::desc({1, key.n}, to_dnnl(key.bias_t), memory::format_tag::ab)
                               : memory::desc({1, 1, key.n}, to_dnnl(key.bias_t), memory::format_tag::abc);
  }
  dnnl::primitive_attr attr = user_scratchpad_attr();
  dnnl::post_ops ops;
  // relu before sum: dst = relu(src @ wei + bias) + dst, the order MatmulArgs documents.
  if (key.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  if (key.accumulate) ops.append_sum(1.f);
  attr.set_post_ops(ops);

  std::optional<SingleThreadScope> one_thread;
  if (key.one_thread) one_thread.emplace();
  try {
    e.pd = make_pd(e, key.has_bias, attr);
    // brgemm and gemm kernels need a unit stride in each operand; without one oneDNN falls to
    // ref:any, ~1000x slower (0.1 GFLOP/s at 512x1024x1024). Retry with dense copies.
    if (is_reference(e.pd)) {
      MatmulEntry dense = e;
      const bool src_sparse = dense_like(e.src_md) != e.src_md;
      const bool wei_sparse = dense_like(e.wei_md) != e.wei_md;
      if (src_sparse) dense.src_md = dense_like(e.src_md);
      if (wei_sparse) dense.wei_md = dense_like(e.wei_md);
      if (src_sparse || wei_sparse) {
        auto pd = make_pd(dense, key.has_bias, attr);
        if (!is_reference(pd)) {
          e.pd = pd;
          if (src_sparse) e.src_copy = make_dense_copy(e.src_md, pd.src_desc());
          if (wei_sparse) e.wei_copy = make_dense_copy(e.wei_md, pd.weights_desc());
        }
      }
    }
    e.prim = dnnl::matmul(e.pd);
  } catch (const dnnl::error& err) {
    throw Error(detail::concat("matmul: oneDNN cannot run ", dtype_name(key.src_t), " @ ", dtype_name(key.wei_t),
                               " -> ", dtype_name(key.dst_t), " with batch=", key.batch, " m=", key.m, " n=", key.n,
                               " k=", key.k, ": ", err.what()));
  }
  e.impl = e.pd.impl_info_str();
  if (e.src_copy) e.impl += " +dense(src)";
  if (e.wei_copy) e.impl += " +dense(wei)";
  return entry;
}

}  // namespace

// Probed once, by creating a small bf16 primitive.
bool matmul_has_bf16() {
  static const bool ok = [] {
    try {
      const memory::desc md({16, 16}, memory::data_type::bf16, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), user_scratchpad_attr(), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

namespace {

void validate(const MatmulArgs& a) {
  MIXPREC_CHECK(matmul_supported(a), "matmul: no oneDNN kernel for src ", dtype_name(a.src_t), " @ wei ",
                dtype_name(a.wei_t), " -> dst ", dtype_name(a.dst_t), a.bias ? " with bias " : "",
                a.bias ? dtype_name(a.bias_t) : "", "; expected f32@f32->f32, bf16@bf16->bf16 or bf16@bf16->f32, ",
                "bias f32 (or bf16 with bf16 src)");
  MIXPREC_CHECK(a.batch >= 0 && a.m >= 0 && a.n >= 0 && a.k >= 0, "matmul: negative size batch=", a.batch, " m=", a.m,
                " n=", a.n, " k=", a.k);
  // Strides of an operand with no elements (k == 0) are never used.
  const auto stride_ok = [&](int64_t size, int64_t stride) { return size <= 1 || a.k == 0 || stride >= 1; };
  MIXPREC_CHECK(stride_ok(a.m, a.src_stride_m) && stride_ok(a.k, a.src_stride_k) && stride_ok(a.k, a.wei_stride_k) &&
                    stride_ok(a.n, a.wei_stride_n) && (a.m <= 1 || a.dst_stride_m >= a.n),
                "matmul: bad strides src (", a.src_stride_m, ",", a.src_stride_k, ") wei (", a.wei_stride_k, ",",
                a.wei_stride_n, ") dst (", a.dst_stride_m, ",1) for m=", a.m, " n=", a.n, " k=", a.k,
                "; expected >= 1 and dst rows not overlapping");
  MIXPREC_CHECK(a.batch <= 1 || (a.src_stride_batch >= 0 && a.wei_stride_batch >= 0 &&
                                 a.dst_stride_batch >= (a.m - 1) * a.dst_stride_m + a.n),
                "matmul: bad batch strides src ", a.src_stride_batch, " wei ", a.wei_stride_batch, " dst ",
                a.dst_stride_batch, "; expected >= 0 (0 broadcasts) and dst batches not overlapping");
  MIXPREC_CHECK(a.batch <= 1 || a.k == 0 || a.src_stride_batch != 0 || a.wei_stride_batch != 0,
                "matmul: src and wei both broadcast over batch=", a.batch, ": compute one product instead");
  // An empty product needs no pointers (empty tensors may have none); k == 0 reads no operand.
  const bool writes = a.batch > 0 && a.m > 0 && a.n > 0;
  MIXPREC_CHECK(!writes || (a.dst != nullptr && (a.k == 0 || (a.src != nullptr && a.wei != nullptr))),
                "matmul: null data pointer");
}

// k == 0 makes the result relu(bias) + dst, but oneDNN 2.6 divides by K (SIGFPE): run the
// same post-ops with K = 1 over zeros (src [batch][m,1], wei [1,n] broadcast over the batch).
MatmulArgs zero_k_args(const MatmulArgs& a, const void* zeros) {
  MatmulArgs z = a;
  z.k = 1;
  z.src = z.wei = zeros;
  z.src_stride_m = 1, z.src_stride_k = a.m, z.src_stride_batch = a.m;  // oneDNN can't broadcast both
  z.wei_stride_k = a.n, z.wei_stride_n = 1, z.wei_stride_batch = 0;
  return z;
}

}  // namespace

bool matmul_supported(const MatmulArgs& a) {
  using enum DType;
  const bool all_f32 = a.src_t == f32 && a.wei_t == f32 && a.dst_t == f32;
  const bool bf16_in = a.src_t == bf16 && a.wei_t == bf16 && (a.dst_t == bf16 || a.dst_t == f32);
  if (!all_f32 && !bf16_in) return false;
  if (a.bias != nullptr && !(a.bias_t == f32 || (bf16_in && a.bias_t == bf16))) return false;
  return all_f32 || matmul_has_bf16();
}

void matmul(const MatmulArgs& a) {
  validate(a);
  if (a.batch == 0 || a.m == 0 || a.n == 0) return;
  if (a.k == 0) {
    WorkspaceBuffer zeros(size_t(std::max(a.batch * a.m, a.n)) * dtype_size(a.src_t));
    std::memset(zeros.data(), 0, zeros.bytes());  // 0x0000 is +0 in f32 and bf16 alike
    return matmul(zero_k_args(a, zeros.data()));
  }
  const MatmulKey key = make_key(a);
  const EntryPtr entry = cache().get_or_create(key, [&] { return create_entry(key); });
  const MatmulEntry& e = *entry;

  dnnl::engine& eng = dnnl_engine();
  dnnl::stream& strm = dnnl_stream();
  // oneDNN memories take void*; src, wei and bias are only read.
  memory src_mem(e.src_md, eng, const_cast<void*>(a.src));
  memory wei_mem(e.wei_md, eng, const_cast<void*>(a.wei));
  std::optional<WorkspaceBuffer> src_dense, wei_dense;  // live until the matmul has run
  const auto densify = [&](const DenseCopy& copy, memory& mem, std::optional<WorkspaceBuffer>& buf) {
    buf.emplace(copy.pd.dst_desc().get_size());
    memory dense(copy.pd.dst_desc(), eng, buf->data());
    Scratchpad pad(copy.pd);
    std::unordered_map<int, memory> args{{DNNL_ARG_FROM, mem}, {DNNL_ARG_TO, dense}};
    pad.add_to(args);
    copy.prim.execute(strm, args);
    mem = dense;
  };
  if (e.src_copy) densify(e.src_copy, src_mem, src_dense);
  if (e.wei_copy) densify(e.wei_copy, wei_mem, wei_dense);

  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, wei_mem}, {DNNL_ARG_DST, memory(e.dst_md, eng, a.dst)}};
  if (a.bias != nullptr) args.emplace(DNNL_ARG_BIAS, memory(e.bias_md, eng, const_cast<void*>(a.bias)));
  Scratchpad pad(e.pd);
  pad.add_to(args);
  profile::detail::note_impl(e.impl);
  e.prim.execute(strm, args);
  strm.wait();
}

std::string matmul_impl_name(const MatmulArgs& a) {
  validate(a);
  if (a.batch == 0 || a.m == 0 || a.n == 0) return "none (empty)";
  static const char zeros = 0;  // not read: only the primitive is created
  const MatmulKey key = make_key(a.k == 0 ? zero_k_args(a, &zeros) : a);
  return cache().get_or_create(key, [&] { return create_entry(key); })->impl;
}

OneThreadMatmul::OneThreadMatmul(const MatmulArgs& shape) {
  validate(shape);
  MIXPREC_CHECK(shape.batch > 0 && shape.m > 0 && shape.n > 0 && shape.k > 0,
                "OneThreadMatmul: empty product m=", shape.m, " n=", shape.n, " k=", shape.k);
  const MatmulKey key = make_key(shape, true);
  e_ = cache().get_or_create(key, [&] { return create_entry(key); });
}

bool OneThreadMatmul::ok() const { return !e_->src_copy && !e_->wei_copy; }
size_t OneThreadMatmul::scratchpad_bytes() const { return e_->pd.scratchpad_desc().get_size(); }
const std::string& OneThreadMatmul::impl() const { return e_->impl; }

void OneThreadMatmul::run(const void* src, const void* wei, void* dst, const void* bias, void* scratchpad) const {
  const MatmulEntry& e = *e_;
  dnnl::engine& eng = dnnl_engine();
  static thread_local dnnl::stream strm(eng);  // one stream per thread, as conv.cpp's split
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(e.src_md, eng, const_cast<void*>(src))},
                                       {DNNL_ARG_WEIGHTS, memory(e.wei_md, eng, const_cast<void*>(wei))},
                                       {DNNL_ARG_DST, memory(e.dst_md, eng, dst)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, memory(e.bias_md, eng, const_cast<void*>(bias)));
  if (scratchpad_bytes() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.pd.scratchpad_desc(), eng, scratchpad));
  e.prim.execute(strm, args);
}

CacheStats matmul_cache_stats() { return cache().stats(); }
void matmul_cache_clear() { cache().clear(); }

}  // namespace mixprec::kernels::cpu
