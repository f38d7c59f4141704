// The safetensors header: encoding one, and parsing and checking one against the file's bytes.
// Pure byte work with no tensors, so the fuzz target (tests/fuzz/) links it alone.
//
// File layout (the format's specification):
//   bytes 0..7      N, the header's length, a little-endian u64
//   bytes 8..8+N-1  UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//                   optional "__metadata__": {string: string}}, which may end in spaces
//   bytes 8+N..     the data; a tensor's bytes are [8+N+begin, 8+N+end), row-major, little-endian
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixprec/dtype.h"

namespace mixprec::io::detail {

// The reference implementation's limit (100 MB): a real header is a few MB at most.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The format's name of a dtype ("F32", "BF16", ...).
std::string_view safetensors_dtype_name(DType dtype);

// A tensor's header entry, checked: dtype, shape and byte count agree, the range lies in the data.
struct HeaderEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: relative to data_start
};

struct Header {
  std::vector<HeaderEntry> tensors;  // in file order (by data offset; header order among empty ones)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N
};

// Parses the header of the safetensors file held in bytes[0, size) and checks all of it: the header
// length against the size and kMaxHeaderBytes, the JSON, every entry, that the tensors' ranges
// cover the data exactly once (no gap, no overlap, nothing after the last). Throws mixprec::Error,
// one line naming path, the tensor and the byte offset.
Header parse_header(const uint8_t* bytes, size_t size, const std::string& path);

// What a writer stores for one tensor.
struct EntrySpec {
  std::string_view name;
  DType dtype;
  const std::vector<int64_t>* shape;
  uint64_t bytes;
};

// The header's bytes for tensors stored one after another in the given order: the 8-byte length,
// then the JSON padded with spaces to a multiple of 8 bytes (as the reference writer does, so the
// data starts 8-byte aligned). Throws mixprec::Error naming path and the tensor on a name the format
// cannot hold (duplicate, "__metadata__", not UTF-8).
std::string encode_header(const std::vector<EntrySpec>& tensors, const std::map<std::string, std::string>& metadata,
                          const std::string& path);

}  // namespace mixprec::io::detail
