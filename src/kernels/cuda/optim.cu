// CUDA kernels of the optimizer family (kernels/optim.h): multi-tensor launches (the pointers of
// up to kMaxTensors tensors and the (tensor, chunk) of each block packed into the kernel's
// argument, PyTorch's MultiTensorApply shape), 4 elements per thread with 16-byte loads of f32
// data where aligned, f32 math (f64 for f64 parameters and for norms). Every scalar that changes
// from step to step (scale, found_inf, step count, lr, norm) is read from device memory, so no
// launch waits for the host and a step can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "kernels/optim.h"

namespace mixprec::kernels::cuda {
namespace {

using mixprec::cuda::detail::DeviceGuard;
using mixprec::cuda::detail::stream_of;

constexpr int kThreads = 256;
constexpr int kIlp = 4;           // elements per thread per iteration
constexpr int64_t kChunk = 8192;  // elements per block: a 4M-parameter model fills an H100's 132 SMs
constexpr int kMaxTensors = 24;   // per launch: keeps the argument below 4 KiB
// Blocks per launch, bounded by the kernel argument's size: 4 KiB before CUDA 12.1, 32764 bytes
// since (on every architecture we build for, with a driver of 530 or later, which a 12.1 build
// needs anyway). 320 blocks of 8192 elements cover 2.6 M parameters: GPT-2 124M's AdamW step took
// 48 launches of 2.4 blocks an SM on an H200 (3.3 ms, about 1 TB/s); 2048 blocks fill an SM's
// 2048 threads eight blocks deep, in 8 launches.
#if CUDART_VERSION >= 12010
constexpr int kMaxBlocks = 2048;
constexpr size_t kMaxArgument = 32764;
#else
constexpr int kMaxBlocks = 320;
constexpr size_t kMaxArgument = 4096;
#endif

// ------------------------------------------------------------------------ element access

__device__ __forceinline__ float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return float(static_cast<const double*>(p)[i]);
  }
}
__device__ __forceinline__ double load_f64(const void* p, DType t, int64_t i) {
  return t == DType::f64 ? static_cast<const double*>(p)[i] : double(load_f32(p, t, i));
}
// Rounded to nearest even, once.
__device__ __forceinline__ void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DType::f16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<double*>(p)[i] = double(v);
  }
}
__device__ __forceinline__ void store_f64(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::f32:
      static_cast<float*>(p)[i] = float(v);
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v);
      break;
    default:
      static_cast<__half*>(p)[i] = __double2half(v);
  }
}

