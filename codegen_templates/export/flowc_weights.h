// The loader of an exported job's `.weights` file (the format: compiler/export/weights.py, which
// writes it).  Job-independent: the generated API (model.cpp.j2) passes the variables its step was
// compiled for, and the loader checks the file against them before it copies any byte.
//
// The order of the checks (each failure is one error code and one message, never an exception or
// an abort): the header's length, magic, version and offsets (a file shorter than its header says
// is TRUNCATED); the CRC-32 of the table and the data; then each table entry (its bounds, dtype
// code, a name the job declares, not twice, the dtype and shape the job compiled for, its data
// inside the file); every variable present; and only then the copy into the instance's buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the weights file is little-endian, as is this loader");

namespace flowc_export {

constexpr char kMagic[8] = {'F', 'L', 'O', 'W', 'C', 'W', 'T', 'S'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kAlign = 64;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint32_t kMaxRank = 8;

// The error codes, as compiler/export/weights.py ERROR_CODES numbers them (the header re-exports them).
enum Code : int {
  kOk = 0, kErrArgument = 1, kErrIo = 2, kErrTruncated = 3, kErrMagic = 4, kErrVersion = 5, kErrVariable = 6,
  kErrShape = 7, kErrDtype = 8, kErrRange = 9, kErrChecksum = 10, kErrMemory = 11, kErrStep = 12, kErrInternal = 13
};

struct Status {
  int code = kOk;
  std::string message;
};

inline Status fail(int code, std::string message) { return Status{code, std::move(message)}; }

// What the compiled step expects of one variable.
struct Expected {
  const char* name;       // UTF-8, NUL-terminated (an escaped literal in the generated table)
  uint32_t name_len;
  uint32_t dtype;
  uint32_t rank;
  const uint64_t* dims;
  uint64_t nbytes;
  uint64_t dst_offset;    // where it goes in the instance's weights buffer
};

// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): zlib's crc32, which the writer uses.
struct CrcTable {
  uint32_t v[256];
  constexpr CrcTable() : v() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      v[i] = c;
    }
  }
};

