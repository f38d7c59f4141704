// CPU feature detection through cpuid and xgetbv.
#include "mixprec/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>

namespace mixprec::cpu {
namespace {

struct Features {
  bool avx512f = false, avx512bw = false, avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false;
  bool amd = false;
};

// XCR0: which register states the OS saves on context switch. Read with inline asm so this
// file needs no -mxsave.
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

Features detect() {
  Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    // The vendor string is EBX, EDX, ECX: "AuthenticAMD", or "HygonGenuine" (Zen cores under license).
    f.amd = (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) ||
            (b == 0x6f677948 && d == 0x6e65476e && c == 0x656e6975);
  }
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return f;  // OSXSAVE
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;               // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const unsigned max_sub = a;
  f.avx512f = os_avx512 && ((b >> 16) & 1);
  f.avx512bw = f.avx512f && ((b >> 30) & 1);
  f.avx512_fp16 = f.avx512f && ((d >> 23) & 1);
  const bool amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1;
  if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  if (os_amx && amx_tile && amx_bf16) {
    // Linux hands out the AMX tile data state only on request (arch_prctl
    // ARCH_REQ_XCOMP_PERM); oneDNN makes the same request. Without it AMX instructions fault.
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_bf16 = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

}  // namespace

bool has_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");  // libgcc checks XCR0
  return ok;
}
bool has_avx512f() { return features().avx512f; }
bool has_avx512bw() { return features().avx512bw; }
bool has_avx512_bf16() { return features().avx512_bf16; }
bool has_avx512_fp16() { return features().avx512_fp16; }
bool has_amx_bf16() { return features().amx_bf16; }
bool is_amd() { return features().amd; }
bool bf16_products_outrun_f32() { return has_amx_bf16() || (has_avx512_bf16() && is_amd()); }

std::string describe_bf16_products() {
  if (has_amx_bf16()) return "bf16 products on AMX tiles";
  if (bf16_products_outrun_f32()) return "bf16 products by AVX512-BF16 (AMD: twice f32's flops a cycle)";
  if (has_avx512_bf16()) return "bf16 products in f32: Intel AVX512-BF16 without AMX runs them at f32's rate at best";
  return "bf16 products in f32: no bf16 unit";
}

std::string describe() {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : ", ") + std::string(name);
  };
  add(has_avx2_fma() && !has_avx512f(), "AVX2, FMA");
  add(has_avx512f(), "AVX-512");
  add(has_avx512_bf16(), "AVX512-BF16");
  add(has_avx512_fp16(), "AVX512-FP16");
  add(has_amx_bf16(), "AMX-BF16");
  return s.empty() ? "neither AVX2 nor AVX-512" : s;
}

}  // namespace mixprec::cpu
