// idx files (MNIST format): reading raw or gzip with byte-exact errors, writing, and dataset loading.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "mixprec/data.h"
#include "mixprec/error.h"

namespace mixprec::data {
namespace {

namespace fs = std::filesystem;
using detail::concat;

constexpr uint64_t kMaxElements = uint64_t{1} << 31;  // far above any idx set; catches garbage dims
constexpr size_t kChunkBytes = size_t{1} << 20;       // zlib lengths are 32-bit

const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

std::string hex(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(v));
  return buf;
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads an idx file's bytes, inflating gzip (detected by its magic 1F 8B) or passing raw bytes
// through. inflate is driven directly rather than through gzread: gzread buffers ahead, so it
// cannot say where a corruption is, and it silently ignores junk after the gzip stream.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path), buf_(kBufferBytes) {
    std::error_code ec;
    MIXPREC_CHECK(fs::exists(path, ec), path, ": cannot open idx file: no such file");
    MIXPREC_CHECK(!fs::is_directory(path, ec), path, ": cannot open idx file: is a directory");
    file_ = std::fopen(path.c_str(), "rb");
    MIXPREC_CHECK(file_ != nullptr, path, ": cannot open idx file: ", std::strerror(errno));
    gzip_ = buffer_at_least(2) && buf_[pos_] == 0x1F && buf_[pos_ + 1] == 0x8B;
    if (gzip_ && inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {  // 16: gzip wrapper only
      std::fclose(file_);
      throw Error(concat(path, ": cannot initialise zlib"));
    }
  }
  ~IdxStream() {
    if (gzip_) inflateEnd(&z_);
    std::fclose(file_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  // Reads up to n bytes; returns fewer only at the end of the stream. Throws on corrupt input.
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !ended_) {
      if (pos_ == len_ && !buffer_at_least(1)) {
        cut_short_ = gzip_;  // EOF inside a gzip member; for a raw file it is just the end
        ended_ = true;
        break;
      }
      const size_t avail = len_ - pos_;
      const size_t want = std::min(n - got, kChunkBytes);
      if (!gzip_) {
        const size_t k = std::min(avail, want);
        std::memcpy(dst + got, buf_.data() + pos_, k);
        pos_ += k;
        got += k;
        offset_ += k;
        continue;
      }
      z_.next_in = buf_.data() + pos_;
      z_.avail_in = static_cast<uInt>(avail);
      z_.next_out = dst + got;
      z_.avail_out = static_cast<uInt>(want);
      const int ret = inflate(&z_, Z_NO_FLUSH);
      const size_t consumed = avail - z_.avail_in, produced = want - z_.avail_out;
      pos_ += consumed;
      got += produced;
      offset_ += produced;
      if (ret == Z_STREAM_END) {
        end_of_member();
      } else if (ret == Z_MEM_ERROR) {
        throw Error(concat(path_, ": out of memory while inflating"));
      } else if (ret != Z_OK && !(ret == Z_BUF_ERROR && (consumed || produced))) {
        const std::string reason = z_.msg ? z_.msg : concat("zlib error ", ret);
        throw Error(concat(path_, ": corrupt gzip stream (", reason, ") at byte ", file_offset(), " of the file, byte ",
                           offset_, " of the decompressed stream"));
      }
    }
    return got;
  }

  // Reads to the end of the stream (which also verifies the gzip CRC) and returns the byte count.
  uint64_t drain() {
    std::vector<uint8_t> sink(64 * 1024);
    uint64_t total = 0;
    for (size_t r; (r = read(sink.data(), sink.size())) > 0;) total += r;
    return total;
  }

  // " of the decompressed stream" after an offset, so a user checking with a hex dump of the
  // .gz file does not look at the wrong bytes.
  const char* where() const { return gzip_ ? " of the decompressed stream" : ""; }
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }
  // The stream ended inside a gzip member (the .gz file is cut short), not at a member's end.
  bool cut_short() const { return cut_short_; }

 private:
  static constexpr size_t kBufferBytes = size_t{256} << 10;

  // Makes at least k unread bytes available if the file has them; false at end of file.
  bool buffer_at_least(size_t k) {
    if (len_ - pos_ >= k) return true;
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
    const size_t r = std::fread(buf_.data() + len_, 1, buf_.size() - len_, file_);
    MIXPREC_CHECK(!std::ferror(file_), path_, ": read error at byte ", file_bytes_, ": ", std::strerror(errno));
    len_ += r;
    file_bytes_ += r;
    return len_ - pos_ >= k;
  }

  uint64_t file_offset() const { return file_bytes_ - (len_ - pos_); }

