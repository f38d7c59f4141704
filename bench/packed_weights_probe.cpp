// Timing probe (not a test): oneDNN's bf16 matmul with the weights operand as mixprec passes it
// (plain, `ab` or its transpose `ba`) against the blocked layout oneDNN picks for
// format_tag::any (packed once, before the timing), on the mlp's and the gpt's product shapes.
// What a packed copy of the weights would buy a product; docs/hosts.md (2026-12-01) says why the
// training step does not keep one.
//
//   cmake --build build --target packed_weights_probe
//   OMP_NUM_THREADS=2 build/packed_weights_probe [reps=60]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <dnnl.hpp>

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Shape {
  memory::dim m, k, n;
  const char* what;
};

// Best seconds of one bf16 product src [m, k] (src_tag) @ wei [k, n] (wei_tag) -> dst [m, n] ab.
double best_seconds(dnnl::engine& eng, dnnl::stream& s, const Shape& sh, Tag src_tag, Tag wei_tag, int reps,
                    const char** impl) {
  const memory::desc src_md({sh.m, sh.k}, memory::data_type::bf16, src_tag);
  const memory::desc wei_md({sh.k, sh.n}, memory::data_type::bf16, wei_tag);
  const memory::desc dst_md({sh.m, sh.n}, memory::data_type::bf16, Tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), eng);
  memory src(src_md, eng), wei(pd.weights_desc(), eng), dst(dst_md, eng);
  // 1.0 and 1.0/2 in bf16: finite values whose products never overflow (the layout does not care).
  std::fill_n(static_cast<uint16_t*>(src.get_data_handle()), src_md.get_size() / 2, uint16_t(0x3F80));
  std::fill_n(static_cast<uint16_t*>(wei.get_data_handle()), pd.weights_desc().get_size() / 2, uint16_t(0x3F00));
  const dnnl::matmul prim(pd);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = seconds();
    prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    s.wait();
    if (r >= std::min(6, reps - 1)) best = std::min(best, seconds() - t0);  // the first runs warm up
  }
  *impl = pd.impl_info_str();
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 60;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  // The mlp's (784-1024-1024-10 at batch 512) forward, input-gradient and weight-gradient shapes,
  // and the gpt's forward products (32 x 128 tokens, d_model 128).
  const std::vector<Shape> shapes = {{512, 784, 1024, "mlp fc1 forward"},
                                     {512, 1024, 1024, "mlp fc2 forward"},
                                     {512, 1024, 784, "mlp fc2 dx"},
                                     {1024, 512, 784, "mlp fc1 dW"},
                                     {4096, 128, 384, "gpt c_attn forward"},
                                     {4096, 128, 512, "gpt c_fc forward"},
                                     {4096, 512, 128, "gpt mlp c_proj forward"}};
  struct Variant {
    Tag src, wei;
    const char* name;
  };
  const Variant variants[] = {
      {Tag::ab, Tag::ab, "wei ab"}, {Tag::ab, Tag::ba, "wei ba"}, {Tag::ab, Tag::any, "wei packed"}};
  for (const Shape& sh : shapes)
    for (const Variant& v : variants) {
      const char* impl = "";
      const double t = best_seconds(eng, s, sh, v.src, v.wei, reps, &impl);
      std::printf(
          "{\"bench\":\"packed_weights\",\"shape\":\"%s\",\"m\":%ld,\"k\":%ld,\"n\":%ld,\"variant\":\"%s\","
          "\"ms_best\":%.4f,\"gflops\":%.0f,\"impl\":\"%s\"}\n",
          sh.what, long(sh.m), long(sh.k), long(sh.n), v.name, t * 1e3, 2.0 * double(sh.m * sh.k * sh.n) / t / 1e9,
          impl);
    }
  return 0;
}
