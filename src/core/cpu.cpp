// CPU feature detection through cpuid and xgetbv.
#include "mixprec/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mixprec::cpu {
namespace {

struct Features {
  bool avx512f = false, avx512_bf16 = false, avx512_fp16 = false, amx_bf16 = false;
};

Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx512f = (b >> 16) & 1;
  f.avx512_fp16 = (d >> 23) & 1;
  const bool amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1;
  if (amx_tile && amx_bf16) {
    // Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM);
    // oneDNN makes the same request. Without it AMX instructions fault.
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

bool has_avx512f() { return features().avx512f; }
bool has_avx512_bf16() { return features().avx512_bf16; }
bool has_avx512_fp16() { return features().avx512_fp16; }
bool has_amx_bf16() { return features().amx_bf16; }

std::string describe() {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : ", ") + std::string(name);
  };
  add(has_avx512f(), "AVX-512");
  add(has_avx512_bf16(), "AVX512-BF16");
  add(has_avx512_fp16(), "AVX512-FP16");
  add(has_amx_bf16(), "AMX-BF16");
  return s.empty() ? "no AVX-512" : s;
}

}  // namespace mixprec::cpu
