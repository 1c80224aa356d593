// safetensors reader/writer (safetensors.h). The JSON is small and flat, so
// nlohmann-json handles it; tensor bytes are copied straight from the file.
#include "brisk/core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "brisk/core/error.h"

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

DType parse_st_dtype(const std::string& s, const std::string& path) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (s == st_dtype(DType(i))) return DType(i);
  throw IoError(path + ": unsupported safetensors dtype '" + s + "'");
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IoError(tmp + ": cannot create (" + std::strerror(errno) + ")");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;  // a signal (e.g. the stop request) interrupted it
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError(tmp + ": write failed (" + why + ")");
    }
    done += size_t(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw IoError(path + ": rename failed (" + std::strerror(errno) + ")");
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const size_t bytes = t.view.meta.bytes();
    header[t.name] = {{"dtype", st_dtype(t.view.dtype())},
                      {"shape", std::vector<int64_t>(t.view.shape().begin(), t.view.shape().end())},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += json;
  for (const NamedTensor& t : tensors) out.append(static_cast<const char*>(t.view.data), t.view.meta.bytes());
  write_file_atomic(path, out);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() < 8) throw IoError(path + ": truncated safetensors file (no header length)");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) throw IoError(path + ": truncated safetensors file (header says " + std::to_string(n) + " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw IoError(path + ": bad safetensors header (" + e.what() + ")");
  }
  SafetensorsFile file;
  const size_t data_start = 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it->begin(); m != it->end(); ++m) file.metadata[m.key()] = m->get<std::string>();
      continue;
    }
    try {
      const DType t = parse_st_dtype(it->at("dtype").get<std::string>(), path);
      const auto shape_v = it->at("shape").get<std::vector<int64_t>>();
      const auto offs = it->at("data_offsets").get<std::vector<size_t>>();
      Shape shape(shape_v.begin(), shape_v.end());
      Tensor tensor = Tensor::empty(shape, t);
      if (offs.size() != 2 || offs[1] < offs[0] || offs[1] - offs[0] != tensor.bytes() ||
          data_start + offs[1] > bytes.size())
        throw IoError(path + ": tensor '" + it.key() + "' has bad or truncated data offsets");
      std::memcpy(tensor.data(), bytes.data() + data_start + offs[0], tensor.bytes());
      file.tensors.emplace(it.key(), std::move(tensor));
    } catch (const nlohmann::json::exception& e) {
      throw IoError(path + ": bad entry for tensor '" + it.key() + "' (" + e.what() + ")");
    }
  }
  return file;
}

}  // namespace brisk::core
