// 16-bit products in f32, a block per thread (see matmul_widened.h).
//
// The whole-tensor road (cast both operands to f32, one product, copy the result back) costs
// 1.2-1.4x the time of the same product on f32 operands (`bf16_road_probe widened`, Emerald Rapids
// guest, 2 cores): three passes over tensors of megabytes, each its own parallel region, with the
// product reading its operands back from memory. Here one region does it all, and each thread's
// f32 copies (about kBlockFloats floats a block) stay in its cache from widening to product to
// rounding.
#include "kernels/cpu/matmul_widened.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <vector>

#include "core/parallel.h"
#include "core/profile_detail.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/dnnl_matmul.h"
#include "kernels/shape.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

// f32 values a thread widens and produces per block: about 1 MiB, half of one core's L2 on the
// Intel kinds, and at least 256 rows (or chunk rows) of them. `bf16_road_probe` with the sizes
// 2^16..2^22 against the same product on f32 operands, best of 9 interleaved (Emerald Rapids guest):
// the gpt's shapes did best at 2^17-2^18 (0.95-1.22x f32's time), the mlp's (k + n = 1800) at
// 2^19-2^20 (1.14-1.20x); 2^16 lost up to 1.67x.
constexpr int64_t kBlockFloats = int64_t(1) << 18, kMinBlockRows = 256;
// Below this much work (flops) a block per thread costs more than the three passes save.
constexpr double kMinFlops = double(int64_t(1) << 22);

std::atomic<bool> g_on{true}, g_columns{true};
std::atomic<WidenedB> g_b{WidenedB::host_rule};

// Stands in for the data pointers when a product is created (never read or written there).
float placeholder = 0.f;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

// The pieces a dimension of `extent` is split into: `count` of `size`, the last `last` long.
struct Pieces {
  int64_t size, count, last;
};
// Pieces of whole multiples of 16, as even as that allows, their count a multiple of the thread
// count (each thread takes as many), each about kBlockFloats / `across` long (at least
// kMinBlockRows): a piece and the `across` elements of each of its rows or columns (the operands'
// and the result's) make one block.
Pieces pieces_of(int64_t extent, int64_t across, int64_t threads) {
  constexpr int64_t kAlign = 16;
  const int64_t most = std::max({kMinBlockRows, kBlockFloats / across, kAlign});
  const int64_t wanted = round_up(ceil_div(extent, most), threads);
  const int64_t size = std::min(extent, round_up(ceil_div(extent, wanted), kAlign)), count = ceil_div(extent, size);
  return {size, count, extent - (count - 1) * size};
}

// n elements of a 16-bit row (contiguous) into f32.
void widen(const void* src, DType t, float* dst, int64_t n) { convert(src, t, dst, DType::f32, size_t(n)); }

// rows x cols 16-bit elements, row r at src + r * ld elements, into a dense f32 [rows, cols].
void widen_block(const char* src, DType t, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  if (ld == cols) return widen(src, t, dst, rows * cols);
  for (int64_t r = 0; r < rows; ++r) widen(src + size_t(r * ld) * dtype_size(t), t, dst + r * cols, cols);
}

