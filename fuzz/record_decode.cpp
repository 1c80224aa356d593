// Fuzz target: decoding one stored record of a record store
// (data::decode_record in src/data/record_store.cpp): the 24-byte head,
// metadata and a raw or zstd-compressed token payload that every reader
// unpacks. LMDB itself is not fuzzed: it trusts its own file format.
//
// Input: [flags: 1 byte][value bytes]
//   flags bit 0: the store holds int32 tokens (else uint16)
//   flags bit 1: keep the value's checksum as it is; otherwise the target
//                writes the correct xxh3 first, so that mutations get past
//                the checksum check and reach the decoding behind it
// fuzz/make_seeds.py writes seeds in this layout from real FASTA and e-mail
// records.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "brisk/core/error.h"
#include "brisk/data/record_store.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string value(fuzz::as_text(data + 1, size - 1));
  if (!(flags & 2) && value.size() >= 8) {
    const uint64_t sum = XXH3_64bits(value.data() + 8, value.size() - 8);
    std::memcpy(value.data(), &sum, 8);
  }
  const auto dtype = (flags & 1) ? data::TokenDType::I32 : data::TokenDType::U16;
  try {
    data::Record r;
    data::decode_record(value, dtype, "fuzz.lmdb", 0, r);
    // The head (24 bytes) and the metadata are part of the value.
    FUZZ_CHECK(r.meta.size() + 24 <= value.size());
    if (dtype == data::TokenDType::U16)
      for (const int32_t t : r.tokens) FUZZ_CHECK(t >= 0 && t < 65536);
  } catch (const core::Error&) {
  }
  return 0;
}
