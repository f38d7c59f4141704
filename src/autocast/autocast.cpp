// The autocast guard and thread state, the per-op casting policy applied at op entry, the
// weight-cast cache and the trace.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "autocast/autocast_state.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "ops/common.h"

namespace mixprec::amp {
namespace {

struct CacheEntry {
  std::weak_ptr<detail::TensorImpl> src;
  uint64_t version = 0;  // the source's version when cast: an in-place write (optimizer step) invalidates
  Tensor cast;
};
struct ThreadState {
  AutocastState s;
  std::map<std::pair<detail::TensorImpl*, DType>, CacheEntry> cache;
  bool tracing = false;
  std::set<std::tuple<std::string, std::string, std::string>> trace;
};
ThreadState& ts() {
  thread_local ThreadState t;
  return t;
}

// True once a backward pass has run through the cast's node: the engine releases every node it
// runs, so the cached copy can no longer carry a gradient (and an optimizer step has likely
// changed the parameter since). Gradient accumulation inside one region needs a fresh cast.
bool consumed(const Tensor& cast) {
  const auto& node = cast.grad_fn();
  return node != nullptr && node->is_consumed();
}

// ---- cast-ahead: each parameter's shadow lives on its TensorImpl (and dies with it)

std::atomic<int> g_cast_ahead_override{-1};  // -1: MIXPREC_CAST_AHEAD or the default

// 16-bit copy of a leaf parameter, made once per outermost autocast region (and again after a
// backward pass has consumed it); a fresh cast every time where the guard has cache_enabled off.
// With cast-ahead the copy is the parameter's shadow where it is current (no cast), and a cast
// made here becomes its shadow.
Tensor cached_cast(const Tensor& t, DType dtype) {
  auto& cache = ts().cache;
  const bool cacheable = ts().s.cache_enabled && t.is_leaf() && t.requires_grad() && autograd::grad_enabled();
  if (!cacheable) return t.to(dtype);
  auto key = std::make_pair(t.impl(), dtype);
  auto it = cache.find(key);
  if (it != cache.end() && !it->second.src.expired() && it->second.version == t.version() && !consumed(it->second.cast))
    return it->second.cast;
  const bool ahead = t.dtype() == DType::f32 && is_half(dtype) && ahead::enabled(t.device());
  Tensor c;
  if (const Tensor s = ahead ? ahead::current_shadow(t) : Tensor(); s.defined() && s.dtype() == dtype) {
    c = ops::record_cast(t, s.detach());  // the cast's graph node over the kept bytes, no kernel
  } else {
    c = t.to(dtype);
    if (ahead) {
      c.storage()->set_category(MemCategory::parameters);  // it outlives the step, as a parameter does
      t.impl()->shadow = c.detach().impl_ptr();
      t.impl()->shadow_version = t.version();
    }
  }
  cache[key] = CacheEntry{t.impl_ptr(), t.version(), c};
  return c;
}

}  // namespace

namespace ahead {

bool enabled(const Device& d) {
  const int forced = g_cast_ahead_override.load();
  if (forced >= 0) return forced == 1;
  static const int env = [] {
    const char* e = std::getenv("MIXPREC_CAST_AHEAD");
    if (e == nullptr) return -1;
    return std::string_view(e) == "0" ? 0 : 1;
  }();
  return env >= 0 ? env == 1 : d.is_cuda();
}

Override::Override(bool on) : prev_(g_cast_ahead_override.exchange(on ? 1 : 0)) {}
Override::~Override() { g_cast_ahead_override.store(prev_); }

Tensor current_shadow(const Tensor& p) {
  const detail::TensorImpl& impl = *p.impl();
  return impl.shadow && impl.shadow_version == p.version() ? Tensor(impl.shadow) : Tensor();
}

void shadow_written(const Tensor& p) {
  if (p.impl()->shadow) p.impl()->shadow_version = p.version();
}

}  // namespace ahead

AutocastState& autocast_state() { return ts().s; }

Autocast::Autocast(DeviceType device_type, std::optional<DType> dtype, bool enabled, bool cache_enabled)
    : type_(device_type),
      prev_enabled_(ts().s.of(device_type).enabled),
      prev_dtype_(ts().s.of(device_type).dtype),
      prev_cache_enabled_(ts().s.cache_enabled) {
  DeviceAutocast& on = ts().s.of(device_type);
  const DType d = dtype.value_or(on.dtype);
  MIXPREC_CHECK(is_half(d) || !enabled, "autocast dtype must be bf16 or f16, got ", dtype_name(d));
  on.enabled = enabled;
  if (enabled) on.dtype = d;
  ts().s.cache_enabled = cache_enabled;
  ++ts().s.depth;
}

Autocast::~Autocast() {
  ThreadState& t = ts();
  DeviceAutocast& on = t.s.of(type_);
  on.enabled = prev_enabled_;
  on.dtype = prev_dtype_;
  t.s.cache_enabled = prev_cache_enabled_;
  if (--t.s.depth == 0) t.cache.clear();
}

bool is_autocast_enabled(DeviceType type) { return ts().s.of(type).enabled; }
DType autocast_dtype(DeviceType type) { return ts().s.of(type).dtype; }
bool is_autocast_cache_enabled() { return ts().s.cache_enabled; }
size_t autocast_cache_size() { return ts().cache.size(); }

void apply_autocast(OpId op, DType dtype, std::initializer_list<Tensor*> inputs, bool cast_fp32) {
  ThreadState& t = ts();
  std::string in_dtypes;
  if (t.tracing) {
    for (Tensor* x : inputs)
      if (x->defined()) in_dtypes += std::string(in_dtypes.empty() ? "" : ",") + std::string(dtype_name(x->dtype()));
  }
  DType run = DType::f32;
  switch (op_class(op)) {
    case AutocastClass::lower:
      run = dtype;
      for (Tensor* x : inputs)
        // f64 stays f64, as in PyTorch: only f32 and the other 16-bit type are eligible.
        if (x->defined() && is_floating(x->dtype()) && x->dtype() != DType::f64 && x->dtype() != run)
          *x = cached_cast(*x, run);
      break;
    case AutocastClass::fp32:
      run = DType::f32;
      for (Tensor* x : inputs)
        if (cast_fp32 && x->defined() && is_half(x->dtype())) *x = x->to(DType::f32);
      break;
    case AutocastClass::promote: {
      bool any = false;
      for (Tensor* x : inputs)
        if (x->defined() && is_floating(x->dtype())) {
          run = any ? promote_floating(run, x->dtype()) : x->dtype();
          any = true;
        }
      // Nothing is cast: a promote op promotes by itself, as it must outside autocast too. The
      // binary ops' kernels read a mixed pair as if the narrower were widened first, without a
      // widened copy (ops/binary.cpp); cat widens its inputs itself (ops/shape.cpp).
      break;
    }
    case AutocastClass::keep:
      run = inputs.size() && (*inputs.begin())->defined() ? (*inputs.begin())->dtype() : DType::f32;
      break;
    case AutocastClass::mixed: {
      bool first = true;
      for (Tensor* x : inputs) {
        if (first) {
          run = x->defined() ? x->dtype() : DType::f32;
          first = false;
        } else if (x->defined() && is_half(x->dtype())) {
          *x = x->to(DType::f32);  // a parameter: its statistics dtype
        }
      }
      break;
    }
  }
  if (t.tracing) t.trace.emplace(std::string(op_name(op)), in_dtypes, std::string(dtype_name(run)));
}

void throw_mixed_devices(OpId op, std::initializer_list<Tensor*> inputs) {
  std::string devices;
  for (Tensor* x : inputs)
    if (x->defined()) devices += (devices.empty() ? "" : ", ") + x->device().str();
  throw Error(detail::concat(op_name(op), ": inputs on different devices (", devices,
                             "); move them to one device with .to(device)"));
}

void start_trace() {
  ts().tracing = true;
  ts().trace.clear();
}

std::vector<TraceEntry> stop_trace() {
  ThreadState& t = ts();
  t.tracing = false;
  std::vector<TraceEntry> out;
  for (const auto& [op, in, run] : t.trace) out.push_back({op, in, run});
  t.trace.clear();
  return out;
}

}  // namespace mixprec::amp
