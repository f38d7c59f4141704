// safetensors headers: the dtype table, the checked parser and the encoder (layout: the .h).
#include "io/safetensors_header.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "mixprec/error.h"

namespace mixprec::io::detail {
namespace {

// json, not ordered_json: ordered_json finds a key by linear search, which makes a header of a
// million names quadratic. The header's order is recorded while parsing instead.
using Json = nlohmann::json;
using mixprec::detail::concat;

// The data is copied as it lies in memory; a big-endian host would need a byte swap per element.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

struct DtypeInfo {
  std::string_view name;
  std::optional<DType> dtype;  // nullopt: a dtype of the format that mixprec does not have yet
};

// Every dtype of the format (the reference implementation's list).
constexpr DtypeInfo kDtypes[] = {
    {"F64", DType::f64},       {"F32", DType::f32},       {"BF16", DType::bf16},     {"F16", DType::f16},
    {"I64", DType::i64},       {"U8", DType::u8},         {"F8_E4M3", std::nullopt}, {"F8_E5M2", std::nullopt},
    {"F8_E8M0", std::nullopt}, {"F6_E2M3", std::nullopt}, {"F6_E3M2", std::nullopt}, {"F4", std::nullopt},
    {"BOOL", std::nullopt},    {"I8", std::nullopt},      {"I16", std::nullopt},     {"U16", std::nullopt},
    {"I32", std::nullopt},     {"U32", std::nullopt},     {"U64", std::nullopt},     {"C64", std::nullopt},
};
constexpr const char* kSupported = "mixprec reads F64, F32, BF16, F16, I64, U8";
constexpr const char* kMetadataKey = "__metadata__";

// A string from the file made safe for a one-line message: control bytes (and, inside quotes,
// quotes and backslashes) as \xNN, and a long one cut at a character boundary.
std::string escaped(std::string_view s, bool in_quotes) {
  constexpr size_t kMaxBytes = 120;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (i >= kMaxBytes && (c & 0xC0) != 0x80) {
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7F || (in_quotes && (c == '\'' || c == '\\'))) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string quote_text(std::string_view s) {
  std::string out = "'";  // appended, not "'" + ...: GCC 12 warns falsely on that (-Wrestrict)
  out += escaped(s, true);
  out += '\'';
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += concat(i ? ", " : "", shape[i]);
  return s + "]";
}

// The reason from an nlohmann exception, without its "[json.exception.parse_error.101] " tag and
// "parse error at line 1, column 12: " prefix (the caller gives the byte offset), as one bounded line.
std::string json_reason(const std::string& what) {
  const size_t tag = what.rfind("[json.exception.", 0) == 0 ? what.find("] ") : std::string::npos;
  size_t start = tag == std::string::npos ? 0 : tag + 2;
  if (what.compare(start, 15, "parse error at ") == 0 && what.find(": ", start) != std::string::npos)
    start = what.find(": ", start) + 2;
  return escaped(std::string_view(what).substr(start), false);
}

class HeaderParser {
 public:
  HeaderParser(const uint8_t* bytes, size_t size, const std::string& path) : bytes_(bytes), size_(size), path_(path) {}

  Header parse() {
    if (size_ < 8)
      fail("truncated safetensors file: ", size_, " bytes, shorter than the 8-byte header length at byte 0");
    uint64_t n = 0;
    std::memcpy(&n, bytes_, 8);
    if (n > kMaxHeaderBytes)
      fail("header length ", n, " at byte 0 is larger than the limit of ", kMaxHeaderBytes,
           " bytes (not a safetensors file?)");
    if (n > size_ - 8)
      fail("header length ", n, " at byte 0 runs past the end of the file (", size_, " bytes): truncated file?");
    n_ = n;
    out_.data_start = 8 + n;
    data_bytes_ = size_ - out_.data_start;
    const char* text = reinterpret_cast<const char*>(bytes_) + 8;
    if (n == 0 || text[0] != '{') fail("the header at byte 8 does not start with '{' (not a safetensors file?)");

    std::vector<std::string> names;  // in header order
    const Json root = parse_json(text, names);
    for (const std::string& name : names) {
      const Json& value = *root.find(name);
      if (name == kMetadataKey)
        read_metadata(value);
      else
        out_.tensors.push_back(read_entry(name, value));
    }
    check_coverage();
    return std::move(out_);
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw Error(concat(path_, ": ", args...));
  }

  std::string header_bytes() const { return concat("(bytes 8..", 7 + n_, ")"); }

  // The file offset of a data offset, as text (a lying offset may not fit in 64 bits with 8 + N).
  std::string file_byte(uint64_t data_offset) const {
    if (data_offset > std::numeric_limits<uint64_t>::max() - out_.data_start)
      return concat(out_.data_start, " + ", data_offset);
    return concat(out_.data_start + data_offset);
  }

  // The JSON object, with duplicate names refused (nlohmann would keep the last silently); names
  // gets the top-level names in header order.
  Json parse_json(const char* text, std::vector<std::string>& names) const {
    std::set<std::string> seen, fields;
    std::string current, duplicate;
    auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (event != Json::parse_event_t::key || !duplicate.empty()) return true;
      const auto& key = parsed.get_ref<const std::string&>();
      if (depth == 1) {
        if (!seen.insert(key).second) duplicate = concat(key == kMetadataKey ? "" : "tensor ", quote_text(key));
        names.push_back(key);
        current = key;
        fields.clear();
      } else if (depth == 2 && !fields.insert(key).second) {
        duplicate =
            concat(current == kMetadataKey ? "__metadata__ key " : concat("tensor ", quote_text(current), ": field "),
                   quote_text(key));
      }
      return true;
    };
    Json root;
    try {
      root = Json::parse(text, text + n_, on_event);
    } catch (const Json::parse_error& e) {
      fail("the header is not valid JSON at byte ", 8 + (e.byte ? e.byte - 1 : 0), ": ", json_reason(e.what()));
    } catch (const Json::exception& e) {  // e.g. out_of_range: a number too large for a double (1e999)
      fail("the header ", header_bytes(), " is not valid JSON: ", json_reason(e.what()));
    }
    if (!duplicate.empty()) fail(duplicate, " appears twice in the header ", header_bytes());
    if (!root.is_object()) fail("the header ", header_bytes(), " is not a JSON object");
    return root;
  }

  void read_metadata(const Json& value) {
    if (!value.is_object()) fail("__metadata__ in the header ", header_bytes(), " is not an object of strings");
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) fail("__metadata__ ", quote_text(key), " in the header ", header_bytes(), " is not a string");
      out_.metadata.emplace(key, v.get<std::string>());
    }
  }

