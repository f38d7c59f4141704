// cuDNN's graph API plans for the convolution (conv_plans.h): descriptors, the engines'
// filtering by numerical notes, timing (cudnn.benchmark's rule) and the workspace spares.
#include "kernels/cuda/conv_plans.h"

#include <algorithm>
#include <map>

#include "core/cuda/cuda_util.h"
#include "mixprec/cuda_stream.h"
#include "mixprec/error.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cuda::conv_plans {

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f16:
      return CUDNN_DATA_HALF;
    default:
      throw Error(mixprec::detail::concat("conv2d on a GPU: no ", dtype_name(t), " convolution"));
  }
}

uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

namespace {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t s, const char* call, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  throw Error(mixprec::detail::concat("cuDNN error in ", call, " at ", file, ":", line, ": ", cudnnGetErrorString(s),
                                      last[0] ? " (" : "", last, last[0] ? ")" : ""));
}
// Throws mixprec::Error naming the call, as MIXPREC_CUDA_CHECK does for the runtime.
#define MIXPREC_CUDNN_CHECK(call)                                                                                   \
  do {                                                                                                              \
    const cudnnStatus_t mixprec_cudnn_st_ = (call);                                                                 \
    if (mixprec_cudnn_st_ != CUDNN_STATUS_SUCCESS) throw_cudnn_error(mixprec_cudnn_st_, #call, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor (RAII), with typed attribute setters.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { MIXPREC_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, int64_t count = 1) {
    MIXPREC_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    const cudnnBackendDescriptor_t v = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &v);
  }
  Desc& set_i64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
    return set(name, CUDNN_TYPE_INT64, v.data(), int64_t(v.size()));
  }
  void finalize() { MIXPREC_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  // Finalize where the configuration may be unsupported: false then, any other failure throws.
  bool try_finalize() {
    const cudnnStatus_t s = cudnnBackendFinalize(d_);
    if (s == CUDNN_STATUS_SUCCESS) return true;
    if (s == CUDNN_STATUS_NOT_SUPPORTED || (int(s) >= 3000 && int(s) < 4000)) return false;  // the 3000s: unsupported
    throw_cudnn_error(s, "cudnnBackendFinalize", __FILE__, __LINE__);
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace

struct Plan {
  std::shared_ptr<Desc> plan;
  int64_t workspace_bytes = 0;
  std::vector<int64_t> uids;  // the tensors the variant pack binds, in the call's order
  // The descriptors the plan was built from (tensors, operations, graph, engine config), kept
  // alive with it as cudnn_frontend keeps them.
  std::vector<std::shared_ptr<Desc>> keep;
};

namespace {
// One per GPU: its handle and the plans built for it.
struct CudnnDevice {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<GraphKey, std::shared_ptr<Candidates>> plans;  // no plan: no engine for that graph
};
CudnnDevice& cudnn_device(int index) {
  static std::mutex mu;
  static std::map<int, CudnnDevice> devices;  // never destroyed before exit
  std::lock_guard<std::mutex> lock(mu);
  CudnnDevice& d = devices[index];
  if (d.handle == nullptr) {
    mixprec::cuda::detail::DeviceGuard g(index);
    MIXPREC_CUDNN_CHECK(cudnnCreate(&d.handle));
  }
  return d;
}

// The unique ids of the graph's tensors.
enum Uid : int64_t { kX = 1, kW, kY, kBias, kConvOut, kBiasOut };

std::shared_ptr<Desc> tensor_desc(int64_t uid, cudnnDataType_t type, const std::vector<int64_t>& dims, uint32_t align,
                                  bool nhwc, bool is_virtual = false) {
  auto d = std::make_shared<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  // Contiguous NCHW (or [oc, c/groups, kh, kw], or [1, oc, 1, 1] for the bias) strides, or the
  // same dims over NHWC bytes (KRSC for the weight): dim 1 innermost.
  std::vector<int64_t> strides(dims.size(), 1);
  if (nhwc) {
    strides = {dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
  } else {
    for (size_t i = dims.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * dims[i];
  }
  const int64_t a = align;
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
      .set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_i64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &a);
  if (is_virtual) {
    const bool v = true;
    d->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &v);
  }
  d->finalize();
  return d;
}

// The handle attributes are deprecated since cuDNN 9.8 in favour of a device-property descriptor,
// and still honoured by 9.19: one place sets them, so the switch is one edit.
void set_handle(Desc& d, cudnnBackendAttributeName_t graph_or_plan, cudnnHandle_t h) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  d.set(graph_or_plan, CUDNN_TYPE_HANDLE, &h);
#pragma GCC diagnostic pop
}
cudnnBackendAttributeName_t graph_handle_attr() {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
#pragma GCC diagnostic pop
}
cudnnBackendAttributeName_t plan_handle_attr() {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop
}

// Whether an engine's numerical notes fit our rules: accumulation in f32 (no reduced-precision
// reduction, no inputs rounded down), no TF32 for f32 data unless allowed, and under
// use_deterministic_algorithms nothing cuDNN calls non-deterministic.
bool engine_allowed(const Desc& cfg, bool f32_data, bool tf32, bool deterministic) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t got = 0;
  MIXPREC_CUDNN_CHECK(
      cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  MIXPREC_CUDNN_CHECK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes));
  for (int64_t i = 0; i < count; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
        notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
      return false;
    if (f32_data && !tf32 && notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) return false;
    if (deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  }
  return true;
}

// At most this many of the heuristics' engines are timed on a graph's first run.
constexpr size_t kMaxCandidates = 8;

// Which engines build_plans makes plans of.
enum class Engines {
  timed,   // the first kMaxCandidates that finalize, in the order of the heuristics (mode A; the
           // fallback list when mode A has none)
  spares,  // every other one that finalizes (the rest of mode A's list, and the fallback list),
           // least workspace first: what runs when no timed one's workspace fits
};

// Builds the graph of `k` and the execution plans of `which` engines; empty when none finalizes.
std::vector<std::shared_ptr<Plan>> build_plans(const GraphKey& k, cudnnHandle_t handle, Engines which) {
  const auto x_t = cudnnDataType_t(k.x_type), w_t = cudnnDataType_t(k.w_type), y_t = cudnnDataType_t(k.y_type);
  const bool f64 = x_t == CUDNN_DATA_DOUBLE;
  const cudnnDataType_t compute = f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const std::vector<int64_t> xd{k.n, k.c, k.h, k.w}, wd{k.oc, k.c / k.groups, k.kh, k.kw}, yd{k.n, k.oc, k.oh, k.ow};
  const bool fused = k.pass == Pass::forward && (k.bias_type >= 0 || k.relu);

  auto conv_ptr = std::make_shared<Desc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  Desc& conv = *conv_ptr;
  const int64_t spatial = 2;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial)
      .set_i64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, {k.dh, k.dw})
      .set_i64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {k.sh, k.sw})
      .set_i64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {k.ph, k.pw})
      .set_i64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {k.ph, k.pw});
  conv.finalize();

  // Groups are implied by the weight's c / groups input channels.
  auto x = tensor_desc(kX, x_t, xd, k.align_x, k.nhwc);
  auto w = tensor_desc(kW, w_t, wd, k.align_w, k.nhwc);
  // The convolution's own output: the graph's y, or (fused) a virtual f32 tensor the bias and
  // ReLU read, so the result is rounded once, as on the CPU.
  auto conv_out =
      fused ? tensor_desc(kConvOut, compute, yd, 16, k.nhwc, true) : tensor_desc(kY, y_t, yd, k.align_y, k.nhwc);
  std::vector<std::shared_ptr<Desc>> keep{conv_ptr};  // descriptors the graph refers to
  std::vector<std::shared_ptr<Desc>> ops;
  const double alpha64 = 1.0, beta64 = 0.0;
  const float alpha32 = 1.f, beta32 = 0.f;
  const auto scalar_type = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  std::vector<int64_t> uids;
  if (k.pass == Pass::forward) {
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, scalar_type, alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, scalar_type, beta)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *conv_out);
    op->finalize();
    ops.push_back(op);
    uids = {kX, kW, kY};
    std::shared_ptr<Desc> cur = conv_out;
    const bool has_bias = k.bias_type >= 0;
    auto pointwise = [&](cudnnPointwiseMode_t pm, const std::shared_ptr<Desc>& in, const std::shared_ptr<Desc>& b,
                         const std::shared_ptr<Desc>& out) {
      auto pw = std::make_shared<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &pm)
          .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &compute);
      pw->finalize();
      auto pop = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      pop->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw)
          .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *in);
      if (b) pop->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
      pop->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out);
      pop->finalize();
      keep.push_back(pw);
      ops.push_back(pop);
    };
    if (has_bias) {
      auto bias = tensor_desc(kBias, cudnnDataType_t(k.bias_type), {1, k.oc, 1, 1}, k.align_b, k.nhwc);
      auto out =
          k.relu ? tensor_desc(kBiasOut, compute, yd, 16, k.nhwc, true) : tensor_desc(kY, y_t, yd, k.align_y, k.nhwc);
      pointwise(CUDNN_POINTWISE_ADD, cur, bias, out);
      keep.push_back(bias);
      keep.push_back(cur);
      cur = out;
      uids.push_back(kBias);
    }
    if (k.relu) {
      auto y = tensor_desc(kY, y_t, yd, k.align_y, k.nhwc);
      pointwise(CUDNN_POINTWISE_RELU_FWD, cur, nullptr, y);
      keep.push_back(cur);
      keep.push_back(y);
    }
  } else if (k.pass == Pass::backward_data) {
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
    // Here x is dx and y is dy.
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, scalar_type, alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, scalar_type, beta)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, *w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, *x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, *conv_out);
    op->finalize();
    ops.push_back(op);
    uids = {kX, kW, kY};
  } else {
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
    // Here w is dw and y is dy.
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, scalar_type, alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, scalar_type, beta)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, *x)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, *w)
        .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, *conv_out);
    op->finalize();
    ops.push_back(op);
    uids = {kX, kW, kY};
  }

  auto graph_ptr = std::make_shared<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  Desc& graph = *graph_ptr;
  std::vector<cudnnBackendDescriptor_t> op_handles;
  for (const auto& op : ops) op_handles.push_back(op->get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, op_handles.data(),
            int64_t(op_handles.size()));
  set_handle(graph, graph_handle_attr(), handle);
  std::vector<std::shared_ptr<Plan>> out;
  if (!graph.try_finalize()) return out;

  const bool f32_data = x_t == CUDNN_DATA_FLOAT;
  const bool spares = which == Engines::spares;
  bool timed_mode_done = false;  // a mode before this one gave the timed candidates
  for (cudnnBackendHeurMode_t mode_h : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode_h);
    if (!heur.try_finalize()) continue;
    int64_t count = 0;
    MIXPREC_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    if (count <= 0) continue;
    std::vector<std::shared_ptr<Desc>> cfgs;
    std::vector<cudnnBackendDescriptor_t> cfg_handles;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.push_back(std::make_shared<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      cfg_handles.push_back(cfgs.back()->get());
    }
    int64_t got = 0;
    MIXPREC_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg_handles.data()));
    size_t finalized = 0;  // in this mode
    for (int64_t i = 0; i < std::min(got, count) && (spares || out.size() < kMaxCandidates); ++i) {
      if (!engine_allowed(*cfgs[size_t(i)], f32_data, k.tf32, k.deterministic)) continue;
      auto plan = std::make_shared<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set_handle(*plan, plan_handle_attr(), handle);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[size_t(i)]);
      if (!plan->try_finalize()) continue;
      const bool timed_one = !timed_mode_done && finalized++ < kMaxCandidates;
      if (timed_one == spares) continue;
      auto p = std::make_shared<Plan>();
      p->plan = plan;
      int64_t n_ws = 0;
      MIXPREC_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                   CUDNN_TYPE_INT64, 1, &n_ws, &p->workspace_bytes));
      p->uids = uids;
      p->keep = keep;
      p->keep.insert(p->keep.end(), ops.begin(), ops.end());
      p->keep.insert(p->keep.end(), {x, w, conv_out, graph_ptr, cfgs[size_t(i)]});
      out.push_back(p);
    }
    timed_mode_done = timed_mode_done || finalized > 0;
    if (!spares && !out.empty()) break;
  }
  if (spares)
    std::stable_sort(out.begin(), out.end(), [](const std::shared_ptr<Plan>& a, const std::shared_ptr<Plan>& b) {
      return a->workspace_bytes < b->workspace_bytes;
    });
  return out;
}

