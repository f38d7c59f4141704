// The kernel profiler (mixprec/profile.h, core/profile_detail.h).
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/profile_detail.h"
#include "mixprec/autograd.h"
#include "mixprec/profile.h"

#ifdef MIXPREC_WITH_CUDA
#include "core/cuda/cuda_util.h"
#endif

namespace mixprec::profile {
namespace detail {

std::atomic<bool> g_on{false};

namespace {

using Key = std::tuple<std::string, std::string, std::string, std::string>;  // phase, kernel, dtype, impl
struct Sum {
  int64_t calls = 0;
  double seconds = 0.0, flops = 0.0;
};
std::mutex g_mutex;
std::map<Key, Sum> g_sums;                   // guarded by g_mutex
std::map<const char*, std::string> g_names;  // function_name() -> kernel name; guarded by g_mutex

struct ThreadState {
  int depth = 0;       // kernels open on this thread
  double flops = 0.0;  // of the outermost one
  std::string impl;
  const char* phase = nullptr;  // a PhaseScope's label, or null
};
thread_local ThreadState t_state;

// The kernel's name from its function's: __builtin_FUNCTION() gives the bare name ("conv2d_forward");
// a signature ("mixprec::Tensor mixprec::kernels::conv2d_forward(...)") is cut to it too.
std::string short_name(const char* function) {
  const std::string_view f(function);
  const size_t paren = f.find('(');
  const std::string_view head = f.substr(0, paren);
  const size_t start = head.find_last_of(": ");
  return std::string(start == std::string_view::npos ? head : head.substr(start + 1));
}

void synchronize(const Device& d) {
#ifdef MIXPREC_WITH_CUDA
  if (d.is_cuda()) MIXPREC_CUDA_CHECK(cudaStreamSynchronize(cuda::detail::current_stream(d.index)));
#else
  (void)d;
#endif
}

}  // namespace

void KernelScope::begin(const char* where, const Device& device, std::string_view dtype) {
  nested_ = t_state.depth > 0;
  // The work queued before this kernel is not its time. First: if the wait throws (a GPU error),
  // the scope never began and the depth is as it was.
  if (!nested_) synchronize(device);
  ++t_state.depth;
  active_ = true;
  if (nested_) return;
  function_ = where;
  device_ = device;
  dtype_ = dtype;
  t_state.flops = 0.0;
  t_state.impl.clear();
  t0_ = std::chrono::steady_clock::now();
}

// In a destructor: nothing may leave it (a GPU error at the wait, an allocation of the sums).
void KernelScope::end() noexcept {
  --t_state.depth;
  if (nested_) return;
  try {
    synchronize(device_);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const char* phase = t_state.phase ? t_state.phase : autograd::in_backward() ? "backward" : "forward";
    const std::lock_guard lock(g_mutex);
    auto name = g_names.find(function_);
    if (name == g_names.end()) name = g_names.emplace(function_, short_name(function_)).first;
    Sum& sum = g_sums[Key(phase, name->second, std::string(dtype_), t_state.impl)];
    ++sum.calls;
    sum.seconds += s;
    sum.flops += t_state.flops;
  } catch (...) {  // the call is left out of the profile
  }
}

void add_flops(double flops) {
  if (t_state.depth > 0) t_state.flops += flops;
}

void note_impl(std::string_view impl) {
  if (t_state.depth == 0 || impl.empty()) return;
  std::string& cur = t_state.impl;
  // Each implementation once: "jit:avx512_core_bf16+brg:avx512_core_bf16".
  size_t from = 0;
  while (from <= cur.size()) {
    const size_t plus = std::min(cur.find('+', from), cur.size());
    if (std::string_view(cur).substr(from, plus - from) == impl) return;
    from = plus + 1;
  }
  if (!cur.empty()) cur += '+';
  cur += impl;
}

}  // namespace detail

void start() {
  {
    const std::lock_guard lock(detail::g_mutex);
    detail::g_sums.clear();
  }
  detail::g_on.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_on.store(false, std::memory_order_relaxed); }
bool enabled() { return detail::on(); }

std::vector<Row> rows() {
  std::vector<Row> out;
  {
    const std::lock_guard lock(detail::g_mutex);
    for (const auto& [key, sum] : detail::g_sums)
      out.push_back(
          {std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), sum.calls, sum.seconds, sum.flops});
  }
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return out;
}

PhaseScope::PhaseScope(const char* phase) : prev_(detail::t_state.phase) { detail::t_state.phase = phase; }
PhaseScope::~PhaseScope() { detail::t_state.phase = prev_; }

}  // namespace mixprec::profile