// Loads kIlp consecutive f32 values from [i, i + kIlp) of an f32 tensor in one 16-byte load when
// aligned and whole, element by element otherwise (any dtype).
__device__ __forceinline__ void load4(const void* p, DType t, int64_t i, int64_t n, bool aligned, float (&v)[kIlp]) {
  if (aligned && t == DType::f32 && i + kIlp <= n) {
    const float4 q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i)[0];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
  for (int k = 0; k < kIlp; ++k) v[k] = i + k < n ? load_f32(p, t, i + k) : 0.0f;
}
__device__ __forceinline__ void store4(void* p, DType t, int64_t i, int64_t n, bool aligned, const float (&v)[kIlp]) {
  if (aligned && t == DType::f32 && i + kIlp <= n) {
    reinterpret_cast<float4*>(static_cast<float*>(p) + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  for (int k = 0; k < kIlp; ++k)
    if (i + k < n) store_f32(p, t, i + k, v[k]);
}

// ------------------------------------------------------------------- multi-tensor packing

// Depth tensors per entry (e.g. param, grad, master, state1, state2), each with its dtype.
template <int Depth>
struct TensorList {
  void* ptr[Depth][kMaxTensors];
  DType dtype[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  const double* lr[kMaxTensors];  // optimizer entries: the group's lr
  double weight_decay[kMaxTensors];
  uint32_t index[kMaxTensors];  // the parameter index (stochastic-rounding stream, momentum flag)
  bool aligned[kMaxTensors];    // every pointer of the entry 16-byte aligned
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
  int32_t first_block;  // of this launch, over all launches of one call (partial sums)
};
static_assert(sizeof(TensorList<5>) <= kMaxArgument, "a kernel argument: 4 KiB before CUDA 12.1, 32764 bytes since");

// One entry of a multi-tensor call.
template <int Depth>
struct Entry {
  const Tensor* t[Depth];
  const double* lr = nullptr;
  double weight_decay = 0;
  uint64_t index = 0;
};

// Launches launch(list, blocks) over every chunk of every entry, as few launches as fit.
template <int Depth, class Launch>
void for_lists(const std::vector<Entry<Depth>>& entries, Launch&& launch) {
  TensorList<Depth> l{};
  int nt = 0, nb = 0, total_blocks = 0;
  auto flush = [&] {
    if (nb > 0) launch(l, nb);
    l.first_block = total_blocks;
    nt = nb = 0;
  };
  for (const Entry<Depth>& e : entries) {
    const int64_t n = e.t[0]->numel();
    if (n == 0) continue;
    bool aligned = true;
    for (int d = 0; d < Depth; ++d) {
      const Tensor* x = e.t[d];
      l.ptr[d][nt] = x && x->defined() ? x->data_ptr() : nullptr;
      l.dtype[d][nt] = x && x->defined() ? x->dtype() : DType::f32;
      aligned = aligned && (reinterpret_cast<uintptr_t>(l.ptr[d][nt]) % 16 == 0);
    }
    l.numel[nt] = n;
    l.lr[nt] = e.lr;
    l.weight_decay[nt] = e.weight_decay;
    l.index[nt] = uint32_t(e.index);
    l.aligned[nt] = aligned;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      l.block_tensor[nb] = uint8_t(nt);
      l.block_chunk[nb] = int32_t(c);
      ++nb, ++total_blocks;
      if (nb == kMaxBlocks) {
        const bool more = c + 1 < chunks;
        // The entry continues in the next launch: carry it over as its slot 0.
        TensorList<Depth> keep = l;
        flush();
        if (more) {
          for (int d = 0; d < Depth; ++d) l.ptr[d][0] = keep.ptr[d][nt], l.dtype[d][0] = keep.dtype[d][nt];
          l.numel[0] = keep.numel[nt], l.lr[0] = keep.lr[nt], l.weight_decay[0] = keep.weight_decay[nt];
          l.index[0] = keep.index[nt], l.aligned[0] = keep.aligned[nt];
          nt = 0;
        } else {
          nt = -1;
        }
      }
    }
    if (++nt == kMaxTensors) flush();
  }
  flush();
}

int blocks_of(int64_t n) { return int(std::max<int64_t>(1, (n + kChunk - 1) / kChunk)); }

// The element range of this block and thread: [begin, end) of tensor blockIdx's entry.
#define MIXPREC_CHUNK_RANGE(l)                                             \
  const int slot = l.block_tensor[blockIdx.x];                             \
  const int64_t n = l.numel[slot];                                         \
  const int64_t chunk_begin = int64_t(l.block_chunk[blockIdx.x]) * kChunk; \
  const int64_t chunk_end = min(n, chunk_begin + kChunk)

// ------------------------------------------------------------------ unscale and inf check

__global__ void unscale_kernel(TensorList<2> l, const float* scale, float* found_inf) {
  MIXPREC_CHUNK_RANGE(l);
  const float inv = rule::inv_scale(*scale);
  const void* src = l.ptr[0][slot];
  void* dst = l.ptr[1][slot];
  const DType st = l.dtype[0][slot], dt = l.dtype[1][slot];
  bool ok = true;
  for (int64_t i = chunk_begin + int64_t(threadIdx.x) * kIlp; i < chunk_end; i += int64_t(blockDim.x) * kIlp) {
    if (st == DType::f64) {
      for (int k = 0; k < kIlp && i + k < chunk_end; ++k) {
        const double v = static_cast<const double*>(src)[i + k];
        ok = ok && fabs(v) <= 1.7976931348623157e308;
        if (dst) store_f64(dst, dt, i + k, v * double(inv));
      }
      continue;
    }
    float v[kIlp];
    load4(src, st, i, chunk_end, l.aligned[slot], v);
    for (int k = 0; k < kIlp; ++k) {
      ok = ok && fabsf(v[k]) <= 3.4028234663852886e38f;  // false for inf and NaN
      v[k] *= inv;
    }
    if (dst) store4(dst, dt, i, chunk_end, l.aligned[slot], v);
  }
  if (!ok) *found_inf = 1.0f;  // every writer writes 1: no race on the value
}

// ------------------------------------------------------------------------- fused updates

// Philox 4x32-10 and Generator::split, as src/core/random.cpp, for the stochastic-rounding words.
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k.x += 0x9E3779B9u, k.y += 0xBB67AE85u;
    const uint64_t p0 = uint64_t(0xD2511F53u) * c.x, p1 = uint64_t(0xCD9E8D57u) * c.z;
    c = make_uint4(uint32_t(p1 >> 32) ^ c.y ^ k.x, uint32_t(p1), uint32_t(p0 >> 32) ^ c.w ^ k.y, uint32_t(p0));
  }
  return c;
}
__device__ __forceinline__ uint64_t split(uint64_t seed, uint64_t stream, uint64_t key) {
  const uint4 w = philox(make_uint4(uint32_t(key), uint32_t(key >> 32), uint32_t(stream), uint32_t(stream >> 32)),
                         make_uint2(uint32_t(seed) ^ 0x243F6A88u, uint32_t(seed >> 32) ^ 0x85A308D3u));
  return uint64_t(w.x) | uint64_t(w.y) << 32;
}
__device__ __forceinline__ uint32_t stream_word(uint64_t seed, uint64_t stream, uint64_t e) {
  const uint64_t b = e / 4;
  const uint4 w = philox(make_uint4(uint32_t(b), uint32_t(b >> 32), uint32_t(stream), uint32_t(stream >> 32)),
                         make_uint2(uint32_t(seed), uint32_t(seed >> 32)));
  const uint32_t r[4] = {w.x, w.y, w.z, w.w};
  return r[e % 4];
}
// optim/rounding.h's stochastic rounding, with the GPU's conversions.
__device__ __forceinline__ void store_stochastic(void* p, DType t, int64_t i, float x, uint32_t r) {
  if (t == DType::bf16) {
    const uint32_t bits = __float_as_uint(x);
    const uint16_t h = isnan(x) ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : uint16_t((bits + (r & 0xffffu)) >> 16);
    static_cast<uint16_t*>(p)[i] = h;
    return;
  }
  uint16_t out;
  if (!isfinite(x)) {
    out = __half_as_ushort(__float2half_rn(x));
  } else {
    const uint16_t sign = signbit(x) ? 0x8000u : 0;
    const float a = fabsf(x);
    const uint16_t h = __half_as_ushort(__float2half_rn(a));
    const float y = __half2float(__ushort_as_half(h));
    if (h >= 0x7c00u || y == a) {
      out = uint16_t(sign | h);
    } else {
      const uint16_t lo = y < a ? h : uint16_t(h - 1), hi = uint16_t(lo + 1);
      const float flo = __half2float(__ushort_as_half(lo)), fhi = __half2float(__ushort_as_half(hi));
      const float prob = (a - flo) / (fhi - flo);
      const float u = float(r >> 8) * 0x1p-24f;
      out = uint16_t(sign | (u < prob ? hi : lo));
    }
  }
  static_cast<uint16_t*>(p)[i] = out;
}

