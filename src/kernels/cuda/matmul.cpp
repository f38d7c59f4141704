// GPU matmul on cuBLASLt (matmul.h): bf16/f16 operands with f32 accumulation, true f32 (TF32 only
// when allow_tf32()), f64; the bias, ReLU and GELU epilogues; strided batches; one handle per GPU,
// a workspace per stream from our allocator, the heuristic's algorithm cached per problem.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "core/cuda/cuda_util.h"
#include "kernels/activation.h"
#include "kernels/binary.h"
#include "kernels/matmul.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {
namespace {

[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(mixprec::detail::concat("cuBLASLt error in ", call, " at ", file, ":", line, ": ",
                                      cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")"));
}
// Throws mixprec::Error naming the call, as MIXPREC_CUDA_CHECK does for the runtime.
#define MIXPREC_CUBLAS_CHECK(call)                                       \
  do {                                                                   \
    const cublasStatus_t mixprec_cublas_st_ = (call);                    \
    if (mixprec_cublas_st_ != CUBLAS_STATUS_SUCCESS)                     \
      throw_cublas_error(mixprec_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f64:
      return CUDA_R_64F;
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      throw Error(mixprec::detail::concat("matmul on a GPU: no ", dtype_name(t), " matmul (floating dtypes only)"));
  }
}

// The workspace cuBLAS advises for cuBLASLt: 32 MiB on Hopper and newer, 4 MiB before (cuBLAS
// documentation, cublasSetWorkspace).
size_t workspace_bytes(int index) {
  int major = 0;
  MIXPREC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  return major >= 9 ? (size_t(32) << 20) : (size_t(4) << 20);
}

// Everything the heuristic's answer depends on.
struct ProblemKey {
  int device;
  int64_t m, n, k, batch;
  int64_t lda, ldb, ldd, stride_a, stride_b, stride_d;
  int a_type, d_type, bias_type, compute;
  int trans_a, trans_b, epilogue, beta_nonzero;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;
  auto tie() const {
    return std::tie(device, m, n, k, batch, lda, ldb, ldd, stride_a, stride_b, stride_d, a_type, d_type, bias_type,
                    compute, trans_a, trans_b, epilogue, beta_nonzero, align_a, align_b, align_d, align_bias,
                    align_aux);
  }
  bool operator<(const ProblemKey& o) const { return tie() < o.tie(); }
};

// One per GPU: its handle, a workspace per stream (two streams never share scratch), the algorithms.
struct LtDevice {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  size_t ws_bytes = 0;
  std::map<cudaStream_t, Tensor> workspaces;
  std::map<ProblemKey, cublasLtMatmulAlgo_t> algos;
};

LtDevice& lt_device(int index) {
  static std::mutex mu;
  static std::map<int, LtDevice> devices;  // never destroyed before exit: handles outlive all work
  std::lock_guard<std::mutex> lock(mu);
  LtDevice& d = devices[index];
  if (d.handle == nullptr) {
    mixprec::cuda::detail::DeviceGuard g(index);
    MIXPREC_CUBLAS_CHECK(cublasLtCreate(&d.handle));
    d.ws_bytes = workspace_bytes(index);
  }
  return d;
}

void* workspace(LtDevice& d, cudaStream_t s, const Device& dev) {
  auto it = d.workspaces.find(s);
  if (it == d.workspaces.end()) {
    const MemoryScope scope(MemCategory::workspace);
    it = d.workspaces.emplace(s, Tensor::empty({int64_t(d.ws_bytes)}, DType::u8, dev)).first;
  }
  return it->second.data_ptr();
}

// A diagnostic switch of the GPU runs in the environment: `unset` when the variable is absent,
// off when it is "0", on otherwise.
bool env_switch(const char* name, bool unset) {
  const char* v = std::getenv(name);
  return v == nullptr ? unset : std::string_view(v) != "0";
}

// MIXPREC_CUBLASLT_SPLIT_K=0 forbids split-K everywhere (does a difference in bits between a
// captured and an eager step come from split-K?), read once.
bool split_k_allowed() {
  static const bool on = env_switch("MIXPREC_CUBLASLT_SPLIT_K", true);
  return on;
}

// MIXPREC_TRACE_CUBLASLT=1 prints one line per cublasLtMatmul to stderr: its operands' addresses
// and column-major extents, the workspace's, and whether the stream was capturing
// (scripts/gpu/run.sh's initcheck-probe maps initcheck's addresses to the buffers), read once.
bool trace_cublaslt() {
  static const bool on = env_switch("MIXPREC_TRACE_CUBLASLT", false);
  return on;
}

// "name ptr rows cols ld batch batch_stride element_bytes" of one column-major operand.
void trace_operand(const char* name, const void* p, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                   int64_t batch_stride, size_t element_bytes) {
  std::fprintf(stderr, " %s %p %lld %lld %lld %lld %lld %zu", name, p, static_cast<long long>(rows),
               static_cast<long long>(cols), static_cast<long long>(ld), static_cast<long long>(batch),
               static_cast<long long>(batch_stride), element_bytes);
}

// The largest power of two (at most 16 bytes, what the fastest kernels ask) dividing the address.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// A [rows, cols] matrix (the last two dims of t) as cuBLASLt sees it, column-major: either t's
// transpose with ld = t's row stride (rows contiguous), or t itself with ld = its column stride.
struct ColMajor {
  bool is_transpose = false;  // the column-major matrix is t^T
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};
bool col_major_view(const Tensor& t, ColMajor& v) {
  const int64_t r0 = t.dim() - 2, r = t.size(r0), c = t.size(r0 + 1);
  const int64_t s0 = t.strides()[size_t(r0)], s1 = t.strides()[size_t(r0 + 1)];
  v.batch_stride = t.dim() == 3 ? t.strides()[0] : 0;
  if (t.dim() == 3 && t.size(0) > 1 && v.batch_stride == 0) return false;  // a broadcast batch: copy it
  if (s1 == 1 || c == 1) {
    const int64_t ld = r == 1 ? c : s0;
    if (ld >= std::max<int64_t>(c, 1)) {
      v = {true, c, r, ld, v.batch_stride};
      return true;
    }
  }
  if (s0 == 1 || r == 1) {
    const int64_t ld = c == 1 ? r : s1;
    if (ld >= std::max<int64_t>(r, 1)) {
      v = {false, r, c, ld, v.batch_stride};
      return true;
    }
  }
  return false;
}

// RAII for the descriptors of one call.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t batch_stride) {
    MIXPREC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, t, uint64_t(rows), uint64_t(cols), ld));
    if (batch > 1) {
      const int32_t count = int32_t(batch);
      MIXPREC_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      MIXPREC_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &batch_stride, sizeof(batch_stride)));
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};
struct OpDesc {
  cublasLtMatmulDesc_t h = nullptr;
  OpDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    MIXPREC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&h, compute, scale));
  }
  ~OpDesc() { cublasLtMatmulDescDestroy(h); }
  OpDesc(const OpDesc&) = delete;
  OpDesc& operator=(const OpDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    MIXPREC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(h, attr, &v, sizeof(v)));
  }
};
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  Preference() { MIXPREC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&h)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(h); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    MIXPREC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(h, attr, &v, sizeof(v)));
  }
};

