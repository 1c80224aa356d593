// The safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw bytes. Hugging Face tooling reads it directly. Writes go to a temp file
// that is renamed into place, so a crash never leaves a half-written file.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/tensor.h"

namespace brisk::core {

struct NamedTensor {
  std::string name;
  TensorView view;  // host memory
};

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The same, one tensor at a time: the header (every name, dtype and shape)
// is written first, then each tensor's bytes straight from its memory, so
// nothing the size of the file is held and a caller can make each tensor
// (a transposed copy) just before it is written.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    TensorMeta meta;
  };
  SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                    const std::map<std::string, std::string>& metadata = {});
  // The next entry's bytes; throws Error if `t` is not shaped as that entry.
  void write(const TensorView& t);
  // Or, for a file filled out of order: `bytes` of entry `entry` from byte
  // `offset` of its data (a writer uses one of the two ways). Throws Error
  // for a part outside the entry or over bytes already written.
  void write_part(size_t entry, size_t offset, const void* data, size_t bytes);
  void commit();  // throws Error unless every entry was written whole

 private:
  AtomicFile file_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> starts_;   // each entry's first byte in the file
  // write_part: each entry's bytes written, as merged ranges [first, end);
  // empty until the first part (write() and write_part() do not mix).
  std::vector<std::map<uint64_t, uint64_t>> parts_written_;
  size_t next_ = 0;
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// A file read one tensor at a time: opening reads and checks the header
// (as parse_safetensors does), and each read() allocates one tensor and
// reads its bytes straight into it. A loader that uploads each tensor and
// drops it holds one tensor at a time, never the file's bytes beside the
// tensors made from them (a resume's moments file is twice the model).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // throws IoError as load_safetensors does
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::map<std::string, TensorMeta>& tensors() const { return metas_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Throws IoError for a name the file lacks or a file cut short since it was opened.
  Tensor read(const std::string& name) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorMeta> metas_;
  std::map<std::string, uint64_t> offsets_;  // in the data section
  std::map<std::string, std::string> metadata_;
};

// Every tensor of a file (through SafetensorsReader). Throws IoError naming
// the file and what is wrong (missing, truncated, bad header).
SafetensorsFile load_safetensors(const std::string& path);
// The same from the file's bytes in memory; `path` names it in errors.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path);

std::string read_file(const std::string& path);  // throws IoError if unreadable

}  // namespace brisk::core