struct StepArgs {
  const int64_t* step;
  const float* found_inf;  // may be null
  const float* scale;      // may be null
  bool stochastic;
  uint64_t seed;
  unsigned long long* rounding;  // may be null
};

enum class Rule { sgd, adamw };
struct RuleArgs {
  double momentum, dampening, beta1, beta2, eps;
  bool nesterov;
  const uint8_t* momentum_ready;  // SGD with momentum
};

// Slots: 0 param, 1 grad, 2 master, 3 state1, 4 state2.
template <Rule R>
__global__ void update_kernel(TensorList<5> l, StepArgs s, RuleArgs o) {
  if (s.found_inf && *s.found_inf != 0) return;  // skipped on the device
  MIXPREC_CHUNK_RANGE(l);
  const int64_t step = *s.step + 1;
  const float inv = s.scale ? rule::inv_scale(*s.scale) : 1.0f;
  const double lr = *l.lr[slot], wd = l.weight_decay[slot];
  void *p = l.ptr[0][slot], *master = l.ptr[2][slot], *s1 = l.ptr[3][slot], *s2 = l.ptr[4][slot];
  const void* g = l.ptr[1][slot];
  const DType pt = l.dtype[0][slot], gt = l.dtype[1][slot];
  const bool first = R == Rule::sgd && o.momentum_ready && !o.momentum_ready[l.index[slot]];
  const bool half = pt == DType::bf16 || pt == DType::f16;
  const bool sr = s.stochastic && half && !master;
  const uint64_t stream = sr ? split(s.seed, split(s.seed, 0, uint64_t(step)), l.index[slot]) : 0;
  unsigned long long changed = 0, stuck = 0;
  // The rule's constants once per thread, not per element (AdamW's bias corrections are two pow()s).
  const auto consts = [&](auto zero) {
    using V = decltype(zero);
    if constexpr (R == Rule::sgd)
      return rule::sgd_consts<V>(lr, wd, o.momentum, o.dampening, first, o.nesterov);
    else
      return rule::adamw_consts<V>(lr, wd, o.beta1, o.beta2, o.eps, step);
  };
  const auto c64 = consts(0.0);
  const auto c32 = consts(0.0f);
  for (int64_t i = chunk_begin + threadIdx.x; i < chunk_end; i += blockDim.x) {
    if (pt == DType::f64) {
      double w = static_cast<double*>(p)[i];
      const double gi = load_f64(g, gt, i) * double(inv);
      if constexpr (R == Rule::sgd) {
        rule::sgd(w, gi, s1 ? static_cast<double*>(s1) + i : nullptr, c64);
      } else {
        rule::adamw(w, gi, static_cast<double*>(s1)[i], static_cast<double*>(s2)[i], c64);
      }
      static_cast<double*>(p)[i] = w;
      continue;
    }
    float gi = load_f32(g, gt, i);
    if (s.scale) gi *= inv;
    float w = master ? static_cast<float*>(master)[i] : load_f32(p, pt, i);
    const float w_before = w, h_before = load_f32(p, pt, i);
    if constexpr (R == Rule::sgd) {
      rule::sgd(w, gi, s1 ? static_cast<float*>(s1) + i : nullptr, c32);
    } else {
      rule::adamw(w, gi, static_cast<float*>(s1)[i], static_cast<float*>(s2)[i], c32);
    }
    if (master) static_cast<float*>(master)[i] = w;
    if (!half) {
      static_cast<float*>(p)[i] = w;
      continue;
    }
    if (sr)
      store_stochastic(p, pt, i, w, stream_word(s.seed, stream, uint64_t(i)));
    else
      store_f32(p, pt, i, w);
    const bool moved = w != w_before;
    changed += moved;
    stuck += moved && load_f32(p, pt, i) == h_before;
  }
  if (s.rounding && (changed || stuck)) {  // integer atomics: the sum does not depend on the order
    atomicAdd(s.rounding, changed);
    atomicAdd(s.rounding + 1, stuck);
  }
}

