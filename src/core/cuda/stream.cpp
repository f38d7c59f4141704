// cuda::Graph and cuda::time_each (mixprec/cuda_stream.h). The graph: stream capture of this
// thread's stream on one GPU (thread-local mode: a call on this thread that would wait for the GPU invalidates the
// capture), instantiated once, replayed with cudaGraphLaunch; its allocations come from a pool of the caching
// allocator's keyed by the Graph.
#include "mixprec/cuda_stream.h"

#include <cuda_runtime.h>

#include <vector>

#include "core/cuda/cuda_memory.h"
#include "core/cuda/cuda_util.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::cuda {

using detail::DeviceGuard;

namespace {

uint64_t block_of(uint64_t offset) { return (offset + 3) / 4; }  // Generator::reserve's first block

// The generators a graph's captured work draws from (detail::captured_offset): host offsets (words)
// at their first draw in the capture and at its end; `bases` holds each one's first block for the
// replay under way on the device; `next` is the host offset the last replay left (kUnreplayed
// before the first): the device base matches it, and a generator found elsewhere (eager draws in
// between, or the first replay) sets the base anew.
constexpr uint64_t kUnreplayed = ~uint64_t(0);
struct GraphDraws {
  struct Drawn {
    Generator* gen;
    uint64_t start, end, next;
  };
  cudaStream_t stream = nullptr;
  std::vector<Drawn> drawn;
  Tensor bases;  // u64 [kMaxGraphGenerators] on the device (i64 bits), made before the capture
};

thread_local GraphDraws* tl_capture = nullptr;  // those of the Graph capturing on this thread, if any

}  // namespace

struct Graph::Impl {
  int device = -1;
  cudaStream_t stream = nullptr;
  bool capturing = false;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphDraws draws;
  // The allocator pool's key: the Impl's address with the low bit set, which no stream handle has.
  uintptr_t pool() const { return reinterpret_cast<uintptr_t>(this) | 1u; }

  void drop_graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  Impl& g = *impl_;
  if (g.device < 0) return;
  DeviceGuard guard(g.device);
  if (g.capturing) {  // destroyed mid-capture (an exception in the captured code): end it, keep nothing
    if (tl_capture == &g.draws) tl_capture = nullptr;
    for (const GraphDraws::Drawn& d : g.draws.drawn) d.gen->set_offset(d.start);
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(g.stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    ::mixprec::detail::cuda_caching_allocator(g.device).end_pool(reinterpret_cast<uintptr_t>(g.stream));
  }
  g.drop_graph();
  try {  // device >= 0: a capture began, so the pool exists
    ::mixprec::detail::cuda_caching_allocator(g.device).release_pool(g.pool());
  } catch (const Error&) {  // a broken device: its memory is gone with it
  }
}

void Graph::capture_begin(int device) {
  Impl& g = *impl_;
  require(Device::cuda(device));
  MIXPREC_CHECK(!g.capturing, "cuda::Graph::capture_begin: a capture is already under way");
  MIXPREC_CHECK(g.exec == nullptr, "cuda::Graph::capture_begin: this graph holds a capture already");
  MIXPREC_CHECK(g.device < 0 || g.device == device, "cuda::Graph::capture_begin: cuda:", device,
                ", but this graph's pool is on cuda:", g.device);
  DeviceGuard guard(device);
  g.device = device;
  g.stream = detail::current_stream(device);
  if (!g.draws.bases.defined())
    g.draws.bases = Tensor::zeros({detail::kMaxGraphGenerators}, DType::i64, Device::cuda(device));
  g.draws.drawn.clear();
  g.draws.stream = g.stream;
  auto& alloc = ::mixprec::detail::cuda_caching_allocator(device);
  alloc.begin_pool(reinterpret_cast<uintptr_t>(g.stream), g.pool());
  const cudaError_t err = cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    alloc.end_pool(reinterpret_cast<uintptr_t>(g.stream));
    detail::throw_cuda_error(err, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
  g.capturing = true;
  tl_capture = &g.draws;
}

void Graph::capture_end() {
  Impl& g = *impl_;
  MIXPREC_CHECK(g.capturing, "cuda::Graph::capture_end without capture_begin");
  DeviceGuard guard(g.device);
  if (tl_capture == &g.draws) tl_capture = nullptr;
  // The captured work's last kernel advances the Philox bases by what one replay draws; the
  // generators go back to where the capture found them (the captured work has not run).
  std::vector<uint64_t> inc;
  std::vector<GraphDraws::Drawn>& drawn = g.draws.drawn;
  for (GraphDraws::Drawn& d : drawn) {
    d.end = d.gen->offset();
    inc.push_back(block_of(d.end) - block_of(d.start));
  }
  cudaError_t advance = cudaSuccess;
  if (!drawn.empty()) {
    try {
      detail::advance_graph_offsets(g.stream, static_cast<uint64_t*>(g.draws.bases.data_ptr()), inc.data(),
                                    int(inc.size()));
    } catch (const Error&) {
      advance = cudaErrorUnknown;
    }
  }
  for (const GraphDraws::Drawn& d : drawn) d.gen->set_offset(d.start);
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(g.stream, &graph);
  if (err == cudaSuccess && advance != cudaSuccess) err = advance;
  g.capturing = false;
  ::mixprec::detail::cuda_caching_allocator(g.device).end_pool(reinterpret_cast<uintptr_t>(g.stream));
  if (err != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw Error(
        ::mixprec::detail::concat("CUDA graph capture on cuda:", g.device, " failed (", cudaGetErrorString(err),
                                  "): the captured work made a call that waits for the GPU or is not allowed in "
                                  "a capture (a .item(), a copy to the host, a synchronize)"));
  }
  g.graph = graph;
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, g.graph, 0);
  if (inst != cudaSuccess) {
    g.drop_graph();
    detail::throw_cuda_error(inst, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
}

void Graph::replay() {
  Impl& g = *impl_;
  MIXPREC_CHECK(g.exec != nullptr, "cuda::Graph::replay: nothing captured");
  DeviceGuard guard(g.device);
  cudaStream_t stream = detail::current_stream(g.device);
  auto* bases = static_cast<uint64_t*>(g.draws.bases.data_ptr());
  for (size_t i = 0; i < g.draws.drawn.size(); ++i) {
    GraphDraws::Drawn& d = g.draws.drawn[i];
    const uint64_t now = d.gen->offset();
    if (now != d.next) {
      // The first replay, or eager draws since the last one: the device base from the host's offset.
      // (From pageable memory: the copy takes the value before it returns.)
      const uint64_t first = block_of(now);
      MIXPREC_CUDA_CHECK(cudaMemcpyAsync(bases + i, &first, sizeof first, cudaMemcpyHostToDevice, stream));
    }
    // What the eager work would leave: its draws begin at block_of(now) as they began at
    // block_of(start) in the capture.
    d.next = 4 * block_of(now) + (d.end - 4 * block_of(d.start));
    d.gen->set_offset(d.next);
  }
  MIXPREC_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
}

bool Graph::captured() const { return impl_->exec != nullptr; }

Graph::Nodes Graph::nodes() const {
  const Impl& g = *impl_;
  MIXPREC_CHECK(g.graph != nullptr, "cuda::Graph::nodes: nothing captured");
  size_t n = 0;
  MIXPREC_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) MIXPREC_CUDA_CHECK(cudaGraphGetNodes(g.graph, nodes.data(), &n));
  Nodes out;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    MIXPREC_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel:
        ++out.kernels;
        break;
      case cudaGraphNodeTypeMemcpy:
        ++out.memcpys;
        break;
      case cudaGraphNodeTypeMemset:
        ++out.memsets;
        break;
      default:
        ++out.other;
        break;
    }
  }
  return out;
}