  // A gzip file may hold several concatenated members (gzip -d accepts them); anything else after
  // the last member is corruption, not something to skip silently.
  void end_of_member() {
    if (!buffer_at_least(1)) {
      ended_ = true;
      return;
    }
    MIXPREC_CHECK(buffer_at_least(2) && buf_[pos_] == 0x1F && buf_[pos_ + 1] == 0x8B, path_,
                  ": corrupt gzip file: non-gzip bytes after the end of the gzip stream at byte ", file_offset(),
                  " of the file");
    inflateReset(&z_);
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, len_ = 0;  // unread input is buf_[pos_, len_)
  uint64_t file_bytes_ = 0;   // bytes read from the file so far
  uint64_t offset_ = 0;       // bytes delivered (decompressed, for gzip)
  z_stream z_{};
  bool gzip_ = false;
  bool ended_ = false;
  bool cut_short_ = false;
};

// The tail of a truncation message, e.g. "file ends at byte 1234 of the decompressed stream".
std::string ends_at(const IdxStream& in) {
  return concat("file ends at byte ", in.offset(), in.where(), in.cut_short() ? " (the gzip file is cut short)" : "");
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  IdxStream in(path);
  const std::string& p = in.path();

  uint8_t magic_bytes[4];
  if (in.read(magic_bytes, 4) < 4)
    throw Error(concat(p, ": truncated idx header: expected a 4-byte magic number, ", ends_at(in)));
  const uint32_t magic = load_be32(magic_bytes);
  const uint8_t type_code = magic_bytes[2];
  const int ndims = magic_bytes[3];
  const std::string bad_magic = concat(p, ": bad idx magic ", hex(magic, 8), " at byte 0");
  if (magic_bytes[0] != 0 || magic_bytes[1] != 0)
    throw Error(concat(bad_magic,
                       " (expected 0x0000080N: two zero bytes, type code 0x08, N = 1..4 "
                       "dimensions); not an idx file?"));
  if (type_code != kIdxUint8) {
    const char* name = idx_type_name(type_code);
    if (name)
      throw Error(concat(p, ": idx element type ", hex(type_code, 2), " (", name,
                         ") at byte 2 is not supported (magic ", hex(magic, 8), "; only 0x08 unsigned byte is)"));
    throw Error(
        concat(bad_magic, ": unknown element type ", hex(type_code, 2), " at byte 2 (expected 0x08 unsigned byte)"));
  }
  if (ndims < 1 || ndims > 4) throw Error(concat(bad_magic, ": ", ndims, " dimensions at byte 3 (expected 1..4)"));

  const size_t header_bytes = 4 + 4 * static_cast<size_t>(ndims);
  uint8_t dim_bytes[16];
  if (in.read(dim_bytes, 4 * ndims) < 4 * static_cast<size_t>(ndims))
    throw Error(concat(p, ": truncated idx header: expected ", header_bytes, " bytes for ", ndims, " dimensions, ",
                       ends_at(in)));

  IdxArray out;
  out.type_code = type_code;
  uint64_t elements = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = load_be32(dim_bytes + 4 * d);
    MIXPREC_CHECK(dim != 0, p, ": idx dimension ", d, " is 0 at byte ", 4 + 4 * d);
    elements *= dim;  // <= 2^31 * (2^32 - 1) before the check below: no uint64 overflow
    out.dims.push_back(dim);
    MIXPREC_CHECK(elements <= kMaxElements, p, ": idx dimensions at bytes 4..", header_bytes - 1,
                  " describe more than 2^31 elements (dimension ", d, " is ", dim, "): corrupt header?");
  }

  // Reserve at most 64 MiB up front: a lying header in a short file must not allocate 2 GiB.
  out.data.reserve(std::min<uint64_t>(elements, uint64_t{64} << 20));
  while (out.data.size() < elements) {
    const size_t old = out.data.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(elements - old, uint64_t{16} << 20));
    out.data.resize(old + want);
    const size_t got = in.read(out.data.data() + old, want);
    if (got < want)
      throw Error(concat(p, ": truncated: expected ", elements, " bytes of data after the ", header_bytes,
                         "-byte header, ", ends_at(in)));
  }

  const uint64_t end = in.offset();
  const uint64_t trailing = in.drain();
  if (in.cut_short())
    throw Error(concat(p,
                       ": truncated gzip file: the data is complete but the gzip trailer is "
                       "missing, ",
                       ends_at(in)));
  MIXPREC_CHECK(trailing == 0, p, ": ", trailing, " trailing bytes after the idx data at byte ", end, in.where(),
                " (header says ", elements, " bytes of data after the ", header_bytes, "-byte header)");
  return out;
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  MIXPREC_CHECK(array.type_code == kIdxUint8, path, ": write_idx supports only type 0x08, got ",
                hex(array.type_code, 2));
  MIXPREC_CHECK(!array.dims.empty() && array.dims.size() <= 4, path, ": write_idx needs 1..4 dims, got ",
                array.dims.size());
  uint64_t elements = 1;
  std::vector<uint8_t> header = {0, 0, array.type_code, static_cast<uint8_t>(array.dims.size())};
  for (int64_t d : array.dims) {
    MIXPREC_CHECK(d >= 1 && d <= 0xFFFFFFFFll, path, ": write_idx dimension ", d, " out of range");
    elements *= static_cast<uint64_t>(d);
    MIXPREC_CHECK(elements <= kMaxElements, path, ": write_idx: more than 2^31 elements");
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(d >> shift));
  }
  MIXPREC_CHECK(elements == array.data.size(), path, ": write_idx: dims hold ", elements, " elements but data has ",
                array.data.size());

  const std::string tmp = path + ".tmp";
  gzFile f = gzopen(tmp.c_str(), gzip ? "wb6" : "wbT");  // T: plain write, no compression
  MIXPREC_CHECK(f != nullptr, tmp, ": cannot create: ", std::strerror(errno));
  bool ok = gzwrite(f, header.data(), static_cast<unsigned>(header.size())) == static_cast<int>(header.size());
  for (size_t off = 0; ok && off < array.data.size(); off += kChunkBytes) {
    const unsigned n = static_cast<unsigned>(std::min(kChunkBytes, array.data.size() - off));
    ok = gzwrite(f, array.data.data() + off, n) == static_cast<int>(n);
  }
  ok = (gzclose_w(f) == Z_OK) && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    throw Error(concat(path, ": write failed"));
  }
}