// After every update launch of a step: the step count, and the momentum buffers that now hold one.
struct ReadyList {
  uint32_t index[256];
  int count;
};
__global__ void finish_step_kernel(int64_t* step, const float* found_inf, uint8_t* ready, ReadyList r) {
  if (found_inf && *found_inf != 0) return;
  if (step && threadIdx.x == 0) *step += 1;
  if (ready)
    for (int k = threadIdx.x; k < r.count; k += blockDim.x) ready[r.index[k]] = 1;
}

template <Rule R>
void fused_step(const std::vector<OptimParam>& params, const RuleArgs& o, const OptimStep& s, uint8_t* ready) {
  const Tensor& any = s.step;
  DeviceGuard guard(any.device().index);
  cudaStream_t stream = stream_of(any);
  const StepArgs a{static_cast<const int64_t*>(s.step.data_ptr()),
                   s.found_inf.defined() ? static_cast<const float*>(s.found_inf.data_ptr()) : nullptr,
                   s.scale.defined() ? static_cast<const float*>(s.scale.data_ptr()) : nullptr,
                   s.stochastic,
                   s.seed,
                   s.rounding.defined() ? static_cast<unsigned long long*>(s.rounding.data_ptr()) : nullptr};
  std::vector<Entry<5>> entries;
  for (const OptimParam& p : params)
    entries.push_back({{&p.param, &p.grad, &p.master, &p.state1, &p.state2},
                       static_cast<const double*>(p.lr.data_ptr()),
                       p.weight_decay,
                       p.index});
  for_lists(entries, [&](const TensorList<5>& l, int nb) {
    update_kernel<R><<<nb, kThreads, 0, stream>>>(l, a, o);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  // The flags in chunks of 256 parameters; the step count advances once (with the first chunk).
  for (size_t k0 = 0; k0 == 0 || k0 < params.size(); k0 += 256) {
    ReadyList r{};
    r.count = ready ? int(std::min<size_t>(256, params.size() - k0)) : 0;
    for (int k = 0; k < r.count; ++k) r.index[k] = uint32_t(params[k0 + size_t(k)].index);
    if (k0 > 0) {
      if (r.count == 0) break;
      finish_step_kernel<<<1, 32, 0, stream>>>(nullptr, a.found_inf, ready, r);
    } else {
      finish_step_kernel<<<1, 32, 0, stream>>>(static_cast<int64_t*>(s.step.data_ptr()), a.found_inf, ready, r);
    }
    MIXPREC_CUDA_CHECK_LAUNCH();
  }
}

// ------------------------------------------------------------------------- scalar kernels

struct FoundList {
  const float* ptr[32];
  int count;
};
__global__ void update_scale_kernel(float* scale, int64_t* c, FoundList f, rule::ScaleRule r) {
  bool found = false;
  for (int k = 0; k < f.count; ++k) found = found || *f.ptr[k] != 0;
  bool error = false;
  const rule::ScaleState n = rule::next_scale({*scale, c[kGrowthTracker], c[kHysteresisLeft]}, found, r, &error);
  if (error) {
    c[kMinScaleError] = 1;
    return;
  }
  *scale = n.scale;
  c[kGrowthTracker] = n.growth_tracker;
  c[kHysteresisLeft] = n.hysteresis_left;
  c[kUpdates] += 1;
  c[kOverflows] += found ? 1 : 0;
}
__global__ void count_skipped_kernel(int64_t* c, const float* found_inf) {
  c[kSkippedSteps] += *found_inf != 0 ? 1 : 0;
}
__global__ void increment_kernel(int64_t* c) { *c += 1; }

// ------------------------------------------------------------------------- norms, clipping

// Partial p-norm sums of each block (its chunk), in f64; reduced in a fixed tree, so the result
// is the same on every run (no floating-point atomics).
template <int Kind>  // 0: sum of squares, 1: max |v| (NaN propagating), 2: sum of |v|^p
__global__ void norm_partial_kernel(TensorList<1> l, double p, double* partial) {
  MIXPREC_CHUNK_RANGE(l);
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int64_t i = chunk_begin + threadIdx.x; i < chunk_end; i += blockDim.x) {
    const double v = load_f64(l.ptr[0][slot], l.dtype[0][slot], i);
    if (Kind == 0) acc += v * v;
    if (Kind == 1) acc = isnan(v) || isnan(acc) ? NAN : fmax(acc, fabs(v));
    if (Kind == 2) acc += pow(fabs(v), p);
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      const double a = sh[threadIdx.x], b = sh[threadIdx.x + w];
      sh[threadIdx.x] = Kind == 1 ? (isnan(a) || isnan(b) ? NAN : fmax(a, b)) : a + b;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[l.first_block + blockIdx.x] = sh[0];
}
__global__ void norm_final_kernel(const double* partial, int n, int kind, double p, double* out) {
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    acc = kind == 1 ? (isnan(acc) || isnan(partial[i]) ? NAN : fmax(acc, partial[i])) : acc + partial[i];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      const double a = sh[threadIdx.x], b = sh[threadIdx.x + w];
      sh[threadIdx.x] = kind == 1 ? (isnan(a) || isnan(b) ? NAN : fmax(a, b)) : a + b;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = kind == 1 ? sh[0] : kind == 0 ? sqrt(sh[0]) : pow(sh[0], 1.0 / p);
}

__global__ void clip_norm_kernel(TensorList<1> l, const double* total, double max_norm) {
  const double coef = rule::clip_coef(*total, max_norm);
  if (coef == 1.0) return;
  MIXPREC_CHUNK_RANGE(l);
  for (int64_t i = chunk_begin + threadIdx.x; i < chunk_end; i += blockDim.x)
    store_f64(l.ptr[0][slot], l.dtype[0][slot], i, load_f64(l.ptr[0][slot], l.dtype[0][slot], i) * coef);
}
__global__ void clip_value_kernel(TensorList<1> l, double c) {
  MIXPREC_CHUNK_RANGE(l);
  for (int64_t i = chunk_begin + threadIdx.x; i < chunk_end; i += blockDim.x) {
    const double v = load_f64(l.ptr[0][slot], l.dtype[0][slot], i);
    store_f64(l.ptr[0][slot], l.dtype[0][slot], i, isnan(v) ? v : fmin(fmax(v, -c), c));
  }
}

// The f16-range counts of one gradient: per block, then summed in a fixed order by one block.
__global__ void range_partial_kernel(TensorList<1> l, double scale, double* partial) {
  MIXPREC_CHUNK_RANGE(l);
  constexpr double kZeroBound = 0x1p-25, kMinNormal = 0x1p-14, kOverflowBound = 65520.0;
  const double zero_unscaled = kZeroBound * scale, over_unscaled = kOverflowBound * scale, inv = 1 / scale;
  double k[kRangeCounts] = {};
  for (int64_t i = chunk_begin + threadIdx.x; i < chunk_end; i += blockDim.x) {
    const double a = fabs(load_f64(l.ptr[0][slot], l.dtype[0][slot], i));
    k[kZero] += a == 0;
    k[kUnderflow] += a <= kZeroBound;
    k[kUnderflowUnscaled] += a <= zero_unscaled;
    k[kSubnormal] += a > kZeroBound && a < kMinNormal;
    k[kOverflow] += !(a < kOverflowBound);
    k[kOverflowUnscaled] += !(a < over_unscaled);
    if (isfinite(a)) {
      k[kMaxAbs] = fmax(k[kMaxAbs], a);
      k[kSumSq] += (a * inv) * (a * inv);
      k[kFinite] += 1;
    }
  }
  __shared__ double sh[kThreads];
  for (int j = 0; j < kRangeCounts; ++j) {
    sh[threadIdx.x] = k[j];
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
      if (threadIdx.x < w)
        sh[threadIdx.x] =
            j == kMaxAbs ? fmax(sh[threadIdx.x], sh[threadIdx.x + w]) : sh[threadIdx.x] + sh[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) partial[(l.first_block + blockIdx.x) * kRangeCounts + j] = sh[0];
    __syncthreads();
  }
}
__global__ void range_final_kernel(const double* partial, int n, double* out) {
  const int j = threadIdx.x;
  if (j >= kRangeCounts) return;
  double acc = 0;
  for (int b = 0; b < n; ++b)
    acc = j == kMaxAbs ? fmax(acc, partial[b * kRangeCounts + j]) : acc + partial[b * kRangeCounts + j];
  out[j] = acc;
}

std::vector<Entry<1>> entries_of(const std::vector<Tensor>& ts) {
  std::vector<Entry<1>> e;
  for (const Tensor& t : ts) e.push_back({{&t}});
  return e;
}
int64_t total_blocks(const std::vector<Tensor>& ts) {
  int64_t b = 0;
  for (const Tensor& t : ts) b += t.numel() > 0 ? blocks_of(t.numel()) : 0;
  return b;
}

}  // namespace

void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf) {
  DeviceGuard guard(scale.device().index);
  cudaStream_t stream = stream_of(scale);
  std::vector<Entry<2>> entries;
  for (size_t i = 0; i < src.size(); ++i) entries.push_back({{&src[i], &dst[i]}});
  for_lists(entries, [&](const TensorList<2>& l, int nb) {
    unscale_kernel<<<nb, kThreads, 0, stream>>>(l, static_cast<const float*>(scale.data_ptr()),
                                                static_cast<float*>(found_inf.data_ptr()));
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
}

void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s) {
  uint8_t* ready = o.momentum != 0 ? static_cast<uint8_t*>(o.momentum_ready.data_ptr()) : nullptr;
  fused_step<Rule::sgd>(params, {o.momentum, o.dampening, 0, 0, 0, o.nesterov, ready}, s, ready);
}

void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s) {
  fused_step<Rule::adamw>(params, {0, 0, o.beta1, o.beta2, o.eps, false, nullptr}, s, nullptr);
}