  HeaderEntry read_entry(const std::string& name, const Json& value) const {
    const std::string in_header = concat("tensor ", quote_text(name), " in the header ", header_bytes(), ": ");
    if (!value.is_object()) fail(in_header, "the entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) fail(in_header, "no \"", field, "\"");
    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(in_header, "data_offsets is not [begin, end] with non-negative integers");
    HeaderEntry e;
    e.name = name;
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const std::string at = concat("tensor ", quote_text(name), " at byte ", file_byte(e.begin), ": ");
    if (e.begin > e.end) fail(at, "data_offsets [", e.begin, ", ", e.end, "] end before they begin");
    if (e.end > data_bytes_)
      fail(at, "data_offsets [", e.begin, ", ", e.end, "] run past the end of the data (", data_bytes_,
           " bytes from byte ", out_.data_start, "; the file is ", size_, " bytes): truncated file?");

    const Json& dtype = value["dtype"];
    if (!dtype.is_string()) fail(at, "dtype is not a string");
    const auto& dtype_name = dtype.get_ref<const std::string&>();
    const auto* info =
        std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeInfo& d) { return d.name == dtype_name; });
    if (info == std::end(kDtypes)) fail(at, "unknown dtype ", quote_text(dtype_name), " (", kSupported, ")");
    if (!info->dtype) fail(at, "dtype ", dtype_name, " is not supported yet (", kSupported, ")");
    e.dtype = *info->dtype;

    const Json& shape = value["shape"];
    if (!shape.is_array()) fail(at, "shape is not an array");
    // Elements as a running product that must fit in int64 (Shape's type), then bytes in uint64.
    uint64_t numel = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!shape[d].is_number_unsigned()) fail(at, "shape entry ", d, " is not a non-negative integer");
      const auto dim = shape[d].get<uint64_t>();
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, dim, &numel) ||
          numel > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(at, "shape entry ", d, " (", dim, ") makes the element count overflow 64 bits");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &bytes))
      fail(at, "dtype ", dtype_name, " and shape ", shape_text(e.shape), " take more than 2^64 bytes");
    if (bytes != e.end - e.begin)
      fail(at, "dtype ", dtype_name, " and shape ", shape_text(e.shape), " take ", bytes, " bytes, but data_offsets [",
           e.begin, ", ", e.end, "] hold ", e.end - e.begin);
    return e;
  }

  // Sorted by offset, the ranges must tile the data: each begins where the previous ended, the
  // last ends at the end of the file (the format forbids holes, so no file can hide bytes).
  void check_coverage() {
    std::stable_sort(out_.tensors.begin(), out_.tensors.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    const HeaderEntry* prev = nullptr;
    for (const HeaderEntry& e : out_.tensors) {
      if (e.begin > pos)
        fail("bytes ", file_byte(pos), "..", file_byte(e.begin - 1), " (data_offsets ", pos, "..", e.begin - 1,
             ") before tensor ", quote_text(e.name), " are not part of any tensor (the format allows no gaps)");
      if (e.begin < pos)
        fail("tensor ", quote_text(e.name), " at byte ", file_byte(e.begin), ": data_offsets [", e.begin, ", ", e.end,
             "] overlap tensor ", quote_text(prev->name), " [", prev->begin, ", ", prev->end, "]");
      pos = e.end;
      prev = &e;
    }
    if (pos != data_bytes_)
      fail(data_bytes_ - pos, " bytes at byte ", file_byte(pos), " after the last tensor",
           prev ? concat(" ", quote_text(prev->name)) : std::string(),
           " are not part of any tensor (the data must end where the last tensor ends)");
  }

  const uint8_t* bytes_;
  size_t size_;
  const std::string& path_;
  uint64_t n_ = 0;           // header length
  uint64_t data_bytes_ = 0;  // bytes after the header
  Header out_;
};

