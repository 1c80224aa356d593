// Fuzz target: the FASTA parser behind `brisk data fasta2lmdb`
// (data::parse_fasta in src/data/fasta.cpp). Input: a FASTA text.
//
// Besides not crashing, the parser promises (converters.h, fasta.cpp):
// every record's tokens are residues 1..27; --on-invalid skip rejects only a
// compressed file (data::compressed_format), and otherwise
// written + skipped_invalid + skipped_empty is the number of '>' lines; and
// a run that stops at the first problem instead writes the same records as
// the skipping run when it finds none.
#include <cstdint>
#include <string>

#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const std::string_view text = fuzz::as_text(data, size);
  const auto sink = [&](const data::FastaRecord& r) {
    FUZZ_CHECK(!r.tokens->empty());
    for (const int32_t t : *r.tokens) FUZZ_CHECK(t >= 1 && t < data::kFastaVocab);
    FUZZ_CHECK(r.header.find('\n') == std::string_view::npos && r.header.find('\r') == std::string_view::npos);
    FUZZ_CHECK(r.header.data() >= text.data() && r.header.data() + r.header.size() <= text.data() + text.size());
    FUZZ_CHECK(r.line >= 1);
  };
  data::FastaSummary skip;
  const bool compressed = data::compressed_format(text) != nullptr;
  try {
    skip = data::parse_fasta(text, "fuzz.fa", data::OnInvalid::Skip, sink);
    FUZZ_CHECK(!compressed);
  } catch (const core::Error& e) {
    if (compressed) return 0;  // refused by name, in either mode
    std::fprintf(stderr, "parse_fasta(skip) threw: %s\n", e.what());
    FUZZ_CHECK(!"--on-invalid skip never rejects an input but a compressed one");
  }
  FUZZ_CHECK(skip.written + skip.skipped_invalid + skip.skipped_empty == skip.headers);
  try {
    const data::FastaSummary strict = data::parse_fasta(text, "fuzz.fa", data::OnInvalid::Error, sink);
    FUZZ_CHECK(strict.written == strict.headers);
    FUZZ_CHECK(strict.written == skip.written && strict.residues == skip.residues);
  } catch (const core::Error&) {
  }
  return 0;
}
