// What this CPU can do, for choosing a precision (`--precision auto`) and reporting it.
#pragma once
#include <string>

namespace mixprec::cpu {
bool has_avx2_fma();  // AVX2 and FMA (the fast kernels' fallback on CPUs without AVX-512: AMD Zen 2, Intel client
                      // cores)
bool has_avx512f();
bool has_avx512bw();  // with AVX-512F: 8- and 16-bit lanes (every AVX-512 CPU since Skylake-SP; not Knights Landing)
bool has_avx512_bf16();
bool has_avx512_fp16();
bool has_amx_bf16();     // also checks that the OS enabled the AMX tile state
std::string describe();  // e.g. "AVX-512, AVX512-BF16, AVX512-FP16, AMX-BF16", or "AVX2, FMA"
}  // namespace mixprec::cpu
