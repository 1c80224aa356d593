// safetensors reader/writer (safetensors.h). The JSON is small and flat, so
// nlohmann-json handles it; tensor bytes are copied straight from the file.
// A file may come from anywhere, so the whole header (dtypes, shapes, byte
// sizes, offsets, metadata, duplicate names) is validated before any tensor
// is allocated: a hostile file is an IoError naming the file and the field.
#include "brisk/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/core/json_excerpt.h"

namespace brisk::core {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u16: return "U16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
  }
  return "?";
}

using Json = nlohmann::json;

// A header field of a file that may come from anywhere: everything below is
// checked before a single tensor byte is allocated, and every complaint names
// the file, the tensor and the field.
[[noreturn]] void bad_entry(const std::string& path, const std::string& name, const std::string& what) {
  throw IoError(path + ": tensor '" + name + "': " + what);
}

// The value of a non-negative JSON integer, or nothing (negative, fractional,
// not a number). nlohmann stores non-negative integers as unsigned.
std::optional<uint64_t> as_count(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

DType parse_st_dtype(const Json& v, const std::string& path, const std::string& name) {
  std::string allowed;
  for (int i = 0; i < kNumDTypes; ++i) allowed += std::string(i ? ", " : "") + st_dtype(DType(i));
  if (!v.is_string()) bad_entry(path, name, "'dtype' must be a string (" + allowed + "), got " + json_excerpt(v));
  for (int i = 0; i < kNumDTypes; ++i)
    if (v.get<std::string>() == st_dtype(DType(i))) return DType(i);
  bad_entry(path, name, "unsupported dtype '" + v.get<std::string>() + "' (supported: " + allowed + ")");
}

// One tensor's header entry, checked: dims are non-negative integers whose
// product times the element size does not overflow, and data_offsets are
// [begin, end] inside the data section spanning exactly those bytes.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const Json& j, uint64_t data_bytes) {
  Entry e;
  e.name = name;
  if (!j.is_object())
    bad_entry(path, name, "entry must be a JSON object {dtype, shape, data_offsets}, got " + json_excerpt(j));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) bad_entry(path, name, std::string("entry has no '") + key + "'");
  e.dtype = parse_st_dtype(j["dtype"], path, name);

  const Json& shape = j["shape"];
  if (!shape.is_array()) bad_entry(path, name, "'shape' must be a list of dimensions, got " + json_excerpt(shape));
  if (shape.size() > size_t(kMaxRank))
    bad_entry(path, name, "shape " + json_excerpt(shape) + " has rank " + std::to_string(shape.size()) + "; at most " +
                              std::to_string(kMaxRank) + " dimensions are supported");
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::optional<uint64_t> d = as_count(shape[i]);
    if (!d || *d > uint64_t(INT64_MAX))
      bad_entry(path, name, "shape dimension " + std::to_string(i) + " is " + json_excerpt(shape[i]) +
                                "; expected a non-negative integer");
    overflow |= __builtin_mul_overflow(numel, *d, &numel);
    e.shape.push_back(int64_t(*d));
  }
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &bytes);
  if (overflow || bytes > uint64_t(INT64_MAX))
    bad_entry(path, name, "shape " + json_excerpt(shape) + " of " + st_dtype(e.dtype) +
                              " is too large: its byte size overflows 64 bits");

  const Json& offs = j["data_offsets"];
  const auto b = offs.is_array() && offs.size() == 2 ? as_count(offs[0]) : std::nullopt;
  const auto en = offs.is_array() && offs.size() == 2 ? as_count(offs[1]) : std::nullopt;
  if (!b || !en)
    bad_entry(path, name, "'data_offsets' must be [begin, end], two non-negative integers, got " + json_excerpt(offs));
  e.begin = *b;
  e.end = *en;
  if (e.begin > e.end) bad_entry(path, name, "data_offsets " + json_excerpt(offs) + ": begin is past end");
  if (e.end > data_bytes)
    bad_entry(path, name, "data_offsets " + json_excerpt(offs) + " reach past the end of the data section (" +
                              std::to_string(data_bytes) + " bytes): the file is truncated or damaged");
  if (e.end - e.begin != bytes)
    bad_entry(path, name, "data_offsets " + json_excerpt(offs) + " span " + std::to_string(e.end - e.begin) +
                              " bytes, but " + st_dtype(e.dtype) + " " + json_excerpt(shape) + " is " +
                              std::to_string(bytes) + " bytes");
  return e;
}