void update_scale(Tensor& scale, Tensor& counters, const std::vector<Tensor>& found_infs, const rule::ScaleRule& r) {
  MIXPREC_CHECK(found_infs.size() <= 32, "GradScaler on CUDA: at most 32 optimizers per update(), got ",
                found_infs.size());
  DeviceGuard guard(scale.device().index);
  FoundList f{};
  f.count = int(found_infs.size());
  for (size_t k = 0; k < found_infs.size(); ++k) f.ptr[k] = static_cast<const float*>(found_infs[k].data_ptr());
  update_scale_kernel<<<1, 1, 0, stream_of(scale)>>>(static_cast<float*>(scale.data_ptr()),
                                                     static_cast<int64_t*>(counters.data_ptr()), f, r);
  MIXPREC_CUDA_CHECK_LAUNCH();
}

void count_skipped(Tensor& counters, const Tensor& found_inf) {
  DeviceGuard guard(counters.device().index);
  count_skipped_kernel<<<1, 1, 0, stream_of(counters)>>>(static_cast<int64_t*>(counters.data_ptr()),
                                                         static_cast<const float*>(found_inf.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
}

void increment(Tensor& counter) {
  DeviceGuard guard(counter.device().index);
  increment_kernel<<<1, 1, 0, stream_of(counter)>>>(static_cast<int64_t*>(counter.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
}

Tensor grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  const Device d = grads[0].device();
  DeviceGuard guard(d.index);
  cudaStream_t stream = stream_of(grads[0]);
  const int kind = std::isinf(norm_type) ? 1 : norm_type == 2.0 ? 0 : 2;
  const int64_t nb = std::max<int64_t>(1, total_blocks(grads));
  Tensor partial = Tensor::empty({nb}, DType::f64, d);
  MIXPREC_CUDA_CHECK(cudaMemsetAsync(partial.data_ptr(), 0, size_t(nb) * 8, stream));
  double* pp = static_cast<double*>(partial.data_ptr());
  for_lists(entries_of(grads), [&](const TensorList<1>& l, int blocks) {
    if (kind == 0) norm_partial_kernel<0><<<blocks, kThreads, 0, stream>>>(l, norm_type, pp);
    if (kind == 1) norm_partial_kernel<1><<<blocks, kThreads, 0, stream>>>(l, norm_type, pp);
    if (kind == 2) norm_partial_kernel<2><<<blocks, kThreads, 0, stream>>>(l, norm_type, pp);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  Tensor out = Tensor::empty({}, DType::f64, d);
  norm_final_kernel<<<1, kThreads, 0, stream>>>(pp, int(nb), kind, norm_type, static_cast<double*>(out.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
  return out;
}

void clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm) {
  DeviceGuard guard(total.device().index);
  cudaStream_t stream = stream_of(total);
  for_lists(entries_of(grads), [&](const TensorList<1>& l, int nb) {
    clip_norm_kernel<<<nb, kThreads, 0, stream>>>(l, static_cast<const double*>(total.data_ptr()), max_norm);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
}

void clip_by_value(const std::vector<Tensor>& grads, double clip_value) {
  if (grads.empty()) return;
  DeviceGuard guard(grads[0].device().index);
  cudaStream_t stream = stream_of(grads[0]);
  for_lists(entries_of(grads), [&](const TensorList<1>& l, int nb) {
    clip_value_kernel<<<nb, kThreads, 0, stream>>>(l, clip_value);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
}

Tensor grad_range_counts(const Tensor& g, double scale) {
  DeviceGuard guard(g.device().index);
  cudaStream_t stream = stream_of(g);
  const int64_t nb = blocks_of(g.numel());
  Tensor partial = Tensor::empty({nb * kRangeCounts}, DType::f64, g.device());
  MIXPREC_CUDA_CHECK(cudaMemsetAsync(partial.data_ptr(), 0, size_t(nb * kRangeCounts) * 8, stream));
  double* pp = static_cast<double*>(partial.data_ptr());
  for_lists(entries_of({g}), [&](const TensorList<1>& l, int blocks) {
    range_partial_kernel<<<blocks, kThreads, 0, stream>>>(l, scale, pp);
    MIXPREC_CUDA_CHECK_LAUNCH();
  });
  Tensor out = Tensor::empty({kRangeCounts}, DType::f64, g.device());
  range_final_kernel<<<1, 32, 0, stream>>>(pp, int(nb), static_cast<double*>(out.data_ptr()));
  MIXPREC_CUDA_CHECK_LAUNCH();
  return out;
}

}  // namespace mixprec::kernels::cuda
