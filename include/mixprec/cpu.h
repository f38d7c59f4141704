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
bool has_amx_bf16();  // also checks that the OS enabled the AMX tile state
bool is_amd();        // the vendor string is AuthenticAMD (or Hygon's, the same cores)
// Whether this CPU's bf16 products outrun its f32 ones, so that a 16-bit matmul or convolution is
// worth computing in bf16: AMX-BF16, or AVX512-BF16 on AMD (Zen 4 and 5 issue VDPBF16PS, 32 products
// into 16 lanes, at VFMADD's rate: twice the flops a cycle). Not Intel's AVX512-BF16 without AMX
// (Cooper Lake, or a Sapphire/Emerald Rapids whose hypervisor hides AMX): VDPBF16PS issues on one
// port where FMA has two, the same flops a cycle, and oneDNN 2.6's bf16 GEMM ran at 0.56-0.76x its
// f32 one on such a host (docs/hosts.md). Where false, bf16 is stored in bf16 and computed in f32.
bool bf16_products_outrun_f32();
std::string describe();  // e.g. "AVX-512, AVX512-BF16, AVX512-FP16, AMX-BF16", or "AVX2, FMA"
// Where bf16 products are computed and why, e.g. "bf16 products in f32: Intel AVX512-BF16 without AMX".
std::string describe_bf16_products();
}  // namespace mixprec::cpu
