// The file `brisk encode` writes and `brisk decode` reads: a safetensors file
// with one latent per sequence, so other tools (numpy, PyTorch, Hugging Face
// safetensors) read the features directly.
//   latents       (N, latent) F32   one row per input sequence, in input order
//   lengths       (N) I32           residues the model saw (cut to max_len): decode rebuilds this many
//   full_lengths  (N) I32           residues in the input
//   __metadata__  format = "brisk-latents", names = JSON array of the N FASTA
//                 headers (bytes that are not UTF-8 stored as U+FFFD),
//                 checkpoint, latent, max_len, model_xxh64 (the digest of
//                 the checkpoint's model.safetensors: decode refuses
//                 latents of another model)
// Written to a temporary file and renamed into place (core::save_safetensors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brisk::train {

struct LatentsFile {
  int64_t latent = 0, max_len = 0;
  std::vector<float> latents;  // N x latent
  std::vector<int32_t> lengths, full_lengths;
  std::vector<std::string> names;
  std::string checkpoint;      // where the latents came from (informational)
  std::string model_xxh64;     // 16 hex digits; empty in files written before it was recorded
  int64_t size() const { return int64_t(names.size()); }
};

void write_latents_file(const std::string& path, const LatentsFile& f);
// Throws IoError naming the file and the tensor or field that is missing,
// mistyped or inconsistent (N differs between tensors, a length outside
// [1, max_len], a non-finite latent, a name holding a line break, which
// would write a FASTA header of two lines).
LatentsFile read_latents_file(const std::string& path);

}  // namespace brisk::train
