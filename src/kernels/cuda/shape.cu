// CUDA kernels of the shape family (shape.h): copies between any strides and any dtypes (the
// CPU's conversion rules: common.cuh convert_to), a plain cudaMemcpyAsync where both sides are
// contiguous of one dtype; and fill.
#include "kernels/cuda/common.cuh"
#include "mixprec/convert.h"

namespace mixprec::kernels::cuda {
namespace {

// Both contiguous: kVec source elements per load (16 bytes when aligned), the tail one by one.
template <class S, class D, int kVec>
__global__ void convert_contiguous_kernel(const S* src, D* dst, int64_t n) {
  const int64_t nv = n / kVec;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) {
    const Vec<S, kVec> in = reinterpret_cast<const Vec<S, kVec>*>(src)[i];
    Vec<D, kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.v[j] = convert_to<D>(in.v[j]);
    reinterpret_cast<Vec<D, kVec>*>(dst)[i] = out;
  }
  for (int64_t i = nv * kVec + global_thread(); i < n; i += grid_threads()) dst[i] = convert_to<D>(src[i]);
}

// A batch of transposes: dst [batch][rows][cols] contiguous from src, whose bytes are
// [batch][cols][rows] (the channels-last conversions, kernels/shape.cpp: rows = H*W, cols = C, or
// the other way). The strided kernel writes (or reads) one side C elements apart; here a 32 x 32
// tile is read along src's rows into shared memory and written along dst's, both coalesced.
constexpr int kTile = 32, kTileRows = 8;
template <class S, class D>
__global__ void transpose_kernel(const S* src, D* dst, int64_t rows, int64_t cols) {
  __shared__ S tile[kTile][kTile + 1];  // +1: the column reads fall in distinct banks
  const int64_t r0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile, b = blockIdx.z;
  src += b * rows * cols;
  dst += b * rows * cols;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;
    if (c < cols && r < rows) tile[j][threadIdx.x] = src[c * rows + r];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) dst[r * cols + c] = convert_to<D>(tile[threadIdx.x][j]);
  }
}

// Whether src -> dst is a batch of transposes transpose_kernel takes: dst contiguous [batch,
// rows, cols], src of that shape with strides [rows * cols, 1, rows], within the grid's limits.
bool batched_transpose(const Tensor& src, const Tensor& dst) {
  if (dst.dim() != 3 || !dst.is_contiguous() || src.shape() != dst.shape()) return false;
  const int64_t b = dst.size(0), rows = dst.size(1), cols = dst.size(2);
  const Shape& st = src.strides();
  return rows > 1 && cols > 1 && st[1] == 1 && st[2] == rows && (b == 1 || st[0] == rows * cols) && b <= 65535 &&
         (cols + kTile - 1) / kTile <= 65535 && (rows + kTile - 1) / kTile <= int64_t(INT32_MAX);
}

// Any strides: operand 0 is dst, 1 is src.
template <class S, class D>
__global__ void convert_strided_kernel(const S* src, D* dst, Strided<2> ix, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = convert_to<D>(src[off[1]]);
  }
}

// Writes the element `value` (its bytes, already in dst's dtype) everywhere: U is the unsigned
// integer of the element's size.
template <class U, int kVec>
__global__ void fill_contiguous_kernel(U* dst, U value, int64_t n) {
  const int64_t nv = n / kVec;
  Vec<U, kVec> v;
#pragma unroll
  for (int j = 0; j < kVec; ++j) v.v[j] = value;
  for (int64_t i = global_thread(); i < nv; i += grid_threads()) reinterpret_cast<Vec<U, kVec>*>(dst)[i] = v;
  for (int64_t i = nv * kVec + global_thread(); i < n; i += grid_threads()) dst[i] = value;
}

template <class U>
__global__ void fill_strided_kernel(U* dst, U value, Strided<1> ix, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = value;
  }
}

template <class U>
void launch_fill(Tensor& dst, const unsigned char* bytes, cudaStream_t stream) {
  U value;
  std::memcpy(&value, bytes, sizeof(U));
  U* d = static_cast<U*>(dst.data_ptr());
  const int64_t n = dst.numel();
  if (dst.is_contiguous() && aligned_to(d, 16)) {
    constexpr int kV = kVec16<U>;
    fill_contiguous_kernel<U, kV><<<blocks_for(n / kV), kThreads, 0, stream>>>(d, value, n);
  } else if (dst.is_contiguous()) {
    fill_contiguous_kernel<U, 1><<<blocks_for(n), kThreads, 0, stream>>>(d, value, n);
  } else {
    fill_strided_kernel<U>
        <<<blocks_for(n), kThreads, 0, stream>>>(d, value, make_strided<1>(dst.shape(), {dst.strides()}, "fill"), n);
  }
  MIXPREC_CUDA_CHECK_LAUNCH();
}

}  // namespace

void copy(const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Launch on(dst);
  const bool contiguous = src.is_contiguous() && dst.is_contiguous();
  if (contiguous && src.dtype() == dst.dtype()) {
    if (src.data_ptr() != dst.data_ptr())
      MIXPREC_CUDA_CHECK(
          cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, on.stream()));
    return;
  }
  dispatch_any(src.dtype(), [&](auto stag) {
    dispatch_any(dst.dtype(), [&](auto dtag) {
      using S = decltype(stag);
      using D = decltype(dtag);
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      constexpr int kV = kVec16<S>;
      if (!contiguous && batched_transpose(src, dst)) {
        const int64_t rows = dst.size(1), cols = dst.size(2);
        const dim3 grid(unsigned((rows + kTile - 1) / kTile), unsigned((cols + kTile - 1) / kTile),
                        unsigned(dst.size(0)));
        transpose_kernel<S, D><<<grid, dim3(kTile, kTileRows), 0, on.stream()>>>(s, d, rows, cols);
      } else if (contiguous && aligned_to(s, 16) && aligned_to(d, sizeof(D) * kV)) {
        convert_contiguous_kernel<S, D, kV><<<blocks_for(n / kV), kThreads, 0, on.stream()>>>(s, d, n);
      } else if (contiguous) {
        convert_contiguous_kernel<S, D, 1><<<blocks_for(n), kThreads, 0, on.stream()>>>(s, d, n);
      } else {
        const auto ix = make_strided<2>(dst.shape(), {dst.strides(), src.strides()}, "copy");
        convert_strided_kernel<S, D><<<blocks_for(n), kThreads, 0, on.stream()>>>(s, d, ix, n);
      }
      MIXPREC_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  // One element converted on the host with the scalar conversion (the CPU's fill does the same),
  // then replicated.
  alignas(8) unsigned char one[8] = {};
  convert(&value, DType::f64, one, dst.dtype(), 1);
  const size_t es = dtype_size(dst.dtype());
  const Launch on(dst);
  bool zero = true;
  for (size_t i = 0; i < es; ++i) zero = zero && one[i] == 0;
  if (zero && dst.is_contiguous()) {
    MIXPREC_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), on.stream()));
    return;
  }
  switch (es) {
    case 1:
      return launch_fill<uint8_t>(dst, one, on.stream());
    case 2:
      return launch_fill<uint16_t>(dst, one, on.stream());
    case 4:
      return launch_fill<uint32_t>(dst, one, on.stream());
    default:
      return launch_fill<uint64_t>(dst, one, on.stream());
  }
}

}  // namespace mixprec::kernels::cuda
