// The oneDNN convolution primitives behind cpu/conv.cpp (cpu/conv_entries.cpp): one cached entry
// per shape, dtypes, bias/ReLU flags and pass, with each operand's reorder between the caller's
// NCHW/OIHW buffer (in the caller's dtype) and the primitive's layout; weights reordered once per
// version through a cache; an entry run on the caller's buffers.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/dnnl_conv.h"

namespace mixprec::kernels::cpu::conv_detail {

using dnnl::memory;

// One operand: the caller's dense layout and the primitive's; a reorder between them (user ->
// primitive for inputs, primitive -> user for outputs) when they differ.
struct Operand {
  int arg = 0;
  memory::desc user, prim;
  dnnl::reorder reorder;
  dnnl::primitive_desc_base reorder_pd;
};

struct ConvEntry {
  dnnl::primitive prim;
  dnnl::primitive_desc_base pd;
  std::vector<Operand> inputs, outputs;
  std::string impl;
};

// The cached entry, or nullptr when oneDNN cannot run this convolution (the caller falls back to
// the reference). Creation failures are cached too, as an entry without a primitive.
const ConvEntry* entry(const ConvGeometry& g, DType t, bool has_bias, DType bias_t, ConvPass pass, ConvEntry& holder,
                       bool split = false, bool wgrad_f32 = false, std::optional<DType> in_t = std::nullopt);

// What one convolution call owns: reordered activations and output staging buffers (workspace
// bytes, freed when the call returns), and the reordered inputs a second primitive of the same call
// may reuse (backward-data and backward-weights both read grad_y in the same layout).
struct CallState {
  std::vector<std::unique_ptr<WorkspaceBuffer>> bufs;
  struct Reordered {
    const void* user_ptr;
    memory::desc md;
    memory mem;
    size_t buf;  // its index in bufs
  };
  std::vector<Reordered> reordered;

  memory buffer(const memory::desc& md) {
    bufs.push_back(std::make_unique<WorkspaceBuffer>(md.get_size()));
    return memory(md, dnnl_engine(), bufs.back()->data());
  }
  // The input at user_ptr as reordered earlier in this call, or null.
  const memory* find(const void* user_ptr) const {
    for (const auto& r : reordered)
      if (r.user_ptr == user_ptr) return &r.mem;
    return nullptr;
  }
  // Frees every reordered input but the one at user_ptr, which a later primitive of the call reads.
  void keep_only(const void* user_ptr) {
    std::vector<Reordered> kept;
    for (Reordered& r : reordered)
      if (r.user_ptr == user_ptr)
        kept.push_back(std::move(r));
      else
        bufs[r.buf].reset();
    reordered = std::move(kept);
  }
};

// One input: the user's bytes, and the tensor itself when it is a weight (cached reorder).
struct Input {
  const void* ptr;
  const Tensor* weight = nullptr;
};

// One output: the caller's buffer and its dtype. A 16-bit buffer behind an f32 primitive (the f32
// road) is rounded into by mixprec: from the primitive's layout where it is nChw16c
// (round_nchw16c), else after a reorder into f32 NCHW.
// With `consume`, the output is handed over in the primitive's layout instead (its staging buffer,
// alive for the call): a max pool reads it there (conv2d_forward_max_pool).
struct Output {
  void* ptr;
  DType t = DType::f32;
  std::function<void(const memory&)> consume = nullptr;
};

// Runs the primitive on user buffers: inputs reordered in as needed, outputs staged in the
// primitive's layout and reordered (or rounded) out.
void execute(const ConvEntry& e, const std::vector<Input>& in, const std::vector<Output>& out, CallState& cs);

}  // namespace mixprec::kernels::cpu::conv_detail