// The cached candidates of `k` (built on first use); no plan when cuDNN has no engine for it.
}  // namespace

std::shared_ptr<Candidates> plans_for(const GraphKey& k) {
  CudnnDevice& dev = cudnn_device(k.device);
  std::lock_guard<std::mutex> lock(dev.mu);
  auto it = dev.plans.find(k);
  if (it == dev.plans.end()) {
    auto c = std::make_shared<Candidates>();
    c->plans = build_plans(k, dev.handle, Engines::timed);
    c->deterministic = k.deterministic;
    c->key = k;
    it = dev.plans.emplace(k, c).first;
  }
  return it->second;
}

namespace {

// Runs plan p with the tensors in uid order, on the device's stream. False only with
// `may_fail` when its workspace does not fit (a candidate being timed).
bool execute(const Plan& p, int index, const std::vector<void*>& ptrs, bool may_fail = false) {
  CudnnDevice& dev = cudnn_device(index);
  cudaStream_t stream = mixprec::cuda::detail::current_stream(index);
  Tensor ws;
  if (p.workspace_bytes > 0) {
    const MemoryScope scope(MemCategory::workspace);
    try {
      ws = Tensor::empty({p.workspace_bytes}, DType::u8, Device::cuda(index));
    } catch (const OutOfMemory&) {
      if (may_fail) return false;
      throw;
    }
  }
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* ws_ptr = ws.defined() ? ws.data_ptr() : nullptr;
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, p.uids.data(), int64_t(p.uids.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), int64_t(ptrs.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws_ptr);
  pack.finalize();
  std::lock_guard<std::mutex> lock(dev.mu);  // the handle's stream is per call
  MIXPREC_CUDNN_CHECK(cudnnSetStream(dev.handle, stream));
  MIXPREC_CUDNN_CHECK(cudnnBackendExecute(dev.handle, p.plan->get(), pack.get()));
  return true;
}

// What running one candidate came to.
enum class Tried { ran, no_memory, refused };

// Runs candidate p once: no_memory when its workspace does not fit, refused when the engine fails
// to run these tensors (not a candidate then, either way); any other out-of-memory propagates.
Tried try_candidate(const Plan& p, int index, const std::vector<void*>& ptrs) {
  try {
    return execute(p, index, ptrs, /*may_fail=*/true) ? Tried::ran : Tried::no_memory;
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error&) {
    return Tried::refused;
  }
}

// No candidate ran: out of memory when one at least was left out for its workspace alone (the
// convolution does not fit; a caller such as max-batch's search takes that as any other
// allocation that fails), else the engines' refusal.
[[noreturn]] void no_candidate_ran(int index, bool for_memory, const char* what) {
  if (for_memory) {
    throw OutOfMemory(mixprec::detail::concat("conv2d on cuda:", index, ": out of memory: no ", what,
                                              "cuDNN engine's workspace fits in the memory left"));
  }
  throw Error(mixprec::detail::concat("conv2d on cuda:", index, ": no ", what, "cuDNN engine runs this convolution"));
}

// None of `c`'s plans fits its workspace: the spares, least workspace first (built on first
// need); the first that runs is kept as the shape's plan from then on, as PyTorch's benchmark
// cache keeps what ran. False when none runs.
bool run_a_spare(Candidates& c, int index, const std::vector<void*>& ptrs) {
  if (!c.spares_built) {
    CudnnDevice& dev = cudnn_device(index);
    const std::lock_guard<std::mutex> lock(dev.mu);
    c.spares = build_plans(c.key, dev.handle, Engines::spares);
    c.spares_built = true;
  }
  for (const std::shared_ptr<Plan>& p : c.spares) {
    if (try_candidate(*p, index, ptrs) == Tried::ran) {
      c.plans = {p};
      c.timed = true;
      return true;
    }
  }
  return false;
}

// Runs the fastest of `c`'s plans. On the first run with several, each is timed on these very
// tensors (PyTorch's cudnn.benchmark; every pass writes its output with beta 0, so a rerun gives
// the same bits), the fastest is kept, and it runs last so that the output is its own. A
// candidate whose workspace does not fit is dropped; when none fits, or the kept plan's does not
// on a later call, a spare with less workspace runs and is kept (run_a_spare); when no spare
// fits either, OutOfMemory (the convolution does not fit: the next call, with more memory free,
// times them all again). A capture
// (cuda::Graph) cannot time: warm up eagerly first, as with PyTorch. Deterministic candidates are
// not timed: the first in the heuristics' order that runs is kept (cudnn.benchmark off), the same
// engine in every process.
}  // namespace

