// The fenced test device: one anonymous mapping per allocation, PROT_NONE except while a
// FencedAccess is open, with the CPU allocator's accounting (same rounding, so the memory figures
// of a run match the CPU's byte for byte).
#include "core/fenced.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace mixprec::detail {
namespace {

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

class FencedAllocator final : public DeviceAllocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override {
    const size_t size = accounted(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (acc_.s.budget_bytes > 0 && acc_.s.live_total + int64_t(size) > acc_.s.budget_bytes)
      throw OutOfMemory(concat("out of memory on fenced: allocating ", size, " bytes of ", mem_category_name(cat),
                               " with ", acc_.s.live_total, " bytes live would exceed the budget of ",
                               acc_.s.budget_bytes, " bytes"));
    const size_t len = mapped(bytes);
    void* p = mmap(nullptr, len, open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw OutOfMemory(concat("out of memory on fenced: mmap of ", len, " bytes failed: ", std::strerror(errno)));
    regions_.emplace(p, len);
    ++acc_.s.num_allocs;
    acc_.add(int64_t(size), cat);
    return p;
  }
  void deallocate(void* ptr, size_t bytes, MemCategory cat) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(ptr);
    MIXPREC_ASSERT(it != regions_.end(), "fenced: freeing a pointer it did not allocate");
    munmap(it->first, it->second);
    regions_.erase(it);
    acc_.remove(int64_t(accounted(bytes)), cat);
  }
  void recategorize(size_t bytes, MemCategory from, MemCategory to) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.move(int64_t(accounted(bytes)), from, to);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return acc_.s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.reset_peak();
  }
  void set_budget(int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    acc_.s.budget_bytes = bytes;
  }
  void empty_cache() override {}  // nothing cached

  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_++ == 0) protect_all(PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_ == 0) protect_all(PROT_NONE);
  }
  bool is_open() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_ > 0;
  }

 private:
  static size_t accounted(size_t bytes) { return ((bytes == 0 ? 1 : bytes) + 63) / 64 * 64; }  // as the CPU's
  static size_t mapped(size_t bytes) { return (accounted(bytes) + page_size() - 1) / page_size() * page_size(); }
  void protect_all(int prot) {
    for (auto& [p, len] : regions_) {
      const int rc = mprotect(p, len, prot);
      MIXPREC_ASSERT(rc == 0, "fenced: mprotect failed: ", std::strerror(errno));
    }
  }

  mutable std::mutex mu_;
  MemoryAccounting acc_;
  std::map<void*, size_t> regions_;  // start -> mapped length
  int open_ = 0;                     // FencedAccess scopes alive
};

FencedAllocator& instance() {
  static auto* a = new FencedAllocator();  // never destroyed, like every allocator
  return *a;
}

}  // namespace

DeviceAllocator& fenced_allocator() { return instance(); }
FencedAccess::FencedAccess() { instance().open(); }
FencedAccess::~FencedAccess() { instance().close(); }
bool fenced_access_open() { return instance().is_open(); }

}  // namespace mixprec::detail