inline uint32_t crc32(const unsigned char* p, uint64_t n) {
  static constexpr CrcTable table;
  uint32_t c = 0xFFFFFFFFu;
  for (uint64_t i = 0; i < n; ++i) c = table.v[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

template <class T>
inline T read_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline std::string quoted(const unsigned char* p, uint32_t n) {
  // A name from the file, for a message: printable ASCII kept, every other byte as \xNN.
  static const char hex[] = "0123456789abcdef";
  std::string s = "'";
  for (uint32_t i = 0; i < n && i < 200; ++i) {
    const unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') s += static_cast<char>(c);
    else { s += "\\x"; s += hex[c >> 4]; s += hex[c & 15]; }
  }
  return s + (n > 200 ? "...'" : "'");
}

inline std::string shape_text(uint32_t rank, const uint64_t* dims) {
  std::string s = "[";
  for (uint32_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Check `blob` (`size` bytes) against the `count` expected variables and copy each into `dst`.
inline Status load(const unsigned char* blob, uint64_t size, const Expected* expected, uint32_t count,
                   unsigned char* dst, const char* dtype_names[]) {
  if (size < kHeaderBytes)
    return fail(kErrTruncated, std::to_string(size) + " bytes, shorter than the 64-byte header");
  if (std::memcmp(blob, kMagic, sizeof kMagic) != 0)
    return fail(kErrMagic, "not a flowc weights file (its first 8 bytes are not \"FLOWCWTS\")");
  const uint32_t version = read_le<uint32_t>(blob + 8);
  if (version != kVersion)
    return fail(kErrVersion, "format version " + std::to_string(version) + ", this library reads version " +
                              std::to_string(kVersion));
  const uint32_t file_count = read_le<uint32_t>(blob + 12);
  const uint64_t table_offset = read_le<uint64_t>(blob + 16), table_size = read_le<uint64_t>(blob + 24);
  const uint64_t data_offset = read_le<uint64_t>(blob + 32), data_size = read_le<uint64_t>(blob + 40);
  const uint32_t checksum = read_le<uint32_t>(blob + 48);
  // Offsets are compared by subtraction from the size, never by sums that could wrap around.
  if (table_offset != kHeaderBytes || table_size > size || data_offset % kAlign != 0 ||
      data_offset < table_offset + table_size)
    return fail(kErrRange, "the table (offset " + std::to_string(table_offset) + ", " + std::to_string(table_size) +
                            " bytes) or the data offset " + std::to_string(data_offset) + " is out of range");
  if (data_offset > size || data_size > size - data_offset)
    return fail(kErrTruncated, std::to_string(size) + " bytes, but the header says the data ends at byte " +
                                std::to_string(data_offset) + " + " + std::to_string(data_size));
  const uint32_t found_crc = crc32(blob + table_offset, data_offset + data_size - table_offset);
  if (found_crc != checksum)
    return fail(kErrChecksum, "checksum mismatch: CRC-32 " + std::to_string(found_crc) + ", the header says " +
                               std::to_string(checksum) + " (the file is corrupt)");
  // Unknown and missing variables are named below, so the file's count is only a bound on the loop
  // (each entry takes at least 16 bytes of the checked table).
  std::vector<bool> seen(count, false);
  struct Found { uint64_t offset, nbytes; };
  std::vector<Found> found(count, Found{0, 0});
  uint64_t at = table_offset;
  const uint64_t end = table_offset + table_size;
  for (uint32_t e = 0; e < file_count; ++e) {
    if (end - at < 16) return fail(kErrRange, "the table ends inside entry " + std::to_string(e));
    const uint32_t name_len = read_le<uint32_t>(blob + at), dtype = read_le<uint32_t>(blob + at + 4);
    const uint32_t rank = read_le<uint32_t>(blob + at + 8);
    at += 16;
    if (rank > kMaxRank || name_len > kMaxNameBytes || end - at < 8ull * rank + 16 + name_len)
      return fail(kErrRange, "table entry " + std::to_string(e) + ": rank " + std::to_string(rank) +
                              " or name length " + std::to_string(name_len) + " out of range");
    uint64_t dims[kMaxRank];
    for (uint32_t d = 0; d < rank; ++d) dims[d] = read_le<uint64_t>(blob + at + 8 * d);
    const uint64_t offset = read_le<uint64_t>(blob + at + 8 * rank), nbytes = read_le<uint64_t>(blob + at + 8 * rank + 8);
    const unsigned char* name = blob + at + 8 * rank + 16;
    const uint64_t used = 16 + 8ull * rank + 16 + name_len;
    at += (used + 7) / 8 * 8 - 16;
    if (at > end) at = end;
    uint32_t v = 0;
    while (v < count && !(expected[v].name_len == name_len && std::memcmp(expected[v].name, name, name_len) == 0)) ++v;
    if (v == count) return fail(kErrVariable, "variable " + quoted(name, name_len) + " is not a variable of this model");
    const Expected& x = expected[v];
    if (seen[v]) return fail(kErrVariable, "variable " + quoted(name, name_len) + " appears twice");
    seen[v] = true;
    if (dtype != x.dtype) {
      const std::string got = dtype >= 1 && dtype <= 7 ? dtype_names[dtype] : "code " + std::to_string(dtype);
      return fail(kErrDtype, "variable " + quoted(name, name_len) + " has dtype " + got + ", the model expects " +
                              dtype_names[x.dtype]);
    }
    if (rank != x.rank || std::memcmp(dims, x.dims, 8ull * rank) != 0)
      return fail(kErrShape, "variable " + quoted(name, name_len) + " has shape " + shape_text(rank, dims) +
                              ", the model expects " + shape_text(x.rank, x.dims));
    if (nbytes != x.nbytes || offset % kAlign != 0 || offset > data_size || nbytes > data_size - offset)
      return fail(kErrRange, "variable " + quoted(name, name_len) + ": " + std::to_string(nbytes) + " bytes at offset " +
                              std::to_string(offset) + " do not fit the " + std::to_string(data_size) +
                              " data bytes (or are not the " + std::to_string(x.nbytes) + " bytes of its shape)");
    found[v] = Found{offset, nbytes};
  }
  for (uint32_t v = 0; v < count; ++v)
    if (!seen[v]) return fail(kErrVariable, std::string("variable '") + expected[v].name + "' is missing");
  for (uint32_t v = 0; v < count; ++v)
    std::memcpy(dst + expected[v].dst_offset, blob + data_offset + found[v].offset, found[v].nbytes);
  return Status{};
}

}  // namespace flowc_export
