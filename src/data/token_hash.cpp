// Token sequence digests (token_hash.h).
#include "brisk/data/token_hash.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <vector>

namespace brisk::data {

std::string token_digest(std::span<const int32_t> tokens) {
  XXH128_hash_t h;
  if constexpr (std::endian::native == std::endian::little) {
    h = XXH3_128bits(tokens.data(), tokens.size_bytes());
  } else {
    std::vector<uint8_t> le(tokens.size_bytes());
    for (size_t i = 0; i < tokens.size(); ++i)
      for (int k = 0; k < 4; ++k) le[i * 4 + size_t(k)] = uint8_t(uint32_t(tokens[i]) >> (8 * k));
    h = XXH3_128bits(le.data(), le.size());
  }
  std::string out(16, '\0');
  std::memcpy(out.data(), &h.low64, 8);
  std::memcpy(out.data() + 8, &h.high64, 8);
  return out;
}

}  // namespace brisk::data
