// oneDNN plumbing shared by the CPU primitives: engine and stream, dtype mapping, user
// scratchpads from the counting allocator, a bounded primitive cache, and CPU feature queries.
#pragma once
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "mixprec/dtype.h"

namespace mixprec::kernels::cpu {

// One CPU engine and one stream per process, created on first use (thread-safe static init).
// A CPU stream with the OpenMP runtime executes synchronously in the calling thread and keeps
// no per-call state, so sharing it is safe (PyTorch's ideep shares one the same way).
// Outside this namespace call them qualified: oneDNN's C API declares global `struct dnnl_engine`
// and `struct dnnl_stream`, so after a using-directive the bare names are ambiguous.
dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

// f32, bf16, f16; any other dtype is an internal error (callers check support first).
dnnl::memory::data_type to_dnnl(DType t);

// The attribute every mixprec primitive starts from: scratchpad_mode::user, so that (1) the
// scratchpad bytes are counted by our allocator and (2) one primitive can run on several
// threads at once (a library-owned scratchpad would be shared between them).
dnnl::primitive_attr user_scratchpad_attr();

// CPU features (mixprec/cpu.h: cpuid and XCR0, hardware and OS support both required).
bool has_avx512_bf16();
bool has_amx_bf16();
// Whether the CPU has a bf16 unit oneDNN runs bf16 kernels on (AVX512-BF16 or AMX-BF16). Without
// either its bf16 matmul is an emulation through f32 and it has no bf16 convolution.
bool bf16_unit();
// Where bf16 matmuls and convolutions compute. native: on a bf16 unit whose products outrun f32's
// (mixprec::cpu::bf16_products_outrun_f32: AMX, or AVX512-BF16 on AMD). f32: without a bf16 unit;
// the kernels widen to f32, run oneDNN's f32 primitive and round once on store, as for f16.
// by_size: a bf16 unit whose products run at f32's rate at best (Intel's AVX512-BF16 without AMX),
// where oneDNN's bf16 kernels ran at 0.6-0.8x its f32 ones on large products but win on small ones,
// whose casts would cost more than the products: each op decides by its shape (matmul.cpp,
// conv_paths.cpp). MIXPREC_BF16_PRODUCTS=native (where the host has a bf16 unit) or =f32 overrides
// the host's rule; set_bf16_products does for tests (it returns the setting it replaced).
enum class Bf16Math { native, f32, by_size };
Bf16Math bf16_math();
// Whether a bf16 product computes in f32: always on the f32 road, never on the native one, and on
// the by_size kind where `large` (the op's own rule for its shape) says.
bool bf16_in_f32(bool large);
// Whether this is the by_size kind by its hardware alone (a bf16 unit whose products do not outrun
// f32's), whatever MIXPREC_BF16_PRODUCTS says: for path choices measured on that kind.
bool by_size_kind();
enum class Bf16Products { host_rule, native, f32 };
Bf16Products set_bf16_products(Bf16Products p);
// Sets where bf16 products compute for a scope, then restores the setting it replaced (tests).
class Bf16ProductsGuard {
 public:
  explicit Bf16ProductsGuard(Bf16Products p) : prev_(set_bf16_products(p)) {}
  ~Bf16ProductsGuard() { set_bf16_products(prev_); }
  Bf16ProductsGuard(const Bf16ProductsGuard&) = delete;
  Bf16ProductsGuard& operator=(const Bf16ProductsGuard&) = delete;

 private:
  Bf16Products prev_;
};
// The ISA oneDNN dispatches to, e.g. "avx512_core_amx" (ONEDNN_MAX_CPU_ISA can lower it).
std::string dnnl_isa_name();

// oneDNN (OpenMP runtime) sizes a primitive's thread team when it is created: a primitive created
// in this scope runs on one thread, e.g. one per thread of the caller's own parallel region.
struct SingleThreadScope {
  int prev = omp_get_max_threads();
  SingleThreadScope() { omp_set_num_threads(1); }
  ~SingleThreadScope() { omp_set_num_threads(prev); }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;
};

// Bytes from mixprec::allocator (MemCategory::workspace), released on scope exit. Used for
// scratchpads and for temporary dense copies of operands.
class WorkspaceBuffer {
 public:
  WorkspaceBuffer() = default;
  explicit WorkspaceBuffer(size_t bytes);
  ~WorkspaceBuffer();
  WorkspaceBuffer(const WorkspaceBuffer&) = delete;
  WorkspaceBuffer& operator=(const WorkspaceBuffer&) = delete;
  WorkspaceBuffer(WorkspaceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  WorkspaceBuffer& operator=(WorkspaceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The scratchpad one execution of `pd` needs, allocated per execution: the allocator's
// free-list makes the repeat allocation of a large block a lookup, and the workspace bytes
// are live exactly while the primitive runs.
class Scratchpad {
 public:
  explicit Scratchpad(const dnnl::primitive_desc_base& pd);
  // Adds DNNL_ARG_SCRATCHPAD when the primitive needs one.
  void add_to(std::unordered_map<int, dnnl::memory>& args) const;
  size_t bytes() const { return buf_.bytes(); }

 private:
  WorkspaceBuffer buf_;
  dnnl::memory mem_;
};

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;  // = primitives created
  int64_t evictions = 0;
  int64_t size = 0;
};

// Bounded LRU map from a shape key to a created primitive (and whatever goes with it).
// Creating a oneDNN primitive costs microseconds to milliseconds (JIT): never once per step.
// Key needs operator== and Hash; Value should be cheap to copy (oneDNN objects are handles).
template <class Key, class Value, class Hash = std::hash<Key>>
class PrimitiveCache {
 public:
  // 256: several models' worth of layers times fwd/bwd products, still small in memory.
  explicit PrimitiveCache(size_t capacity = 256) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The cached value for key, or make() stored and returned. make() runs under the lock so a
  // key is created once even when threads race; if it throws, nothing is stored.
  template <class Make>
  Value get_or_create(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
    Value value = std::forward<Make>(make)();
    ++misses_;
    lru_.emplace_front(key, value);
    index_.emplace(key, lru_.begin());
    if (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
      ++evictions_;
    }
    return value;
  }

  CacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, evictions_, static_cast<int64_t>(lru_.size())};
  }

  // Drops every entry and zeroes the counters.
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    lru_.clear();
    hits_ = misses_ = evictions_ = 0;
  }

 private:
  using List = std::list<std::pair<Key, Value>>;  // front: most recently used
  mutable std::mutex mu_;
  size_t capacity_;
  List lru_;
  std::unordered_map<Key, typename List::iterator, Hash> index_;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

// Mixes v into a running hash (boost::hash_combine's constant, widened to 64 bits).
inline size_t hash_mix(size_t seed, uint64_t v) {
  return seed ^ (std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2));
}

}  // namespace mixprec::kernels::cpu