std::vector<double> time_each(int device, int64_t n, const std::function<void()>& fn) {
  require(Device::cuda(device));
  DeviceGuard guard(device);
  const cudaStream_t stream = detail::current_stream(device);
  std::vector<cudaEvent_t> events(size_t(n) + 1, nullptr);
  auto destroy = [&] {
    for (cudaEvent_t e : events)
      if (e != nullptr) (void)cudaEventDestroy(e);
  };
  std::vector<double> ms(static_cast<size_t>(n));
  try {
    for (cudaEvent_t& e : events) MIXPREC_CUDA_CHECK(cudaEventCreate(&e));
    MIXPREC_CUDA_CHECK(cudaEventRecord(events[0], stream));
    for (int64_t i = 0; i < n; ++i) {
      fn();
      MIXPREC_CUDA_CHECK(cudaEventRecord(events[size_t(i) + 1], detail::current_stream(device)));
    }
    MIXPREC_CUDA_CHECK(cudaEventSynchronize(events.back()));
    for (int64_t i = 0; i < n; ++i) {
      float t = 0;
      MIXPREC_CUDA_CHECK(cudaEventElapsedTime(&t, events[size_t(i)], events[size_t(i) + 1]));
      ms[size_t(i)] = double(t);
    }
  } catch (...) {
    destroy();
    throw;
  }
  destroy();
  return ms;
}

namespace detail {

CapturedOffset captured_offset(cudaStream_t stream, Generator& gen, const char* what) {
  GraphDraws* g = tl_capture;
  if (g == nullptr || g->stream != stream) {
    refuse_in_capture(stream, what);  // captured by someone else's capture: its replays could not advance
    return {};
  }
  size_t slot = 0;
  while (slot < g->drawn.size() && g->drawn[slot].gen != &gen) ++slot;
  if (slot == g->drawn.size()) {
    MIXPREC_CHECK(slot < size_t(kMaxGraphGenerators), what, " in a CUDA graph capture: more than ", kMaxGraphGenerators,
                  " generators drawn from in one graph");
    g->drawn.push_back({&gen, gen.offset(), 0, kUnreplayed});
  }
  return {static_cast<const uint64_t*>(g->bases.data_ptr()) + slot, block_of(g->drawn[slot].start)};
}

}  // namespace detail

}  // namespace mixprec::cuda
