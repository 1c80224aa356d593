// Fuzz target: the safetensors reader (src/core/safetensors.cpp), which
// loads model and optimizer checkpoints. Input: the bytes of a .safetensors
// file, parsed from memory (parse_safetensors) and read from a file a
// tensor at a time (SafetensorsReader, the checkpoint loader's way, here
// over a memfd). Both must accept or refuse alike and read the same bytes;
// every tensor that loads is read end to end, so that a size or offset the
// reader got wrong shows up as an ASan report here.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "fuzz_util.h"

namespace {
volatile unsigned g_sink;  // keeps the reads of the tensor bytes from being optimised away

// The input as a file: a memfd, named through /proc/self/fd.
struct MemFile {
  int fd = -1;
  std::string path;
  MemFile(const uint8_t* data, size_t size) {
    fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    for (size_t done = 0; done < size;) {
      const ssize_t w = ::write(fd, data + done, size - done);
      FUZZ_CHECK(w > 0);
      done += size_t(w);
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  ~MemFile() { ::close(fd); }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  bool parsed = false;
  core::SafetensorsFile f;
  try {
    f = core::parse_safetensors(fuzz::as_text(data, size), "fuzz.safetensors");
    parsed = true;
    for (const auto& [name, t] : f.tensors) {
      FUZZ_CHECK(t.bytes() == size_t(t.numel()) * core::dtype_size(t.dtype()));
      const auto* p = static_cast<const unsigned char*>(t.data());
      unsigned sum = 0;
      for (size_t i = 0; i < t.bytes(); ++i) sum += p[i];
      g_sink = sum;
    }
  } catch (const core::Error&) {
  }
  const MemFile file(data, size);
  try {
    const core::SafetensorsReader reader(file.path);
    FUZZ_CHECK(parsed);  // the reader accepts only what the parser accepts
    FUZZ_CHECK(reader.tensors().size() == f.tensors.size());
    for (const auto& [name, meta] : reader.tensors()) {
      const core::Tensor t = reader.read(name);
      const core::Tensor& same = f.tensors.at(name);
      FUZZ_CHECK(t.meta() == same.meta());
      FUZZ_CHECK(std::memcmp(t.data(), same.data(), t.bytes()) == 0);
    }
  } catch (const core::Error&) {
    FUZZ_CHECK(!parsed);  // ... and refuses only what it refuses
  }
  return 0;
}
