// CUDA kernel of the random family (random.h): dropout's mask from the Philox words of one use of
// the generator, element i from word i with core/philox.h's code, as the CPU's reference
// (kernels/ref/random.cpp), so a seed gives the same mask bits on both devices.
#include "core/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/random.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cuda {
namespace {

// One thread per Philox block: elements 4b .. 4b+3 from the words of block first + b, where in a
// CUDA graph (graph_base not null) `first` is relative to the replay's base block on the device. `keep`
// and `zero` are the two mask values, already rounded to the dtype on the host (U: the unsigned
// integer of the element's size), so the bits are the CPU's.
template <class U>
__global__ void dropout_mask_kernel(U* dst, int64_t n, uint64_t seed, uint64_t stream, const uint64_t* graph_base,
                                    uint64_t first, double p, U keep, U zero) {
  const int64_t blocks = (n + 3) / 4;
  if (graph_base != nullptr) first += *graph_base;
  for (int64_t b = global_thread(); b < blocks; b += grid_threads()) {
    const detail::PhiloxWords w = detail::philox_block(seed, stream, first + uint64_t(b));
    const int64_t base = b * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (base + j < n) dst[base + j] = detail::dropout_drops(w.w[j], p) ? zero : keep;
  }
}

template <class U>
void launch_dropout(Tensor& mask, double p, uint64_t seed, uint64_t stream, const uint64_t* base, uint64_t first,
                    double keep_scale) {
  U keep{}, zero{};
  const double z = 0.0;
  convert(&keep_scale, DType::f64, &keep, mask.dtype(), 1);
  convert(&z, DType::f64, &zero, mask.dtype(), 1);
  const int64_t n = mask.numel();
  const Launch on(mask);
  dropout_mask_kernel<U><<<blocks_for((n + 3) / 4), kThreads, 0, on.stream()>>>(
      static_cast<U*>(mask.data_ptr()), n, seed, stream, base, first, p, keep, zero);
  MIXPREC_CUDA_CHECK_LAUNCH();
}

}  // namespace

Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen) {
  MIXPREC_CHECK(is_floating(dtype), "dropout: ", dtype_name(dtype), " is not a floating dtype");
  Tensor mask = Tensor::empty(shape, dtype);
  // In a CUDA graph the replay's offset lives on the device (registered before the reservation);
  // the reservation advances the host's offset as on the CPU.
  const mixprec::cuda::detail::CapturedOffset graph =
      mixprec::cuda::detail::captured_offset(mixprec::cuda::detail::stream_of(mask), gen, "dropout");
  const int64_t n = mask.numel();
  uint64_t first = gen.reserve(uint64_t(n));
  if (graph.base != nullptr) first -= graph.start;
  if (n == 0) return mask;
  const double keep_scale = 1.0 / (1.0 - p);  // inverted dropout, rounded once to dtype (as the CPU)
  switch (dtype_size(dtype)) {
    case 2:
      launch_dropout<uint16_t>(mask, p, gen.seed(), gen.stream(), graph.base, first, keep_scale);
      break;
    case 4:
      launch_dropout<uint32_t>(mask, p, gen.seed(), gen.stream(), graph.base, first, keep_scale);
      break;
    default:
      launch_dropout<uint64_t>(mask, p, gen.seed(), gen.stream(), graph.base, first, keep_scale);
      break;
  }
  return mask;
}

}  // namespace mixprec::kernels::cuda