// The header as JSON. A repeated key is an error (nlohmann would keep the
// last one silently, so a second entry could shadow a tensor unnoticed).
Json parse_header(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> keys;  // the keys seen, per open object
  const Json::parser_callback_t no_duplicates = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw IoError(path + ": duplicate key '" + parsed.get<std::string>() + "' in the safetensors header");
    return true;
  };
  try {
    Json header = Json::parse(text, no_duplicates);
    if (!header.is_object())
      throw IoError(path + ": the safetensors header must be a JSON object of tensor entries, got " +
                    json_excerpt(header));
    return header;
  } catch (const Json::exception& e) {
    throw IoError(path + ": bad safetensors header (" + e.what() + ")");
  }
}

// __metadata__ maps names to strings (the format says so, and readers such as
// Hugging Face's reject anything else).
std::map<std::string, std::string> parse_metadata(const Json& m, const std::string& path) {
  if (!m.is_object()) throw IoError(path + ": '__metadata__' must be a JSON object of strings, got " + json_excerpt(m));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : m.items()) {
    if (!value.is_string())
      throw IoError(path + ": '__metadata__' value '" + key + "' must be a string, got " + json_excerpt(value));
    out[key] = value.get<std::string>();
  }
  return out;
}

}  // namespace

std::string read_file(const std::string& path) {
  // A directory opens like a file and reads as empty: say what it is instead.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw IoError(path + ": is a directory, expected a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : file_(path), entries_(std::move(entries)) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const Entry& e : entries_) {
    const size_t bytes = e.meta.bytes();
    header[e.name] = {{"dtype", st_dtype(e.meta.dtype)},
                      {"shape", std::vector<int64_t>(e.meta.shape.begin(), e.meta.shape.end())},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t n = json.size();
  file_.write(&n, 8);
  file_.write(json.data(), json.size());
  uint64_t at = 8 + n;
  for (const Entry& e : entries_) {
    starts_.push_back(at);
    at += e.meta.bytes();
  }
}

void SafetensorsWriter::write(const TensorView& t) {
  if (!parts_written_.empty()) throw Error("safetensors writer: write() after write_part()");
  if (next_ >= entries_.size()) throw Error("safetensors writer: more tensors than the header lists");
  const Entry& e = entries_[next_];
  if (!(t.meta == e.meta))
    throw Error("safetensors writer: tensor '" + e.name + "' is " + e.meta.str() + " in the header, given " +
                t.meta.str());
  file_.write(t.data, t.meta.bytes());
  ++next_;
}

void SafetensorsWriter::write_part(size_t entry, size_t offset, const void* data, size_t bytes) {
  if (next_ != 0) throw Error("safetensors writer: write_part() after write()");
  if (entry >= entries_.size()) throw Error("safetensors writer: no tensor " + std::to_string(entry) + " in the header");
  const Entry& e = entries_[entry];
  if (offset > e.meta.bytes() || bytes > e.meta.bytes() - offset)
    throw Error("safetensors writer: bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                ") are outside tensor '" + e.name + "' (" + std::to_string(e.meta.bytes()) + " bytes)");
  // The ranges written so far, merged: a part over any of them is a bug of
  // the caller's, and a byte count alone would not see it (an overlap and a
  // gap of the same size).
  if (parts_written_.empty()) parts_written_.resize(entries_.size());
  std::map<uint64_t, uint64_t>& done = parts_written_[entry];
  uint64_t first = offset, end = offset + bytes;
  auto next = done.lower_bound(first);
  if ((next != done.end() && next->first < end) ||
      (next != done.begin() && std::prev(next)->second > first))
    throw Error("safetensors writer: bytes [" + std::to_string(first) + ", " + std::to_string(end) + ") of tensor '" +
                e.name + "' were already written");
  file_.write_at(starts_[entry] + offset, data, bytes);
  if (bytes == 0) return;
  if (next != done.end() && next->first == end) end = next->second, next = done.erase(next);
  if (next != done.begin() && std::prev(next)->second == first) first = std::prev(next)->first;
  done[first] = end;
}

void SafetensorsWriter::commit() {
  const bool parts = !parts_written_.empty();
  size_t missing = entries_.size() - next_;
  if (parts) {  // whole: one merged range over all its bytes (none for an empty tensor)
    missing = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const std::map<uint64_t, uint64_t>& done = parts_written_[i];
      const uint64_t bytes = entries_[i].meta.bytes();
      if (bytes != 0 && !(done.size() == 1 && done.begin()->first == 0 && done.begin()->second == bytes)) ++missing;
    }
  }
  if (missing != 0)
    throw Error("safetensors writer: " + std::to_string(missing) + " of " + std::to_string(entries_.size()) +
                " tensors were not written" + (parts ? " whole" : ""));
  file_.commit();
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const NamedTensor& t : tensors) entries.push_back({t.name, t.view.meta});
  SafetensorsWriter w(path, std::move(entries), metadata);
  for (const NamedTensor& t : tensors) w.write(t.view);
  w.commit();
}