// A string the header will hold: JSON strings are UTF-8, so anything else is refused here, naming it.
void check_utf8(const std::string& s, const std::string& path, const char* what) {
  try {
    (void)Json(s).dump();
  } catch (const Json::type_error&) {
    throw Error(concat(path, ": cannot save: ", what, " ", quote_text(s), " is not valid UTF-8"));
  }
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  MIXPREC_ASSERT(false, "no safetensors name for dtype ", dtype_name(dtype));
  return {};
}

Header parse_header(const uint8_t* bytes, size_t size, const std::string& path) {
  return HeaderParser(bytes, size, path).parse();
}

std::string encode_header(const std::vector<EntrySpec>& tensors, const std::map<std::string, std::string>& metadata,
                          const std::string& path) {
  // The top-level object is written piece by piece, in the given order (a Json object would sort
  // the names, an ordered_json one finds each by linear search).
  std::string json = "{";
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [key, value] : metadata) {
      check_utf8(key, path, "metadata key");
      check_utf8(value, path, "the value of metadata key");
      m[key] = value;
    }
    json += concat("\"", kMetadataKey, "\":", m.dump());
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const EntrySpec& t : tensors) {
    const std::string name(t.name);
    MIXPREC_CHECK(name != kMetadataKey, path, ": cannot save a tensor named '", kMetadataKey,
                  "': the format keeps that name for the metadata");
    check_utf8(name, path, "tensor name");
    MIXPREC_CHECK(names.insert(t.name).second, path, ": cannot save: tensor ", quote_text(name), " is named twice");
    if (json.size() > 1) json += ',';
    // The reference writer's field order.
    json += concat(Json(name).dump(), ":{\"dtype\":\"", safetensors_dtype_name(t.dtype),
                   "\",\"shape\":", Json(*t.shape).dump(), ",\"data_offsets\":[", offset, ",", offset + t.bytes, "]}");
    offset += t.bytes;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  MIXPREC_CHECK(json.size() <= kMaxHeaderBytes, path, ": cannot save: the header would take ", json.size(),
                " bytes, more than the format's limit of ", kMaxHeaderBytes);
  const uint64_t n = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

}  // namespace mixprec::io::detail