// One cuBLASLt call: dst = epilogue(op(a) @ op(b) + bias) (+ dst when accumulate), dst contiguous,
// a and b expressible as column-major operands, the bias (if any) contiguous. False when the
// heuristic has no algorithm for the bias's dtype (the caller casts the bias and retries).
bool lt_matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o, const ColMajor& va,
               const ColMajor& vb) {
  const bool batched = a.dim() == 3;
  const int64_t r0 = batched ? 1 : 0, batch = batched ? a.size(0) : 1;
  const int64_t m = dst.size(r0), n = dst.size(r0 + 1), k = o.trans_a ? a.size(r0) : a.size(r0 + 1);
  const DType t = a.dtype();
  // Row-major dst[m,n] = op(a) @ op(b) is column-major dst^T[n,m] = op(b)^T @ op(a)^T: cuBLASLt's
  // A is our b, its B our a. Its A must be op(b)^T: b^T without trans_b, b with it; the column-major
  // view is b^T when b's rows are contiguous, so no transpose exactly when those two agree.
  const cublasOperation_t op_lt_a = va.is_transpose == !o.trans_b ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_lt_b = vb.is_transpose == !o.trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
  const ColMajor& lt_a = va;  // of b
  const ColMajor& lt_b = vb;  // of a

  const bool tf32 = t == DType::f32 && allow_tf32();
  const cublasComputeType_t compute = t == DType::f64 ? CUBLAS_COMPUTE_64F
                                      : tf32          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                      : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_t = t == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  OpDesc desc(compute, scale_t);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(op_lt_a));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(op_lt_b));
  // The activation comes before the accumulation in our semantics, after beta*C in cuBLASLt's:
  // the caller never asks for both here.
  MIXPREC_ASSERT(!(o.accumulate && (o.relu || o.gelu)), "lt_matmul: activation with accumulate");
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (o.gelu)
    epilogue = o.gelu_input ? (o.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                            : (o.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  else if (o.relu)
    epilogue = o.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (o.bias)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  int bias_type = -1;
  if (o.bias) {
    // The bias runs along cuBLASLt's D rows (our n), packed; its dtype may be f32 under 16-bit D.
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(o.bias->data_ptr()));
    bias_type = int(cuda_type(o.bias->dtype()));
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(bias_type));
  }
  if (o.gelu_input) {
    // GELU's input in dst's layout: ld = n (cuBLASLt asks for a multiple of 8, checked by the caller).
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, o.gelu_input->data_ptr());
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(n));
    if (batched) desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, int64_t(m * n));
  }

  const cudaDataType_t in_t = cuda_type(t), out_t = cuda_type(dst.dtype());
  Layout la(in_t, lt_a.rows, lt_a.cols, lt_a.ld, batch, lt_a.batch_stride);
  Layout lb(in_t, lt_b.rows, lt_b.cols, lt_b.ld, batch, lt_b.batch_stride);
  Layout ld(out_t, n, m, n, batch, m * n);  // dst^T column-major, also C when accumulating

  const int index = dst.device().index;
  LtDevice& dev = lt_device(index);
  cudaStream_t stream = mixprec::cuda::detail::stream_of(dst);
  ProblemKey key{index,
                 m,
                 n,
                 k,
                 batch,
                 lt_a.ld,
                 lt_b.ld,
                 n,
                 lt_a.batch_stride,
                 lt_b.batch_stride,
                 m * n,
                 int(in_t),
                 int(out_t),
                 bias_type,
                 int(compute),
                 int(op_lt_a),
                 int(op_lt_b),
                 int(epilogue),
                 o.accumulate ? 1 : 0,
                 alignment(b.data_ptr()),
                 alignment(a.data_ptr()),
                 alignment(dst.data_ptr()),
                 o.bias ? alignment(o.bias->data_ptr()) : 0,
                 o.gelu_input ? alignment(o.gelu_input->data_ptr()) : 0};
  cublasLtMatmulAlgo_t algo;
  void* ws = nullptr;
  {
    std::lock_guard<std::mutex> lock(dev.mu);
    ws = workspace(dev, stream, dst.device());
    auto it = dev.algos.find(key);
    if (it != dev.algos.end()) {
      algo = it->second;
    } else {
      Preference pref;
      pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(dev.ws_bytes));
      // Split-K partial sums kept in the compute type (f32), never rounded to a 16-bit output
      // in place: design decision 3 (accumulate in f32). With an epilogue, no split-K at all: the
      // split-K algorithms cuBLASLt 13.1 picked for a bias epilogue on an H100 added the bias to
      // the product already rounded to bf16/f16 (GPU run 2026-11-26: errors of half an ulp of the
      // product, 3 to 4 ulps of the result, where bias and product nearly cancel; gone without
      // split-K), and with an f32 output a captured step no longer gave the eager step's bits
      // (GPU run 2026-11-27, the test cnn's classifier). matmul() gives the long reductions that
      // need split-K their epilogue apart.
      pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
               epilogue == CUBLASLT_EPILOGUE_DEFAULT && split_k_allowed()
                   ? uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                   : uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d);
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
      cublasLtMatmulHeuristicResult_t result;
      std::memset(&result, 0, sizeof(result));
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(dev.handle, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &result, &found);
      // A bias dtype the output does not take is CUBLAS_STATUS_INVALID_VALUE for some pairs (a bf16
      // bias with an f32 output): the caller then casts the bias.
      if (o.bias && o.bias->dtype() != dst.dtype() && st == CUBLAS_STATUS_INVALID_VALUE) return false;
      if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
        if (o.bias && o.bias->dtype() != dst.dtype()) return false;
        throw Error(mixprec::detail::concat("matmul on ", dst.device().str(), ": cuBLASLt has no algorithm for ",
                                            dtype_name(t), " [", m, ", ", k, "] @ [", k, ", ", n, "] -> ",
                                            dtype_name(dst.dtype()), " (batch ", batch, ", epilogue ", epilogue, ")"));
      }
      MIXPREC_CUBLAS_CHECK(st);
      algo = result.algo;
      dev.algos.emplace(key, algo);
    }
  }
  const float alpha32 = 1.f, beta32 = o.accumulate ? 1.f : 0.f;
  const double alpha64 = 1.0, beta64 = o.accumulate ? 1.0 : 0.0;
  const void* alpha = t == DType::f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = t == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  if (trace_cublaslt()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MIXPREC_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    std::fprintf(stderr, "cublasLt: m %lld n %lld k %lld epilogue %u beta %d capture %d", static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k), epilogue, o.accumulate ? 1 : 0,
                 capture == cudaStreamCaptureStatusActive ? 1 : 0);
    trace_operand("A", b.data_ptr(), lt_a.rows, lt_a.cols, lt_a.ld, batch, lt_a.batch_stride, dtype_size(b.dtype()));
    trace_operand("B", a.data_ptr(), lt_b.rows, lt_b.cols, lt_b.ld, batch, lt_b.batch_stride, dtype_size(a.dtype()));
    trace_operand("D", dst.data_ptr(), n, m, n, batch, m * n, dtype_size(dst.dtype()));
    if (o.bias) trace_operand("bias", o.bias->data_ptr(), n, 1, n, 1, 0, dtype_size(o.bias->dtype()));
    if (o.gelu_input)
      trace_operand("aux", o.gelu_input->data_ptr(), n, m, n, batch, m * n, dtype_size(o.gelu_input->dtype()));
    trace_operand("workspace", ws, int64_t(dev.ws_bytes), 1, int64_t(dev.ws_bytes), 1, 0, 1);
    std::fprintf(stderr, "\n");
  }
  MIXPREC_CUBLAS_CHECK(cublasLtMatmul(dev.handle, desc.h, alpha, b.data_ptr(), la.h, a.data_ptr(), lb.h, beta,
                                      dst.data_ptr(), ld.h, dst.data_ptr(), ld.h, &algo, ws, dev.ws_bytes, stream));
  return true;
}