void run_best(Candidates& c, int index, const std::vector<void*>& ptrs) {
  const std::lock_guard<std::mutex> lock(c.mu);
  bool no_memory = false;  // a candidate was left out for its workspace
  if (!c.timed && c.deterministic) {
    // The first that runs; one left out for its workspace stays a candidate of a later call.
    for (size_t i = 0; i < c.plans.size(); ++i) {
      const Tried t = try_candidate(*c.plans[i], index, ptrs);
      if (t == Tried::ran) {
        c.plans = {c.plans[i]};
        c.timed = true;
        return;  // the kept plan has just written the output
      }
      if (t == Tried::no_memory) no_memory = true;
    }
    if (no_memory && run_a_spare(c, index, ptrs)) return;
    no_candidate_ran(index, no_memory, "deterministic ");
  }
  if (!c.timed && c.plans.size() > 1) {
    size_t best = c.plans.size();
    double best_ms = 0;
    for (size_t i = 0; i < c.plans.size(); ++i) {
      const Tried t = try_candidate(*c.plans[i], index, ptrs);  // also the warm-up
      if (t != Tried::ran) {
        no_memory = no_memory || t == Tried::no_memory;
        continue;
      }
      double ms = 0;
      for (double e : mixprec::cuda::time_each(index, 2, [&] { execute(*c.plans[i], index, ptrs); })) ms += e;
      if (best == c.plans.size() || ms < best_ms) best = i, best_ms = ms;
    }
    if (best == c.plans.size()) {
      if (no_memory && run_a_spare(c, index, ptrs)) return;
      no_candidate_ran(index, no_memory, "");
    }
    c.plans = {c.plans[best]};
  }
  c.timed = true;
  try {
    execute(*c.plans.front(), index, ptrs);
  } catch (const OutOfMemory&) {  // its workspace, on this call
    if (!run_a_spare(c, index, ptrs)) throw;
  }
}

}  // namespace mixprec::kernels::cuda::conv_plans
