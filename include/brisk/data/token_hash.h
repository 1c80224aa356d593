// A fixed-size digest of a token sequence (XXH3-128 of its int32 ids), used
// as a cache key where the sequence itself would be a long key: the feature
// cache of `brisk encode` keys latents by the residues they came from, and
// the autoencoder's split recognises repeated sequences by it. 128 bits make
// an accidental collision among even billions of sequences vanishingly rare.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace brisk::data {

// 16 bytes; equal sequences give equal digests on every machine (the ids are
// hashed as little-endian int32, whatever the host's order).
std::string token_digest(std::span<const int32_t> tokens);

}  // namespace brisk::data
