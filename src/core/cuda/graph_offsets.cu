// The last kernel of a captured step that draws random numbers (cuda_util.h, captured_offset):
// advances the graph's Philox bases on the device by the blocks one replay uses, so the next replay
// draws the next words, as the next eager step would.
#include "core/cuda/cuda_util.h"

namespace mixprec::cuda::detail {
namespace {

struct Increments {
  uint64_t v[kMaxGraphGenerators];
};

__global__ void advance_kernel(uint64_t* base, Increments inc, int n) {
  const int i = int(threadIdx.x);
  if (i < n) base[i] += inc.v[i];
}

}  // namespace

void advance_graph_offsets(cudaStream_t stream, uint64_t* base, const uint64_t* inc, int n) {
  MIXPREC_CHECK(n >= 0 && n <= kMaxGraphGenerators, "advance_graph_offsets: ", n, " generators");
  Increments v{};
  for (int i = 0; i < n; ++i) v.v[i] = inc[i];
  advance_kernel<<<1, kMaxGraphGenerators, 0, stream>>>(base, v, n);
  MIXPREC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mixprec::cuda::detail
