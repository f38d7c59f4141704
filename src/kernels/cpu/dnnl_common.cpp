// oneDNN engine/stream, dtype mapping, user scratchpads and CPU feature queries (see dnnl_common.h).
#include "kernels/cpu/dnnl_common.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "mixprec/allocator.h"
#include "mixprec/cpu.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {

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
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    default:
      break;
  }
  MIXPREC_ASSERT(false, "no oneDNN data type for ", dtype_name(t));
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool has_avx512_bf16() { return mixprec::cpu::has_avx512_bf16(); }
bool has_amx_bf16() { return mixprec::cpu::has_amx_bf16(); }
bool bf16_unit() { return has_avx512_bf16() || has_amx_bf16(); }

namespace {
std::atomic<Bf16Products>& bf16_products() {
  static std::atomic<Bf16Products> p{[] {
    const char* env = std::getenv("MIXPREC_BF16_PRODUCTS");
    const std::string_view v = env != nullptr ? env : "";
    return v == "native" ? Bf16Products::native : v == "f32" ? Bf16Products::f32 : Bf16Products::host_rule;
  }()};
  return p;
}
}  // namespace

bool by_size_kind() { return bf16_unit() && !mixprec::cpu::bf16_products_outrun_f32(); }

Bf16Math bf16_math() {
  if (!bf16_unit()) return Bf16Math::f32;
  switch (bf16_products().load()) {
    case Bf16Products::native:
      return Bf16Math::native;
    case Bf16Products::f32:
      return Bf16Math::f32;
    case Bf16Products::host_rule:
      break;
  }
  return by_size_kind() ? Bf16Math::by_size : Bf16Math::native;
}
bool bf16_in_f32(bool large) {
  const Bf16Math m = bf16_math();
  return m == Bf16Math::f32 || (m == Bf16Math::by_size && large);
}

Bf16Products set_bf16_products(Bf16Products p) { return bf16_products().exchange(p); }

std::string dnnl_isa_name() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::all:
      return "all";
    case isa::sse41:
      return "sse41";
    case isa::avx:
      return "avx";
    case isa::avx2:
      return "avx2";
    case isa::avx2_vnni:
      return "avx2_vnni";
    case isa::avx512_mic:
      return "avx512_mic";
    case isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case isa::avx512_core:
      return "avx512_core";
    case isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case isa::avx512_core_amx:
      return "avx512_core_amx";
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