namespace {

// The header's entries and metadata, every entry checked against the data
// section's size and the others (no overlaps) before any tensor is allocated.
struct Layout {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

Layout parse_layout(std::string_view header_text, uint64_t data_bytes, const std::string& path) {
  const Json header = parse_header(header_text, path);
  Layout layout;
  std::vector<Entry>& entries = layout.entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      layout.metadata = parse_metadata(value, path);
      continue;
    }
    entries.push_back(parse_entry(path, name, value, data_bytes));
  }
  // Two tensors sharing bytes is a damaged (or crafted) file, not a saving trick brisk uses.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      throw IoError(path + ": tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                    "' overlap in the data section (data_offsets [" + std::to_string(by_offset[i - 1]->begin) + ", " +
                    std::to_string(by_offset[i - 1]->end) + "] and [" + std::to_string(by_offset[i]->begin) + ", " +
                    std::to_string(by_offset[i]->end) + "])");
  return layout;
}

// The 8-byte header length of a file of `size` bytes, checked: within the
// file, and at most the 100 MB the format's own reader allows (a large file
// whose first bytes claim a huge header is not read into memory for it).
constexpr uint64_t kMaxHeader = 100'000'000;

uint64_t header_length(const char* first8, uint64_t size, const std::string& path) {
  if (size < 8) throw IoError(path + ": truncated safetensors file (no header length)");
  uint64_t n = 0;
  std::memcpy(&n, first8, 8);
  if (n > size - 8) throw IoError(path + ": truncated safetensors file (header says " + std::to_string(n) + " bytes)");
  if (n > kMaxHeader)
    throw IoError(path + ": the safetensors header says " + std::to_string(n) + " bytes, more than the format's " +
                  std::to_string(kMaxHeader) + ": not a safetensors file, or a damaged one");
  return n;
}

// Reads exactly n bytes at offset, or throws naming what came short.
static_assert(sizeof(off_t) == 8, "file offsets past 2 GiB need a 64-bit off_t");
void read_at(int fd, void* to, uint64_t n, uint64_t offset, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(to);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw IoError(path + ": cannot read " + what + " (" + std::strerror(errno) + ")");
    if (got == 0) throw IoError(path + ": truncated while reading " + what + " (the file was cut short)");
    p += got;
    n -= uint64_t(got);
    offset += uint64_t(got);
  }
}

}  // namespace

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path) {
  const uint64_t n = header_length(bytes.data(), bytes.size(), path);
  const size_t data_start = 8 + n;
  Layout layout = parse_layout(bytes.substr(8, n), bytes.size() - data_start, path);
  SafetensorsFile file;
  file.metadata = std::move(layout.metadata);
  for (const Entry& e : layout.entries) {
    Tensor tensor = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(tensor.data(), bytes.data() + data_start + e.begin, e.end - e.begin);
    file.tensors.emplace(e.name, std::move(tensor));
  }
  return file;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError(path + ": cannot open (" + std::strerror(errno) + ")");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw IoError(path + ": cannot stat (" + std::strerror(errno) + ")");
    // A directory opens like a file and reads as empty: say what it is instead.
    if (S_ISDIR(st.st_mode)) throw IoError(path + ": is a directory, expected a file");
    const uint64_t size = uint64_t(st.st_size);
    char first8[8] = {};
    if (size >= 8) read_at(fd_, first8, 8, 0, path, "the header length");
    const uint64_t n = header_length(first8, size, path);
    std::string header(size_t(n), '\0');
    read_at(fd_, header.data(), n, 8, path, "the header");
    data_start_ = 8 + n;
    Layout layout = parse_layout(header, size - data_start_, path);
    metadata_ = std::move(layout.metadata);
    for (const Entry& e : layout.entries) {
      metas_[e.name] = TensorMeta{e.shape, e.dtype};
      offsets_[e.name] = e.begin;
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const auto it = metas_.find(name);
  if (it == metas_.end()) throw IoError(path_ + ": no tensor '" + name + "'");
  Tensor t = Tensor::empty(it->second.shape, it->second.dtype);
  if (it->second.bytes() > 0)
    read_at(fd_, t.data(), it->second.bytes(), data_start_ + offsets_.at(name), path_, "tensor '" + name + "'");
  return t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);
  SafetensorsFile file;
  file.metadata = reader.metadata();
  for (const auto& [name, meta] : reader.tensors()) file.tensors.emplace(name, reader.read(name));
  return file;
}

}  // namespace brisk::core
