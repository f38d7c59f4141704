// 16-bit products computed in f32 (kernels/cpu/matmul.cpp's f32 road) in cache-sized blocks.
#pragma once
#include "kernels/matmul.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cpu {

// dst = a @ b as matmul() defines it, for bf16 or f16 operands (dst in their dtype, or f32),
// widened to f32 and multiplied by oneDNN's f32 kernel one block at a time: each thread of one
// OpenMP region widens a block of rows of a (or, for a weight gradient, a chunk of the shared
// dimension of both operands, or of a batch too long for a partial sum per chunk, each chunk's
// rows against the thread's own columns of dst; or, where b is the larger operand, a block of b's
// columns) into its own buffer, runs a one-thread product on it and rounds its block of the
// result, so that the f32 copies stay in the thread's cache instead of three whole-tensor passes
// through memory around one multi-threaded product, and the memory a step holds stays near the
// native bf16 products' (`max-batch`). Values: each element an f32 accumulation of the exact products, rounded
// once, as the whole-tensor road gives. False (nothing written) for a shape it does not take: rank
// 3, strided rows, small products.
bool matmul_widened(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o);

// Probe and test hook: off makes matmul_widened decline every shape (the whole-tensor road runs).
// Process-wide; returns the previous setting.
bool set_matmul_widened(bool on);
// Probe hook: off keeps matmul_widened from splitting a product by b's columns (it takes the
// shape by rows or chunks, or declines, as it did before it had columns). Returns the previous.
bool set_matmul_widened_columns(bool on);
// Test hook: how a product by rows of a holds b where b is not transposed: as the host's rule says
// (as [n, k] where the pieces' product is oneDNN's gemm:jit, else as given), as given ([k, n]), or
// as [n, k]. The same values either way. Returns the previous setting.
enum class WidenedB { host_rule, given, rows };
WidenedB set_matmul_widened_b(WidenedB how);

}  // namespace mixprec::kernels::cpu
