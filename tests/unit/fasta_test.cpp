// FASTA converter tests: the residue alphabet, the parser's handling of
// multi-line records, CRLF, comments and whitespace, clear errors (file, line,
// column, character) for invalid residues, sequence before the first header
// and empty records, the skip-and-count policy, and the converted store. The
// real FASTA files of Debian's hmmer-examples are converted and checked
// against counts taken independently from the files; when the package is
// missing the test fails and says to run scripts/fetch_data.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"

namespace brisk::data {
namespace {

namespace fs = std::filesystem;

struct Parsed {
  FastaSummary s;
  std::vector<std::string> headers, seqs;
};

Parsed parse(std::string_view text, OnInvalid policy = OnInvalid::Error) {
  Parsed p;
  p.s = parse_fasta(text, "t.fa", policy, [&](const FastaRecord& r) {
    p.headers.emplace_back(r.header);
    std::string seq;
    for (int32_t t : *r.tokens) seq += fasta_residue(t);
    p.seqs.push_back(seq);
  });
  return p;
}

std::string error_of(std::string_view text) {
  try {
    parse(text);
  } catch (const core::IoError& e) {
    return e.what();
  }
  return "(no error)";
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("brisk_fa_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Fasta, Alphabet) {
  EXPECT_EQ(kFastaVocab, 28);
  for (size_t i = 0; i < kFastaAlphabet.size(); ++i) {
    const auto c = static_cast<unsigned char>(kFastaAlphabet[i]);
    EXPECT_EQ(fasta_token(c), int32_t(i + 1)) << c;
    if (std::isalpha(c)) {
      EXPECT_EQ(fasta_token(static_cast<unsigned char>(std::tolower(c))), int32_t(i + 1)) << c;
    }
    EXPECT_EQ(fasta_residue(int32_t(i + 1)), char(c));
  }
  for (unsigned char c : std::string("J1.>_ \t")) EXPECT_EQ(fasta_token(c), 0) << c;
  for (unsigned char c : std::string("ACGTUNRYKMSWBDHV")) EXPECT_GT(fasta_token(c), 0) << c;  // IUPAC nucleotides
}

TEST(Fasta, ParsesMultiLineRecordsCommentsAndCrlf) {
  const Parsed p = parse(
      "; a comment\n\n>sp|P1|ONE first protein  \r\nACDEF\r\nghik L\tm\r\n\n>two\nAC-GT*\n>three\nn\n\n");
  ASSERT_EQ(p.headers.size(), 3u);
  EXPECT_EQ(p.headers[0], "sp|P1|ONE first protein");
  EXPECT_EQ(p.seqs[0], "ACDEFGHIKLM");
  EXPECT_EQ(p.seqs[1], "AC-GT*");
  EXPECT_EQ(p.seqs[2], "N");
  EXPECT_EQ(p.s.headers, 3);
  EXPECT_EQ(p.s.written, 3);
  EXPECT_EQ(p.s.residues, 11 + 6 + 1);
  EXPECT_EQ(parse("").s.headers, 0);
  EXPECT_EQ(parse(">x\nAC").seqs[0], "AC");  // no final newline
  // A UTF-8 byte order mark before the first header is skipped, not taken as sequence data.
  const Parsed bom = parse("\xEF\xBB\xBF>bom\nACD\n");
  ASSERT_EQ(bom.headers.size(), 1u);
  EXPECT_EQ(bom.headers[0], "bom");
  EXPECT_EQ(bom.seqs[0], "ACD");
  // Classic Mac OS line endings (a lone CR) end lines too, and count in error positions.
  const Parsed mac = parse(">one protein\rACD\rEF\r\r>two\rGG");
  ASSERT_EQ(mac.headers.size(), 2u);
  EXPECT_EQ(mac.headers[0], "one protein");
  EXPECT_EQ(mac.seqs[0], "ACDEF");
  EXPECT_EQ(mac.seqs[1], "GG");
  // Lone CRs, CRLF and LF mixed in one file: each line ends at the first of them.
  const Parsed mixed = parse(">a\rAC\rDE\n>b\r\nGG\rHH\n\r>c\nK");
  ASSERT_EQ(mixed.headers.size(), 3u);
  EXPECT_EQ(mixed.seqs[0], "ACDE");
  EXPECT_EQ(mixed.seqs[1], "GGHH");
  EXPECT_EQ(mixed.seqs[2], "K");
  const std::string e = error_of(">a\rAC\rAJ\r");
  EXPECT_NE(e.find("t.fa:3:2"), std::string::npos) << e;
}

TEST(Fasta, InvalidResidueNamesFileLineColumnAndChar) {
  const std::string e = error_of(">a\nACDE\nACJD\n");
  EXPECT_NE(e.find("t.fa:3:3"), std::string::npos) << e;
  EXPECT_NE(e.find("'J'"), std::string::npos) << e;
  EXPECT_NE(e.find("record 'a'"), std::string::npos) << e;
  const std::string e2 = error_of(">a\nAC\xe9\n");
  EXPECT_NE(e2.find("t.fa:2:3"), std::string::npos) << e2;
  EXPECT_NE(e2.find("0xE9"), std::string::npos) << e2;

  const Parsed p = parse(">a\nACDE\nAC1D\n>b\nWWW\n>c\nX.X\nYY\n", OnInvalid::Skip);
  EXPECT_EQ(p.s.headers, 3);
  EXPECT_EQ(p.s.written, 1);
  EXPECT_EQ(p.s.skipped_invalid, 2);
  EXPECT_EQ(p.seqs, std::vector<std::string>{"WWW"});
}

TEST(Fasta, SequenceBeforeHeaderAndEmptyRecords) {
  const std::string e = error_of("\nACGT\n>a\nAC\n");
  EXPECT_NE(e.find("t.fa:2"), std::string::npos) << e;
  EXPECT_NE(e.find("before the first '>' header"), std::string::npos) << e;
  const std::string e2 = error_of(">a\nAC\n>empty one\n\n>c\nGG\n");
  EXPECT_NE(e2.find("t.fa:3"), std::string::npos) << e2;
  EXPECT_NE(e2.find("'empty one' has no sequence"), std::string::npos) << e2;
  EXPECT_NE(error_of(">a\nAC\n>last\n").find("'last' has no sequence"), std::string::npos);

  const Parsed p = parse("ACGT\nAC\n>a\nAC\n>e\n>f\n;c\n>g\nT\n", OnInvalid::Skip);
  EXPECT_EQ(p.s.orphan_lines, 2);
  EXPECT_EQ(p.s.skipped_empty, 2);
  EXPECT_EQ(p.s.written, 2);
  EXPECT_EQ(p.s.headers, p.s.written + p.s.skipped_empty + p.s.skipped_invalid);
}

TEST(Fasta, ConvertsFilesToStoreWithZstd) {
  const fs::path d = temp_dir("convert");
  std::string big(5000, 'A');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = 'W';
  {
    std::ofstream(d / "a.fa") << ">p1 short\nMKV\n>p2 long\n" << big.substr(0, 2500) << "\n" << big.substr(2500) << "\n";
    std::ofstream(d / "b.fa") << ">n1 dna\nacgtn\n";
    std::ofstream(d / "empty.fa") << "";
  }
  FastaOptions o;
  o.zstd_over = 100;
  const FastaSummary s = fasta_to_lmdb({(d / "a.fa").string(), (d / "empty.fa").string(), (d / "b.fa").string()},
                                       (d / "out.lmdb").string(), o);
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.headers, 3);
  EXPECT_EQ(s.written, 3);
  EXPECT_EQ(s.compressed, 1);
  RecordStore st((d / "out.lmdb").string(), StoreExpect{"fasta", kFastaVocab});
  ASSERT_EQ(st.size(), 3);
  const Record r1 = st.get(1);
  EXPECT_EQ(r1.meta, "p2 long");
  std::string seq;
  for (int32_t t : r1.tokens) seq += fasta_residue(t);
  EXPECT_EQ(seq, big);
  EXPECT_EQ(st.get(2).meta, "n1 dna");
  EXPECT_EQ(st.get(2).tokens.size(), 5u);

  {
    std::ofstream(d / "bad.fa") << ">ok\nAAA\n>bad\nAAJ\n";
  }
  try {
    fasta_to_lmdb({(d / "bad.fa").string()}, (d / "bad.lmdb").string(), {});
    FAIL() << "no error";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find((d / "bad.fa").string() + ":4:3"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "bad.lmdb"));  // a failed run leaves no store behind
  EXPECT_THROW(fasta_to_lmdb({(d / "nope.fa").string()}, (d / "x.lmdb").string(), {}), core::IoError);
  fs::remove_all(d);
}

// Counts '>' lines and residue letters the simple way, to check the converter against.
void count_fasta(const fs::path& p, int64_t* headers, int64_t* residues) {
  std::ifstream f(p);
  std::string line;
  *headers = *residues = 0;
  while (std::getline(f, line)) {
    if (!line.empty() && line[0] == '>') {
      ++*headers;
      continue;
    }
    for (char c : line) *residues += std::isalpha(static_cast<unsigned char>(c)) || c == '*' || c == '-';
  }
}

// Where Debian puts hmmer-examples, or where scripts/fetch_data.sh unpacks it
// when dpkg is told to leave out /usr/share/doc.
fs::path hmmer_root() {
  const fs::path sys = "/usr/share/doc/hmmer/examples";
  if (fs::exists(sys)) return sys;
  return fs::path(__FILE__).parent_path().parent_path().parent_path() /
         "third_party/debian/hmmer-examples/usr/share/doc/hmmer/examples";
}

TEST(Fasta, RealHmmerExamples) {
  const fs::path root = hmmer_root();
  const std::vector<std::string> files{"tutorial/globins45.fa", "tutorial/dna_target.fa", "tutorial/HBB_HUMAN",
                                       "testsuite/20aa-alitest.fa", "testsuite/ecori.fa",
                                       "easel/demotic/examples/example.fa",
                                       "easel/demotic/examples/example-single-psiquery.fa"};
  std::vector<std::string> paths;
  int64_t headers = 0, residues = 0;
  for (const auto& f : files) {
    ASSERT_TRUE(fs::exists(root / f)) << (root / f)
                                      << " is missing: run scripts/fetch_data.sh (it installs Debian's hmmer-examples)";
    int64_t h, r;
    count_fasta(root / f, &h, &r);
    headers += h;
    residues += r;
    paths.push_back((root / f).string());
  }
  EXPECT_EQ(headers, 45 + 1 + 1 + 4 + 1 + 2 + 1);
  const fs::path d = temp_dir("hmmer");
  const FastaSummary s = fasta_to_lmdb(paths, (d / "hmmer.lmdb").string(), {});
  EXPECT_EQ(s.headers, headers);
  EXPECT_EQ(s.written, headers);
  EXPECT_EQ(s.residues, residues);
  RecordStore st((d / "hmmer.lmdb").string());
  EXPECT_EQ(st.size(), headers);
  EXPECT_EQ(st.get(0).meta.rfind("MYG_ESCGI", 0), 0u) << st.get(0).meta;
  EXPECT_EQ(st.get(45).meta, "humanchr1_frag");
  EXPECT_EQ(st.get(45).tokens.size(), 330000u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace brisk::data