// dst = src (f32, dst's shape), or dst += src with one rounding (the sum formed in f32).
void accumulate_into(Tensor& dst, const Tensor& src, bool accumulate) {
  if (!accumulate) return kernels::copy(src, dst);
  Tensor acc = kernels::cast(dst, DType::f32);
  kernels::add_inplace(acc, src);
  kernels::copy(acc, dst);
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const bool batched = a.dim() == 3;
  MIXPREC_ASSERT(a.dim() == b.dim() && a.dim() == dst.dim() && (a.dim() == 2 || batched), "matmul ranks");
  MIXPREC_ASSERT(dst.is_contiguous() && a.dtype() == b.dtype(), "matmul dst/dtypes");
  MIXPREC_ASSERT(!batched || (b.size(0) == a.size(0) && dst.size(0) == a.size(0)), "matmul batch");
  MIXPREC_ASSERT(!(o.relu && o.gelu), "matmul: relu and gelu both asked for");
  if (dst.numel() == 0) return;
  const mixprec::cuda::detail::DeviceGuard guard(dst.device().index);
  const int64_t r0 = batched ? 1 : 0, k = o.trans_a ? a.size(r0) : a.size(r0 + 1);
  if (k == 0) {  // an empty sum: cuBLASLt's k must be positive
    Tensor zero = Tensor::zeros(dst.shape(), dst.dtype(), dst.device());
    MatmulOpts rest = o;
    // act(0 + bias) (+ dst) through a [.., m, 1] @ [.., 1, n] product of zeros keeps one code path.
    Shape sa = a.shape(), sb = b.shape();
    sa[size_t(r0)] = dst.size(r0), sa[size_t(r0 + 1)] = 1, sb[size_t(r0)] = 1, sb[size_t(r0 + 1)] = dst.size(r0 + 1);
    rest.trans_a = rest.trans_b = false;
    cuda::matmul(Tensor::zeros(sa, a.dtype(), a.device()), Tensor::zeros(sb, b.dtype(), b.device()), dst, rest);
    return;
  }
  // Operands cuBLASLt cannot address (a stride in both dims, a broadcast batch): contiguous first.
  ColMajor va, vb;
  Tensor ac = a, bc = b;
  if (!col_major_view(bc, va)) {
    bc = kernels::contig(b);
    MIXPREC_ASSERT(col_major_view(bc, va), "matmul: contiguous b");
  }
  if (!col_major_view(ac, vb)) {
    ac = kernels::contig(a);
    MIXPREC_ASSERT(col_major_view(ac, vb), "matmul: contiguous a");
  }
  Tensor bias;
  if (o.bias) bias = kernels::contig(*o.bias);
  // An f32 output takes an f32 bias (cuBLASLt refuses a bf16 bias there): cast once, here.
  if (o.bias && dst.dtype() == DType::f32 && bias.dtype() != DType::f32) bias = kernels::cast(bias, DType::f32);
  MatmulOpts lo = o;
  lo.bias = o.bias ? &bias : nullptr;
  // A long reduction into a small output (the cnn's classifier: [256, 49000] @ [49000, 10] + bias)
  // needs split-K to fill the GPU, which lt_matmul allows only without an epilogue: with the bias
  // epilogue that matmul took 7.6 ms of a 36.5 ms fp32 cnn step and 0.9 of a 6.4 ms amp one on an
  // H100 (GPU run 2026-11-27). There the product alone in f32, then bias, activation and one
  // rounding into dst as separate passes over the output, small where this applies.
  const int64_t m = dst.size(r0), n = dst.size(r0 + 1);
  if ((o.bias || o.relu || o.gelu) && k >= 2048 && k >= 8 * std::max(m, n)) {
    Tensor wide = Tensor::empty(dst.shape(), DType::f32, dst.device());
    MatmulOpts po;
    po.trans_a = o.trans_a, po.trans_b = o.trans_b;
    MIXPREC_ASSERT(lt_matmul(ac, bc, wide, po, va, vb), "matmul: plain f32 product");
    if (o.bias) wide = kernels::binary(BinaryOp::add, wide, kernels::cast(bias, DType::f32));
    if (o.gelu_input) kernels::copy(wide, *o.gelu_input);
    if (o.relu) wide = kernels::activation(Activation::relu, wide);
    if (o.gelu) wide = kernels::activation(Activation::gelu_tanh, wide);
    accumulate_into(dst, wide, o.accumulate);
    return;
  }
  // GELU's aux output needs a leading dimension divisible by 8 (cublasLt.h,
  // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD): otherwise the pre-activation in f32 through the bias
  // epilogue, stored as the aux output, and GELU by the activation family's kernel.
  // With a 16-bit output, also cuBLASLt's GELU_AUX epilogues store the pre-activation rounded
  // twice (the product to bf16/f16, then the sum with the bias: GPU run 2026-11-26, cuBLASLt 13.1
  // on an H100), so this path serves every 16-bit GELU with its aux output too.
  const bool narrow = dst.dtype() == DType::bf16 || dst.dtype() == DType::f16;
  if (o.gelu && o.gelu_input && (n % 8 != 0 || narrow)) {
    Tensor pre = Tensor::empty(dst.shape(), DType::f32, dst.device());
    MatmulOpts po = o;
    po.gelu = false, po.gelu_input = nullptr, po.accumulate = false;
    cuda::matmul(ac, bc, pre, po);
    kernels::copy(pre, *o.gelu_input);
    const Tensor act = kernels::activation(Activation::gelu_tanh, pre);
    accumulate_into(dst, act, o.accumulate);
    return;
  }
  if (o.accumulate && (o.relu || o.gelu || (o.bias && narrow))) {
    // Ours: dst += act(product + bias); cuBLASLt's epilogue would act on product + dst, and its
    // 16-bit dst += product + bias rounds twice (GPU run 2026-11-26). The activated product in
    // f32, then one rounding of the sum into dst.
    Tensor act = Tensor::empty(dst.shape(), DType::f32, dst.device());
    lo.accumulate = false;
    if (!lt_matmul(ac, bc, act, lo, va, vb)) {
      bias = kernels::cast(bias, DType::f32);
      MIXPREC_ASSERT(lt_matmul(ac, bc, act, lo, va, vb), "matmul: f32 bias");
    }
    accumulate_into(dst, act, true);
    return;
  }
  if (!lt_matmul(ac, bc, dst, lo, va, vb)) {
    // No algorithm takes this bias dtype with this output: the bias in the output's dtype.
    bias = kernels::cast(bias, dst.dtype());
    MIXPREC_CHECK(lt_matmul(ac, bc, dst, lo, va, vb), "matmul on ", dst.device().str(),
                  ": cuBLASLt has no algorithm with a ", dtype_name(bias.dtype()), " bias");
  }
}

}  // namespace mixprec::kernels::cuda