// A dense f32 [rows, cols] rounded into rows x cols elements of t, row r at dst + r * ld elements.
void round_block(const float* src, int64_t rows, int64_t cols, char* dst, int64_t ld, DType t) {
  if (ld == cols) return convert(src, DType::f32, dst, t, size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    convert(src + r * cols, DType::f32, dst + size_t(r * ld) * dtype_size(t), t, size_t(cols));
}

// Rows of a 2-d tensor with unit column stride: [r0, r0 + rows) into a dense f32 [rows, cols].
void widen_rows(const Tensor& x, int64_t r0, int64_t rows, float* dst) {
  const int64_t stride = x.strides()[0];
  const auto* base = static_cast<const char*>(x.data_ptr()) + size_t(r0 * stride) * dtype_size(x.dtype());
  widen_block(base, x.dtype(), stride, rows, x.size(1), dst);
}

bool unit_rows(const Tensor& x) { return x.size(1) <= 1 || x.strides()[1] == 1; }

// Runs body(piece, thread) for each piece in one parallel region; the first exception is rethrown
// after it (an exception cannot leave an OpenMP region). Pieces go to whichever thread is free
// (values do not depend on which thread runs a piece): a thread that starts late, e.g. a sleeping
// worker's wake-up under OMP_WAIT_POLICY=passive, or runs slower on a shared host takes fewer.
// In the gpt's amp-bf16 step (Emerald Rapids guest) the threads' busy times differed by 10-20%
// with each thread's share fixed beforehand, 6-7% this way (default wait policy).
template <class Body>
void each_piece(int64_t pieces, int threads, Body body) {
  std::exception_ptr err;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t p = 0; p < pieces; ++p) {
    try {
      body(p, omp_get_thread_num());
    } catch (...) {
#pragma omp critical(mixprec_matmul_widened)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

// The one-thread products of the pieces, one for the common size of the split dimension (m or k)
// and one for the last piece's, and one allocation holding each thread's `bytes` of buffers, then
// the larger of the two products' scratchpads.
class PieceProducts {
 public:
  PieceProducts(const MatmulArgs& common, const MatmulArgs& last, int64_t common_size, size_t bytes, int threads)
      : common_(common), last_(last), common_size_(common_size), bytes_(bytes) {
    if (!ok()) return;
    pad_ = aligned(std::max(common_.scratchpad_bytes(), last_.scratchpad_bytes()));
    buffers_ = WorkspaceBuffer((bytes_ + pad_) * size_t(threads));
    profile::detail::note_impl(common_.impl());
  }
  bool ok() const { return common_.ok() && last_.ok(); }
  // Thread `thread`'s buffers (`bytes` of them).
  char* mine(int thread) const { return static_cast<char*>(buffers_.data()) + (bytes_ + pad_) * size_t(thread); }
  // A piece's product, on thread `thread`'s scratchpad.
  void run(int64_t piece_size, int thread, const void* src, const void* wei, void* dst, const void* bias) const {
    (piece_size == common_size_ ? common_ : last_).run(src, wei, dst, bias, mine(thread) + bytes_);
  }

 private:
  OneThreadMatmul common_, last_;
  int64_t common_size_;
  size_t bytes_, pad_ = 0;
  WorkspaceBuffer buffers_;
};

// Forward and input gradient: blocks of rows of a (and of dst); b widened once, shared.
bool by_rows(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o, int threads) {
  const DType t = a.dtype();
  const int64_t m = dst.size(0), n = dst.size(1), k = a.size(1);
  const Pieces split = pieces_of(m, k + n, threads);
  const int64_t rows = split.size, blocks = split.count, last = split.last;
  const bool dst32 = dst.dtype() == DType::f32;
  const Tensor bias32 = o.bias ? kernels::cast(*o.bias, DType::f32) : Tensor();

  MatmulArgs args;
  args.m = rows, args.n = n, args.k = k;
  args.src = &placeholder, args.src_stride_m = k, args.src_stride_k = 1;
  args.wei = &placeholder, args.wei_stride_k = o.trans_b ? 1 : n, args.wei_stride_n = o.trans_b ? k : 1;
  args.dst = &placeholder, args.dst_stride_m = n;
  args.bias = o.bias ? bias32.data_ptr() : nullptr;
  args.relu = o.relu, args.accumulate = o.accumulate;
  // b widened once, shared, as [n, k] (b^T's rows) where the pieces' product is oneDNN's packing
  // gemm:jit (hosts without AVX-512, whose f32 matmuls all run it): its one-thread product on a
  // [k, n] b ran at about half its rate there. `bf16_road_probe widened`, AMD Zen 3, 2 cores
  // (2026-12-06): the f32 road in blocks against the product on f32 operands, b [k, n] then [n, k]:
  // 1024^3 2.10x -> 1.32x, 1024 x 512 x 512 1.71x -> 1.18x, 2048 x 1024 x 1024 1.91x -> 1.18x;
  // 4096 x 512 x 128 1.11x both. Elsewhere b keeps its shape.
  const WidenedB how = g_b.load(std::memory_order_relaxed);
  const bool b_rows = o.trans_b || how == WidenedB::rows ||
                      (how == WidenedB::host_rule && OneThreadMatmul(args).impl().rfind("gemm:", 0) == 0);
  const Tensor b32 = kernels::cast(b_rows && !o.trans_b ? b.t() : b, DType::f32);  // contiguous
  args.wei = b32.data_ptr();
  args.wei_stride_k = b_rows ? 1 : n, args.wei_stride_n = b_rows ? k : 1;
  MatmulArgs last_args = args;
  last_args.m = last;
  // Each thread's buffers: widened a, and the f32 result unless dst is f32.
  const size_t a_bytes = aligned(size_t(rows * k) * 4), d_bytes = dst32 ? 0 : aligned(size_t(rows * n) * 4);
  const PieceProducts products(args, last_args, rows, a_bytes + d_bytes, threads);
  if (!products.ok()) return false;

  each_piece(blocks, threads, [&](int64_t blk, int thread) {
    char* mine = products.mine(thread);
    auto* a32 = reinterpret_cast<float*>(mine);
    const int64_t r0 = blk * rows, nrows = blk == blocks - 1 ? last : rows;
    widen_rows(a, r0, nrows, a32);
    char* out = static_cast<char*>(dst.data_ptr()) + size_t(r0 * n) * dtype_size(dst.dtype());
    float* d32 = dst32 ? reinterpret_cast<float*>(out) : reinterpret_cast<float*>(mine + a_bytes);
    if (o.accumulate && !dst32) widen(out, t, d32, nrows * n);
    products.run(nrows, thread, a32, b32.data_ptr(), d32, args.bias);
    if (!dst32) convert(d32, DType::f32, out, t, size_t(nrows * n));
  });
  return true;
}

// Blocks of columns of dst (and of b); a widened once, shared. For products whose b is the larger
// operand (a layer's weight against a batch of a few hundred rows: the mlps' forward, input
// gradient and weight gradient): by_rows would widen all of b through memory and have every thread
// read all of it back, where here each thread widens only its own columns of b, into its cache.
bool by_cols(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o, int threads) {
  const DType t = a.dtype();
  const int64_t m = dst.size(0), n = dst.size(1), k = o.trans_a ? a.size(0) : a.size(1);
  const Pieces split = pieces_of(n, k + m, threads);
  const int64_t cols = split.size, blocks = split.count, last = split.last;
  const bool dst32 = dst.dtype() == DType::f32;
  const Tensor a32 = kernels::cast(a, DType::f32);  // contiguous in a's own shape
  const Tensor bias32 = o.bias ? kernels::cast(*o.bias, DType::f32) : Tensor();

  // b's block: rows n0.. of b^T ([cols, k]) or columns n0.. of b ([k, cols]), dense.
  const auto make_args = [&](int64_t nc) {
    MatmulArgs args;
    args.m = m, args.n = nc, args.k = k;
    args.src = a32.data_ptr();
    args.src_stride_m = o.trans_a ? 1 : k, args.src_stride_k = o.trans_a ? m : 1;
    args.wei = &placeholder;
    args.wei_stride_k = o.trans_b ? 1 : nc, args.wei_stride_n = o.trans_b ? k : 1;
    args.dst = &placeholder, args.dst_stride_m = dst32 ? n : nc;
    args.bias = o.bias ? bias32.data_ptr() : nullptr;
    args.relu = o.relu, args.accumulate = o.accumulate;
    return args;
  };
  // Each thread's buffers: b's block widened, and the f32 result unless dst is f32.
  const size_t b_bytes = aligned(size_t(cols * k) * 4), d_bytes = dst32 ? 0 : aligned(size_t(m * cols) * 4);
  const PieceProducts products(make_args(cols), make_args(last), cols, b_bytes + d_bytes, threads);
  if (!products.ok()) return false;

  each_piece(blocks, threads, [&](int64_t blk, int thread) {
    char* mine = products.mine(thread);
    auto* b32 = reinterpret_cast<float*>(mine);
    const int64_t n0 = blk * cols, nc = blk == blocks - 1 ? last : cols;
    if (o.trans_b)
      widen_rows(b, n0, nc, b32);
    else
      widen_block(static_cast<const char*>(b.data_ptr()) + size_t(n0) * dtype_size(t), t, b.strides()[0], k, nc, b32);
    char* out = static_cast<char*>(dst.data_ptr()) + size_t(n0) * dtype_size(dst.dtype());
    float* d32 = dst32 ? reinterpret_cast<float*>(out) : reinterpret_cast<float*>(mine + b_bytes);
    if (o.accumulate && !dst32) widen_block(out, t, n, m, nc, d32);
    const float* bias = o.bias ? static_cast<const float*>(bias32.data_ptr()) + n0 : nullptr;
    products.run(nc, thread, a32.data_ptr(), b32, d32, bias);
    if (!dst32) round_block(d32, m, nc, out, n, t);
  });
  return true;
}

// A weight gradient's one-thread product on widened chunks: dst [m, n] (row stride ld) from a
// chunk's k rows of a ([k, m], read transposed) and of b ([k, n]), both dense f32.
MatmulArgs weight_grad_args(int64_t m, int64_t n, int64_t k, int64_t ld, bool accumulate) {
  MatmulArgs args;
  args.m = m, args.n = n, args.k = k;
  args.src = &placeholder, args.src_stride_m = 1, args.src_stride_k = m;
  args.wei = &placeholder, args.wei_stride_k = n, args.wei_stride_n = 1;
  args.dst = &placeholder, args.dst_stride_m = ld;
  args.accumulate = accumulate;
  return args;
}

// by_chunks_into_columns's split: dst's columns in shares, the shared dimension in chunks; and
// the bytes of its buffers, all threads'.
struct ColumnSplit {
  Pieces shares, chunks;
  size_t a_bytes, b_bytes, d_bytes;
  size_t bytes(int threads) const { return (a_bytes + b_bytes + d_bytes) * size_t(threads); }
};
ColumnSplit column_split(int64_t m, int64_t n, int64_t k, bool dst32, int threads) {
  ColumnSplit c;
  c.shares = pieces_of(n, 1, threads);  // about n / threads columns each (whole 16s)
  const int64_t cols = c.shares.size;
  c.chunks = pieces_of(k, m + cols, 1);
  c.a_bytes = aligned(size_t(c.chunks.size * m) * 4), c.b_bytes = aligned(size_t(c.chunks.size * cols) * 4);
  c.d_bytes = dst32 ? 0 : aligned(size_t(m * cols) * 4);
  return c;
}

// Weight gradient (op(a) = a^T, k the batch) where a partial sum per chunk of the shared dimension
// would outweigh the operands (by_chunks): dst's columns in a share per thread, each share running
// over every chunk and adding each chunk's product into its own columns, of dst itself where dst
// is f32 (AMP's gradients of f32 master weights; zeroed first unless accumulating), else of an
// f32 block of the share's, rounded once into dst at the end. A share widens the chunk's rows of a
// whole and its own columns of b's. The chunks are added in order in each column, whichever thread
// runs a share. Before, these shapes took the whole-tensor road, which widened both operands, 8
// bytes per batch row and hidden unit: amp-bf16's largest batch of the mlp 1024,1024 under 64 MiB
// was 0.88x fp32's, now 1.66x (`max-batch`, Emerald Rapids guest without AMX).
// `cs`: column_split's for these sizes, dst's dtype and `threads` (by_chunks judged by it).
bool by_chunks_into_columns(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o, int threads,
                            const ColumnSplit& cs) {
  const DType t = a.dtype();
  const int64_t m = dst.size(0), n = dst.size(1);
  const bool dst32 = dst.dtype() == DType::f32;
  const Pieces shares = cs.shares, split = cs.chunks;
  const int64_t cols = shares.size, chunk = split.size, chunks = split.count;
  const auto make_args = [&](int64_t width, int64_t nk) {
    return weight_grad_args(m, width, nk, dst32 ? n : width, /*accumulate=*/true);
  };
  // Each thread's buffers: the chunk's rows of a and its share of b's, widened, and the share's f32
  // block unless dst is f32.
  const size_t a_bytes = cs.a_bytes, b_bytes = cs.b_bytes;
  const PieceProducts wide(make_args(cols, chunk), make_args(cols, split.last), chunk, a_bytes + b_bytes + cs.d_bytes,
                           threads);
  if (!wide.ok()) return false;
  std::optional<PieceProducts> narrow;  // the last share's, where it is narrower
  if (shares.last != cols) {
    narrow.emplace(make_args(shares.last, chunk), make_args(shares.last, split.last), chunk, 0, threads);
    if (!narrow->ok()) return false;
  }
  if (dst32 && !o.accumulate) std::fill_n(static_cast<float*>(dst.data_ptr()), m * n, 0.f);
  const auto* b_base = static_cast<const char*>(b.data_ptr());
  const int64_t ldb = b.strides()[0];
  const size_t es = dtype_size(dst.dtype());
  each_piece(shares.count, threads, [&](int64_t share, int thread) {
    char* mine = wide.mine(thread);
    auto* a32 = reinterpret_cast<float*>(mine);
    auto* b32 = reinterpret_cast<float*>(mine + a_bytes);
    const int64_t n0 = share * cols, width = share == shares.count - 1 ? shares.last : cols;
    const PieceProducts& products = width == cols ? wide : *narrow;
    char* out = static_cast<char*>(dst.data_ptr()) + size_t(n0) * es;
    float* d32 = dst32 ? reinterpret_cast<float*>(out) : reinterpret_cast<float*>(mine + a_bytes + b_bytes);
    if (!dst32 && o.accumulate) widen_block(out, t, n, m, width, d32);
    if (!dst32 && !o.accumulate) std::fill_n(d32, m * width, 0.f);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k0 = c * chunk, nk = c == chunks - 1 ? split.last : chunk;
      widen_rows(a, k0, nk, a32);
      widen_block(b_base + size_t(k0 * ldb + n0) * dtype_size(t), t, ldb, nk, width, b32);
      products.run(nk, thread, a32, b32, d32, nullptr);
    }
    if (!dst32) round_block(d32, m, width, out, n, t);
  });
  return true;
}

// Weight gradient (op(a) = a^T, k the batch): chunks of the shared dimension, rows of both
// operands; each chunk's f32 product is a partial sum, and the partials are added in chunk order.
// Where the partials would outweigh the operands they save widening whole, by_chunks_into_columns
// if `into_columns` (by_cols takes a b wider than a: it widens a, the smaller, whole).
bool by_chunks(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o, int threads, bool into_columns) {
  const int64_t m = dst.size(0), n = dst.size(1), k = a.size(0);
  const Pieces split = pieces_of(k, m + n, threads);
  const int64_t chunk = split.size, chunks = split.count, last = split.last;
  if (chunks < 2) return false;
  // The partials must stay smaller than the operands they replace in memory. Else by columns where
  // its buffers are under half the whole-tensor road's widened operands, which is faster where the
  // two hold about as much (the mlp's 1024 x 1024 at a batch of 512: 7% in `bench/ab.py`); else
  // that road.
  if (chunks * m * n > k * (m + n) / 2) {
    if (!into_columns) return false;
    const ColumnSplit cs = column_split(m, n, k, dst.dtype() == DType::f32, threads);
    if (2 * cs.bytes(threads) >= size_t(k * (m + n)) * 4) return false;
    return by_chunks_into_columns(a, b, dst, o, threads, cs);
  }

  const size_t a_bytes = aligned(size_t(chunk * m) * 4), b_bytes = aligned(size_t(chunk * n) * 4);
  const size_t part_bytes = aligned(size_t(m * n) * 4);
  WorkspaceBuffer partials(part_bytes * size_t(chunks));
  const PieceProducts products(weight_grad_args(m, n, chunk, n, false), weight_grad_args(m, n, last, n, false), chunk,
                               a_bytes + b_bytes, threads);
  if (!products.ok()) return false;

  each_piece(chunks, threads, [&](int64_t c, int thread) {
    char* mine = products.mine(thread);
    auto* a32 = reinterpret_cast<float*>(mine);
    auto* b32 = reinterpret_cast<float*>(mine + a_bytes);
    const int64_t k0 = c * chunk, nk = c == chunks - 1 ? last : chunk;
    widen_rows(a, k0, nk, a32);
    widen_rows(b, k0, nk, b32);
    products.run(nk, thread, a32, b32, static_cast<char*>(partials.data()) + part_bytes * size_t(c), nullptr);
  });

  // dst = (accumulate ? dst : 0) + the partials in chunk order, rounded once into dst's dtype.
  constexpr int64_t kTile = 1024;
  const int64_t total = m * n, tiles = ceil_div(total, kTile);
  const auto* part = static_cast<const char*>(partials.data());
  char* out = static_cast<char*>(dst.data_ptr());
  const size_t es = dtype_size(dst.dtype());
  const int sum_threads = detail::parallel_worth(total * chunks, int64_t(1) << 18) ? threads : 1;
  each_piece(tiles, sum_threads, [&](int64_t tile, int) {
    float sum[kTile];
    const int64_t i0 = tile * kTile, len = std::min(kTile, total - i0);
    if (o.accumulate)
      convert(out + size_t(i0) * es, dst.dtype(), sum, DType::f32, size_t(len));
    else
      std::fill(sum, sum + len, 0.f);
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = reinterpret_cast<const float*>(part + part_bytes * size_t(c)) + i0;
      for (int64_t i = 0; i < len; ++i) sum[i] += p[i];
    }
    convert(sum, DType::f32, out + size_t(i0) * es, dst.dtype(), size_t(len));
  });
  return true;
}

}  // namespace