namespace {

// The file for `name` in dir, raw preferred over .gz (it reads faster); empty if neither exists.
std::string find_idx_file(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {name, name + ".gz"})
    if (fs::is_regular_file(dir / candidate, ec)) return (dir / candidate).string();
  return {};
}

bool is_default_dir(const std::string& dir) {
  fs::path a = fs::path(dir).lexically_normal(), b = fs::path(kDefaultDataDir).lexically_normal();
  if (!a.has_filename()) a = a.parent_path();  // "dir/" -> "dir"
  return a == b;
}

}  // namespace

Dataset load_idx_dataset(const std::string& dir, const std::string& split) {
  MIXPREC_CHECK(split == "train" || split == "t10k", "load_idx_dataset: split must be \"train\" or ",
                "\"t10k\", got \"", split, "\"");
  const std::string images_name = split + "-images-idx3-ubyte";
  const std::string labels_name = split + "-labels-idx1-ubyte";
  const std::string images_path = find_idx_file(dir, images_name);
  const std::string labels_path = find_idx_file(dir, labels_name);

  if (images_path.empty() && labels_path.empty()) {
    if (is_default_dir(dir))
      throw Error(concat("no Fashion-MNIST data in ", kDefaultDataDir,
                         ": install it with `apt-get install dataset-fashion-mnist`, or pass "
                         "--data DIR with MNIST-format idx files"));
    std::error_code ec;
    MIXPREC_CHECK(fs::is_directory(dir, ec), "no idx data in ", dir, ": no such directory");
    throw Error(concat("no idx data in ", dir, ": expected ", images_name, "[.gz] and ", labels_name, "[.gz]"));
  }
  MIXPREC_CHECK(!images_path.empty(), dir, ": found ", labels_path, " but no ", images_name, "[.gz]");
  MIXPREC_CHECK(!labels_path.empty(), dir, ": found ", images_path, " but no ", labels_name, "[.gz]");

  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  MIXPREC_CHECK(images.dims.size() == 3, images_path, ": expected 3 dims (count, rows, cols), got ",
                images.dims.size());
  MIXPREC_CHECK(labels.dims.size() == 1, labels_path, ": expected 1 dim (count), got ", labels.dims.size());
  MIXPREC_CHECK(images.dims[0] == labels.dims[0], images_path, " holds ", images.dims[0], " images but ", labels_path,
                " holds ", labels.dims[0], " labels");

  Dataset ds;
  ds.size = images.dims[0];
  ds.rows = images.dims[1];
  ds.cols = images.dims[2];
  for (int64_t i = 0; i < ds.size; ++i)
    MIXPREC_CHECK(labels.data[i] < ds.num_classes, labels_path, ": label ", int{labels.data[i]}, " at index ", i,
                  " (byte ", 8 + i, ") is out of range (expected 0..", ds.num_classes - 1, ")");
  ds.images = std::move(images.data);
  ds.labels = std::move(labels.data);
  ds.source = concat(dir, " (", split, ")");
  return ds;
}

Normalize compute_normalize(const Dataset& dataset) {
  // A histogram makes the sums exact and the pass cheap (47M pixels for Fashion-MNIST train).
  uint64_t hist[256] = {};
  for (uint8_t v : dataset.images) ++hist[v];
  const double count = static_cast<double>(dataset.images.size());
  MIXPREC_CHECK(count > 0, "compute_normalize: dataset ", dataset.source, " has no pixels");
  double sum = 0, sum_sq = 0;
  for (int v = 0; v < 256; ++v) {
    const double x = v / 255.0;
    sum += x * static_cast<double>(hist[v]);
    sum_sq += x * x * static_cast<double>(hist[v]);
  }
  const double mean = sum / count;
  const double var = std::max(0.0, sum_sq / count - mean * mean);
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(var))};
}

}  // namespace mixprec::data
