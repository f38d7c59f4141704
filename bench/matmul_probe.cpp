// Timing probe (not a test) for a linear layer's three training matmuls, f32 vs bf16, interleaved
// so that machine-wide speed swings hit every variant alike. Default: the MLP's layers at batch 512;
// the third argument names other layers as IN x OUT pairs (the GPT's: 128x384,128x128,128x512,512x128 at
// batch 4096 = 32 x 128 tokens; bench/compare.py --model gpt builds and runs it so).
//
//   cmake --build build --target matmul_probe
//   OMP_NUM_THREADS=2 build/matmul_probe [reps=20] [batch=512] [layers=784x1024,1024x1024,1024x10]
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/dnnl_matmul.h"
#include "mixprec/allocator.h"

using namespace mixprec;
using namespace mixprec::kernels::cpu;

namespace {

// 64-byte aligned bytes from the allocator, filled with values in [-1, 1) of the given dtype.
struct Block {
  void* ptr;
  size_t bytes;
  Block(int64_t elems, DType t, std::mt19937& rng) : bytes(size_t(elems) * dtype_size(t)) {
    ptr = allocator::allocate(bytes, MemCategory::other);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (int64_t i = 0; i < elems; ++i) {
      const float v = uni(rng);
      if (t == DType::f32) {
        static_cast<float*>(ptr)[i] = v;
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        static_cast<uint16_t*>(ptr)[i] = uint16_t(u >> 16);  // truncation is fine for timing
      }
    }
  }
  ~Block() { allocator::deallocate(ptr, bytes, MemCategory::other); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

struct Variant {
  const char* name;
  DType in_t, dst_t;
};
// bf16->f32 is the weight gradient written straight into an fp32 .grad (no cast afterwards).
constexpr Variant kVariants[] = {
    {"f32", DType::f32, DType::f32}, {"bf16", DType::bf16, DType::bf16}, {"bf16->f32", DType::bf16, DType::f32}};
constexpr int kNumVariants = 3;

enum class Product { forward, grad_x, grad_w };
const char* product_name(Product p) {
  switch (p) {
    case Product::forward:
      return "y = x @ W^T";
    case Product::grad_x:
      return "gx = gy @ W";
    case Product::grad_w:
      return "gW = gy^T @ x";
  }
  return "?";
}

// One product of a linear layer y[B,out] = x[B,in] @ W[out,in]^T, in PyTorch's layouts.
MatmulArgs product_args(Product p, int64_t batch, int64_t in, int64_t out, const Variant& v, const void* x,
                        const void* w, const void* gy, void* dst) {
  MatmulArgs a;
  a.src_t = a.wei_t = v.in_t;
  a.dst_t = v.dst_t;
  a.dst = dst;
  switch (p) {
    case Product::forward:  // src x [B,in], wei W^T: [in,out] view of W [out,in]
      a.m = batch, a.n = out, a.k = in;
      a.src = x, a.src_stride_m = in, a.src_stride_k = 1;
      a.wei = w, a.wei_stride_k = 1, a.wei_stride_n = in;
      a.dst_stride_m = out;
      break;
    case Product::grad_x:  // src gy [B,out], wei W [out,in]
      a.m = batch, a.n = in, a.k = out;
      a.src = gy, a.src_stride_m = out, a.src_stride_k = 1;
      a.wei = w, a.wei_stride_k = in, a.wei_stride_n = 1;
      a.dst_stride_m = in;
      break;
    case Product::grad_w:  // src gy^T: [out,B] view of gy [B,out], wei x [B,in]
      a.m = out, a.n = in, a.k = batch;
      a.src = gy, a.src_stride_m = 1, a.src_stride_k = out;
      a.wei = x, a.wei_stride_k = in, a.wei_stride_n = 1;
      a.dst_stride_m = in;
      break;
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = std::max(1, argc > 1 ? std::atoi(argv[1]) : 20);
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 512;
  // (in, out) of each layer, the MLP's by default.
  const char* spec = argc > 3 ? argv[3] : "784x1024,1024x1024,1024x10";
  std::vector<std::array<int64_t, 2>> layers;
  for (const char* p = spec; *p;) {
    char* end = nullptr;
    const long long in = std::strtoll(p, &end, 10);
    const long long out = *end == 'x' ? std::strtoll(end + 1, &end, 10) : 0;
    if (in <= 0 || out <= 0 || (*end != ',' && *end != 0)) {
      std::fprintf(stderr, "matmul_probe: bad layer list '%s' at '%s': expected INxOUT[,INxOUT...]\n", spec, p);
      return 2;
    }
    layers.push_back({in, out});
    p = *end ? end + 1 : end;
  }
  const Product products[] = {Product::forward, Product::grad_x, Product::grad_w};
  std::printf("oneDNN ISA %s, avx512_bf16 %d, amx_bf16 %d, OpenMP threads %d, batch %lld, %d reps\n",
              dnnl_isa_name().c_str(), has_avx512_bf16(), has_amx_bf16(), omp_get_max_threads(),
              static_cast<long long>(batch), reps);
  if (!matmul_has_bf16()) {  // an AVX2 host: oneDNN 2.6's bf16 kernels all need AVX-512
    std::printf("matmul_probe: oneDNN has no bf16 matmul on this host (ISA %s): no bf16 ratio to measure\n",
                dnnl_isa_name().c_str());
    return 3;
  }

  struct Row {
    std::string label;
    double flops;
    MatmulArgs args[kNumVariants];
    std::vector<double> seconds[kNumVariants];
  };
  std::mt19937 rng(0);
  std::vector<std::unique_ptr<Block>> blocks;
  const auto block = [&](int64_t elems, DType t) {
    blocks.push_back(std::make_unique<Block>(elems, t, rng));
    return blocks.back()->ptr;
  };
  std::vector<Row> rows;
  for (const auto& layer : layers) {
    const int64_t in = layer[0], out = layer[1];
    for (Product p : products) {
      Row r;
      char label[64];
      std::snprintf(label, sizeof label, "%4lld->%-4lld %s", static_cast<long long>(in), static_cast<long long>(out),
                    product_name(p));
      r.label = label;
      r.flops = 2.0 * double(batch) * double(in) * double(out);
      for (int v = 0; v < kNumVariants; ++v) {
        const Variant& var = kVariants[v];
        void* dst = block(std::max(batch, out) * std::max(in, out), var.dst_t);
        r.args[v] = product_args(p, batch, in, out, var, block(batch * in, var.in_t), block(out * in, var.in_t),
                                 block(batch * out, var.in_t), dst);
      }
      rows.push_back(std::move(r));
    }
  }

  for (Row& r : rows)  // warm-up: creates every primitive (cache misses) outside the timing
    for (const MatmulArgs& a : r.args) matmul(a);
  for (int rep = 0; rep < reps; ++rep)
    for (Row& r : rows)
      for (int v = 0; v < kNumVariants; ++v) {
        const auto t0 = std::chrono::steady_clock::now();
        matmul(r.args[v]);
        r.seconds[v].push_back(seconds_since(t0));
      }

  std::printf("\n%-27s %-8s %9s %9s %9s  %s\n", "product", "dtype", "best GF/s", "med GF/s", "med ms", "impl");
  double step_ms[kNumVariants] = {};
  // Ratios are medians of per-rep ratios: each rep runs the variants back to back.
  const auto median_ratio = [&](const Row& r, int v) {
    std::vector<double> q;
    for (int i = 0; i < reps; ++i) q.push_back(r.seconds[0][size_t(i)] / r.seconds[v][size_t(i)]);
    std::sort(q.begin(), q.end());
    return q[q.size() / 2];
  };
  for (Row& r : rows) {
    const double ratio_bf16 = median_ratio(r, 1), ratio_bf16_f32 = median_ratio(r, 2);
    double median[kNumVariants];
    for (int v = 0; v < kNumVariants; ++v) {
      std::vector<double>& s = r.seconds[v];
      std::sort(s.begin(), s.end());
      median[v] = s[s.size() / 2];
      step_ms[v] += median[v] * 1e3;
      std::printf("%-27s %-9s %9.1f %9.1f %9.3f  %s\n", v == 0 ? r.label.c_str() : "", kVariants[v].name,
                  r.flops / s.front() * 1e-9, r.flops / median[v] * 1e-9, median[v] * 1e3,
                  matmul_impl_name(r.args[v]).c_str());
    }
    std::printf("%-27s speedup over f32: bf16 %.2fx, bf16->f32 %.2fx\n\n", "", ratio_bf16, ratio_bf16_f32);
  }
  std::printf("sum of medians (all %zu products): f32 %.2f ms, bf16 %.2f ms (%.2fx), bf16->f32 %.2f ms (%.2fx)\n",
              rows.size(), step_ms[0], step_ms[1], step_ms[0] / step_ms[1], step_ms[2], step_ms[0] / step_ms[2]);
  const CacheStats cs = matmul_cache_stats();
  std::printf("primitive cache: %lld created, %lld hits\n", static_cast<long long>(cs.misses),
              static_cast<long long>(cs.hits));
  return 0;
}
