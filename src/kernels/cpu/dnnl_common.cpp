// oneDNN engine/stream, dtype mapping, user scratchpads and CPU feature queries (see dnnl_common.h).
#include "kernels/cpu/dnnl_common.h"

#include <cpuid.h>

#include "mixprec/allocator.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {
namespace {

// XCR0: which register states the OS saves on context switch. Read with inline asm so this
// file needs no -mxsave.
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

struct CpuFeatures {
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
};

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return f;  // OSXSAVE
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;          // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx512f = b & (1u << 16);
  const bool amx_bf16 = d & (1u << 22);
  const bool amx_tile = d & (1u << 24);
  const unsigned max_sub = a;
  f.amx_bf16 = os_amx && amx_bf16 && amx_tile;
  if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
    f.avx512_bf16 = os_avx512 && avx512f && (a & (1u << 5));
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& dnnl_stream() {
  static dnnl::stream strm(dnnl_engine());
  return strm;
}

dnnl::memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: break;
  }
  MIXPREC_ASSERT(false, "no oneDNN data type for ", dtype_name(t));
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool has_avx512_bf16() { return features().avx512_bf16; }
bool has_amx_bf16() { return features().amx_bf16; }

std::string dnnl_isa_name() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::all: return "all";
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx2_vnni: return "avx2_vnni";
    case isa::avx512_mic: return "avx512_mic";
    case isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_amx: return "avx512_core_amx";
  }
  return "unknown";
}

WorkspaceBuffer::WorkspaceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) ptr_ = allocator::allocate(bytes_, MemCategory::workspace);
}

WorkspaceBuffer::~WorkspaceBuffer() {
  if (ptr_ != nullptr) allocator::deallocate(ptr_, bytes_, MemCategory::workspace);
}

Scratchpad::Scratchpad(const dnnl::primitive_desc_base& pd) : buf_(pd.scratchpad_desc().get_size()) {
  if (buf_.bytes() > 0) mem_ = dnnl::memory(pd.scratchpad_desc(), dnnl_engine(), buf_.data());
}

void Scratchpad::add_to(std::unordered_map<int, dnnl::memory>& args) const {
  if (buf_.bytes() > 0) args.insert_or_assign(DNNL_ARG_SCRATCHPAD, mem_);
}

}  // namespace mixprec::kernels::cpu
