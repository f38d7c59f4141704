// Checkpoint files: safetensors reading and writing (the format PyTorch's ecosystem shares).
// Layout, validation and atomic writes: docs/design.md, "Checkpoint files".
#pragma once
#include <map>
#include <string>

#include "mixprec/state_dict.h"

namespace mixprec::io {

// What a safetensors file holds: the tensors in file order (by data offset) and the header's
// optional "__metadata__" string map.
struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
};

// Writes tensors (in the given order, contiguous, little-endian) and metadata to path, atomically:
// a temporary file in path's directory is written, synced and renamed over path, so path holds
// either its previous content or the whole new file, even if the process is killed. Every dtype
// is stored as itself (f64 F64, f32 F32, bf16 BF16, f16 F16, i64 I64, u8 U8). Throws mixprec::Error
// (one line naming the file and the tensor) on a bad name, an undefined tensor or a failed write;
// path is then left as it was.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file, written by mixprec or by any other writer (tensors in any order in
// the header, header padding, extra metadata). The whole file is checked before any tensor is
// made; a bad file throws mixprec::Error, one line naming the file, the tensor and the byte offset.
// F8_E4M3, F8_E5M2 and the format's other dtypes are recognised and refused ("not supported yet").
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace mixprec::io
