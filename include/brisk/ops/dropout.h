// Which elements a dropout keeps: a counter-based hash of (key, site,
// element index), so the mask is never stored. The backward (the same op on
// the gradient), a recomputed forward and a resumed run all make the same
// mask from the same key, and any thread can make any element's bit.
//
// The reference kernel, the CPU kernels and the PyTorch check
// (tests/models/gpt_torch_check.py) make exactly these bits, so the same
// elements are dropped (the kept values' rounding may differ by an ulp);
// docs/architecture.md ("Dropout") writes it out.
#pragma once

#include <cstdint>

namespace brisk::ops {

// MurmurHash3's 32-bit finalizer: every input bit flips each output bit
// with probability about 1/2.
constexpr uint32_t dropout_mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The two words an element's bits start from: the key's (one per training
// micro-step), this dropout's site and the index's high 32 bits.
struct DropoutStream {
  uint32_t s0, s1;
};
constexpr DropoutStream dropout_stream(uint32_t k0, uint32_t k1, uint32_t site, uint32_t index_hi) {
  const uint32_t s0 = dropout_mix(k0 ^ dropout_mix(site ^ (index_hi + 1u) * 0x9e3779b9u));
  return {s0, dropout_mix(k1 ^ s0 ^ 0x85ebca6bu)};
}

// 32 random bits for the element at (low 32 bits of) index `lo`.
constexpr uint32_t dropout_bits(const DropoutStream& s, uint32_t lo) { return dropout_mix(dropout_mix(lo ^ s.s0) ^ s.s1); }

// The bits of element `index` (any 64-bit index): its stream, then its bits.
// Kernels make a stream once per stretch of indices and call dropout_bits.
constexpr uint32_t dropout_bits_at(uint32_t k0, uint32_t k1, uint32_t site, uint64_t index) {
  return dropout_bits(dropout_stream(k0, k1, site, uint32_t(index >> 32)), uint32_t(index));
}

// Kept where dropout_bits >= the threshold: the share dropped is p to
// within 2^-32.
inline uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xffffffffu : uint32_t(t);
}

}  // namespace brisk::ops
