// Files that appear whole or not at all: bytes go to path.tmp, which is
// fsynced and renamed over path only when the writer commits. A crash or an
// exception before then leaves whatever was at path untouched (the
// temporary is removed when the writer is destroyed uncommitted). The
// writer holds a lock on path.tmp: a second writer of the path is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace brisk::core {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // throws IoError if path.tmp cannot be created
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends bytes straight to the file (no buffering of our own: callers
  // hand over whole tensors, so nothing the size of the file is held).
  void write(const void* data, size_t bytes);
  // Bytes at `offset` from the file's start (pwrite: the append position of
  // write() does not move), for files filled out of order.
  void write_at(uint64_t offset, const void* data, size_t bytes);
  void commit();  // fsync, close, rename into place

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Opens `tmp`, the temporary file of `target`, for writing: created if
// missing, locked (flock) for as long as the descriptor stays open, then
// emptied. Throws IoError naming `target` when another writer holds the
// lock (a filesystem without locks is written unguarded): two writers of one output shared the fixed temporary name, and one
// renamed the other's half-written file into place while reporting success.
// A lock dies with its process, so a crashed writer's leftover is reused.
// Keep the descriptor open until the file is renamed or removed.
int open_locked_temporary(const std::string& tmp, const std::string& target);

// The whole of `bytes` as one AtomicFile.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Refuses, before any work is done, an output path that cannot become a
// file: empty, an existing directory, in a directory that does not exist or
// is not writable. Throws ConfigError (IoError for an unwritable directory)
// naming the path.
void check_output_file(const std::string& path);

// Refuses an output path that would overwrite the command's input: the
// input file itself, or an existing file of a checkpoint, run or model
// directory inside the input directory (model.safetensors, state.json, ...).
// Throws ConfigError naming both.
void check_output_not_input(const std::string& out, const std::string& input);

}  // namespace brisk::core