bool set_matmul_widened(bool on) { return g_on.exchange(on); }
bool set_matmul_widened_columns(bool on) { return g_columns.exchange(on); }
WidenedB set_matmul_widened_b(WidenedB how) { return g_b.exchange(how); }

bool matmul_widened(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const DType t = a.dtype();
  if (!g_on.load(std::memory_order_relaxed) || (t != DType::bf16 && t != DType::f16) || b.dtype() != t ||
      a.dim() != 2 || b.dim() != 2 || dst.dim() != 2 || !dst.is_contiguous() ||
      (dst.dtype() != t && dst.dtype() != DType::f32))
    return false;
  if (o.bias && o.bias->dtype() != DType::f32 && o.bias->dtype() != t) return false;
  const int64_t m = dst.size(0), n = dst.size(1), k = o.trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0 || k == 0 || 2.0 * double(m) * double(k) * double(n) < kMinFlops) return false;
  const int threads = std::max(1, omp_get_max_threads());
  const bool columns = n > m && unit_rows(b) && g_columns.load(std::memory_order_relaxed);
  if (o.trans_a && !o.trans_b && !o.bias && !o.relu && unit_rows(a) && unit_rows(b) &&
      by_chunks(a, b, dst, o, threads, !columns))
    return true;
  if (columns && by_cols(a, b, dst, o, threads)) return true;
  if (!o.trans_a && unit_rows(a) && m >= 32) return by_rows(a, b, dst, o, threads);
  return false;
}

}  // namespace mixprec::kernels::cpu
