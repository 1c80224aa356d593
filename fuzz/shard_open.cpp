// Fuzz target: opening a token dataset (src/data/shards.cpp): meta.json plus
// the shard files of one split, memory-mapped and validated, then read across
// shard boundaries and sampled into training windows.
//
// Input: [flags: 1 byte][meta.json length: 2 bytes LE][meta.json][shard bytes]
//   flags bit 0: write the shard's xxh64 checksum over the payload (header
//                bytes 32..40) so that mutations get past the checksum check
//                and reach what comes after it
//   flags bit 1: the split is "val" instead of "train"
//   flags bit 2: write the shard twice (<split>_0000.bin and _0001.bin)
// fuzz/make_seeds.py writes seeds in this layout from real datasets.
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/data/shards.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  const size_t meta_len = std::min<size_t>(data[1] | size_t(data[2]) << 8, size - 3);
  const std::string meta(fuzz::as_text(data + 3, meta_len));
  std::string shard(fuzz::as_text(data + 3 + meta_len, size - 3 - meta_len));
  if ((flags & 1) && shard.size() >= 64) {
    const uint64_t sum = XXH64(shard.data() + 64, shard.size() - 64, 0);
    std::memcpy(shard.data() + 32, &sum, 8);
  }
  const std::string split = (flags & 2) ? "val" : "train";

  const auto& dir = fuzz::scratch_dir();
  for (const char* name : {"meta.json", "train_0000.bin", "train_0001.bin", "val_0000.bin", "val_0001.bin"})
    std::filesystem::remove(dir / name);
  fuzz::write_bytes(dir / "meta.json", meta);
  fuzz::write_bytes(dir / (split + "_0000.bin"), shard);
  if (flags & 4) fuzz::write_bytes(dir / (split + "_0001.bin"), shard);

  try {
    const data::TokenDataset ds(dir.string(), split);
    FUZZ_CHECK(ds.size() > 0 && ds.vocab_size() > 0);
    // A shard of n tokens is at least 2n bytes: the dataset cannot hold more.
    FUZZ_CHECK(size_t(ds.size()) <= (flags & 4 ? 2 : 1) * shard.size() / 2);
    std::vector<int32_t> all(size_t(ds.size()));
    ds.read(0, ds.size(), all.data());
    if (ds.size() >= 2) {
      const int64_t seq = std::min<int64_t>(8, ds.size() - 1);
      data::WindowSampler sampler(ds, 2, seq, flags);
      std::vector<int32_t> x(size_t(2 * seq)), y(size_t(2 * seq));
      sampler.next(x.data(), y.data());
    }
  } catch (const core::Error&) {
  }
  return 0;
}
