// libFuzzer target: the safetensors header parser on arbitrary bytes. Besides crashes and
// sanitizer reports it checks what the parser promises: errors are one line, and an accepted
// file's tensors hold the bytes their dtype and shape need, tile its data exactly and survive
// re-encoding unchanged.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/safetensors_header.h"
#include "mixprec/error.h"

namespace {

using namespace mixprec::io::detail;

bool same(const Header& a, const Header& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const HeaderEntry &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin || x.end != y.end)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.st";
  Header header;
  try {
    header = parse_header(data, size, path);
  } catch (const mixprec::Error& e) {
    if (std::strchr(e.what(), '\n')) std::abort();  // every error is one line
    return 0;
  }
  // The tensors tile the data in file order; reading every byte lets ASan see a range outside it.
  uint64_t pos = 0, sum = 0;
  for (const HeaderEntry& t : header.tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (t.begin != pos || numel * mixprec::dtype_size(t.dtype) != t.end - t.begin) std::abort();
    for (uint64_t i = t.begin; i < t.end; ++i) sum += data[header.data_start + i];
    pos = t.end;
  }
  if (header.data_start + pos != size) std::abort();

  // What the writer makes of the same tensors parses back to the same header.
  std::vector<EntrySpec> specs;
  for (const HeaderEntry& t : header.tensors) specs.push_back({t.name, t.dtype, &t.shape, t.end - t.begin});
  std::string again = encode_header(specs, header.metadata, path);
  again.append(reinterpret_cast<const char*>(data) + header.data_start, size - header.data_start);
  if (!same(header, parse_header(reinterpret_cast<const uint8_t*>(again.data()), again.size(), path))) std::abort();
  return sum == 0xFFFFFFFFFFFFFFFFull ? 1 : 0;  // uses sum, so the reads stay
}
