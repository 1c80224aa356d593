// FASTA -> record store (`brisk data fasta2lmdb`).
//
// Input files are memory-mapped and parsed in one streaming pass: memchr
// finds line ends, a 256-entry table maps each byte to its residue token (or
// "ignore", or "invalid"), so validation costs one load per byte and the
// parser runs at memory speed; the LMDB append is the slower half. The
// alphabet is documented in converters.h. A bad input either stops the run
// with file:line:column and the offending byte, or (--on-invalid skip) drops
// the record and counts it, so that written + skipped always equals the
// number of '>' lines, which the CLI prints for the user to check.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"

namespace brisk::data {

using core::IoError;

namespace {

constexpr uint8_t kIgnore = 0xff;  // whitespace inside sequence lines

constexpr std::array<uint8_t, 256> make_table() {
  std::array<uint8_t, 256> t{};
  for (size_t i = 0; i < kFastaAlphabet.size(); ++i) {
    const auto c = static_cast<unsigned char>(kFastaAlphabet[i]);
    t[c] = static_cast<uint8_t>(i + 1);
    if (c >= 'A' && c <= 'Z') t[c - 'A' + 'a'] = static_cast<uint8_t>(i + 1);
  }
  t[' '] = t['\t'] = t['\r'] = t['\v'] = t['\f'] = kIgnore;
  return t;
}
constexpr std::array<uint8_t, 256> kTable = make_table();

std::string show_byte(unsigned char c) {
  char buf[32];
  if (c >= 0x21 && c < 0x7f) std::snprintf(buf, sizeof buf, "'%c' (0x%02X)", c, c);
  else std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
  return buf;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// A read-only mapping of a whole file, unmapped on every exit path.
struct Mapped {
  const char* data = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(path + ": cannot open FASTA input: " + std::strerror(errno));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IoError(path + ": not a regular file (fasta2lmdb memory-maps its inputs)");
    }
    size = size_t(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw IoError(path + ": cannot map: " + std::strerror(errno));
      }
      ::madvise(p, size, MADV_SEQUENTIAL);
      data = static_cast<const char*>(p);
    }
    ::close(fd);
  }
  ~Mapped() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};

}  // namespace

int32_t fasta_token(unsigned char c) { return kTable[c] == kIgnore ? 0 : kTable[c]; }

bool fasta_space(unsigned char c) { return kTable[c] == kIgnore; }

char fasta_residue(int32_t token) {
  return token >= 1 && token <= int32_t(kFastaAlphabet.size()) ? kFastaAlphabet[size_t(token - 1)] : '?';
}

const char* compressed_format(std::string_view text) {
  static const std::pair<std::string_view, const char*> kCompressed[] = {
      {"\x1f\x8b", "gzip (unpack it first: gunzip -k, or zcat > file.fa)"},
      {"\x28\xb5\x2f\xfd", "zstd (unpack it first: unzstd)"},
      {std::string_view("\xfd\x37\x7a\x58\x5a\x00", 6), "xz (unpack it first: unxz -k)"},
      {"BZh", "bzip2 (unpack it first: bunzip2 -k)"}};
  for (const auto& [magic, what] : kCompressed)
    if (text.substr(0, magic.size()) == magic) return what;
  return nullptr;
}

FastaSummary parse_fasta(std::string_view text, const std::string& name, OnInvalid on_invalid,
                         const std::function<void(const FastaRecord&)>& sink) {
  // A compressed file would fail as "sequence data before the first header",
  // whose hint (--on-invalid skip) then made an empty store.
  if (const char* what = compressed_format(text)) throw IoError(name + ": compressed with " + what);
  FastaSummary s;
  std::vector<int32_t> tokens;
  tokens.reserve(1 << 16);
  bool in_record = false, invalid = false;
  std::string_view header;
  int64_t header_line = 0, line_no = 0;

  const auto finish_record = [&] {
    if (!in_record) return;
    if (invalid) {
      ++s.skipped_invalid;
    } else if (tokens.empty()) {
      if (on_invalid == OnInvalid::Error)
        throw IoError(name + ":" + std::to_string(header_line) + ": record '" + std::string(header.substr(0, 80)) +
                      "' has no sequence (use --on-invalid skip to drop empty records)");
      ++s.skipped_empty;
    } else {
      s.residues += int64_t(tokens.size());
      ++s.written;
      sink(FastaRecord{header, &tokens, header_line});
    }
    in_record = false;
  };

  const char* p = text.data();
  const char* const end = p + text.size();
  // A UTF-8 byte order mark (editors on Windows write one) is no sequence data.
  if (text.size() >= 3 && std::memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
  // The next LF at or after p (end: none left), found again only once p has
  // passed it: a file of lone CRs has none, and looking for one on every line
  // read to the end of the file each time (quadratic: 13 s for 8 MB).
  const char* next_lf = nullptr;
  while (p < end) {
    // A line ends at LF, CRLF or a lone CR (classic Mac OS files).
    if (!next_lf || next_lf < p) {
      next_lf = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
      if (!next_lf) next_lf = end;
    }
    const char* nl = next_lf < end ? next_lf : nullptr;
    const char* le = nl ? nl : end;
    const char* cr = static_cast<const char*>(std::memchr(p, '\r', size_t(le - p)));
    std::string_view line(p, size_t((cr ? cr : le) - p));
    p = cr && cr + 1 != nl ? cr + 1 : nl ? nl + 1 : end;
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '>') {
      finish_record();
      ++s.headers;
      in_record = true;
      invalid = false;
      tokens.clear();
      header = rtrim(line.substr(1));
      header_line = line_no;
      continue;
    }
    if (line[0] == ';') continue;
    if (!in_record) {
      if (rtrim(line).empty()) continue;
      if (on_invalid == OnInvalid::Error)
        throw IoError(name + ":" + std::to_string(line_no) +
                      ": sequence data before the first '>' header: not a FASTA file, or its first header is "
                      "missing (use --on-invalid skip to ignore such lines)");
      ++s.orphan_lines;
      continue;
    }
    if (invalid) continue;
    // Write residues straight into the token buffer; shrink to what was kept.
    const size_t base = tokens.size();
    tokens.resize(base + line.size());
    int32_t* out = tokens.data() + base;
    size_t kept = 0;
    for (size_t i = 0; i < line.size(); ++i) {
      const auto c = static_cast<unsigned char>(line[i]);
      const uint8_t t = kTable[c];
      if (t == kIgnore) continue;
      if (t == 0) {
        if (on_invalid == OnInvalid::Error)
          throw IoError(name + ":" + std::to_string(line_no) + ":" + std::to_string(i + 1) + ": invalid residue " +
                        show_byte(c) + " in record '" + std::string(header.substr(0, 80)) +
                        "'; allowed: " + std::string(kFastaAlphabet) +
                        " (either case) and whitespace (use --on-invalid skip to drop such records)");
        invalid = true;
        break;
      }
      out[kept++] = t;
    }
    tokens.resize(invalid ? 0 : base + kept);
  }
  finish_record();
  return s;
}

FastaSummary fasta_to_lmdb(const std::vector<std::string>& inputs, const std::string& out, const FastaOptions& opt) {
  if (inputs.empty()) throw core::ConfigError("fasta2lmdb: no input files");
  FastaSummary total;
  const double t0 = now_s();
  int64_t total_bytes = 0;
  for (const auto& in : inputs) {
    struct stat st{};
    if (::stat(in.c_str(), &st) != 0) throw IoError(in + ": cannot read FASTA input: " + std::strerror(errno));
    total_bytes += st.st_size;
  }
  RecordWriterOptions wo;
  wo.tokenizer = "fasta";
  wo.vocab_size = kFastaVocab;
  wo.commit_every = opt.commit_every;
  wo.zstd_over = opt.zstd_over;
  RecordWriter writer(out, wo);

  const bool tty = ::isatty(2);
  double last_print = t0;
  int64_t done_bytes = 0;
  const auto progress = [&](int64_t pos, bool final) {
    const double t = now_s();
    if (!opt.progress || (!final && t - last_print < (tty ? 0.25 : 2.0))) return;
    last_print = t;
    const double mb = double(done_bytes + pos) / 1e6;
    std::fprintf(stderr, "%sfasta2lmdb  %7.1f / %.1f MB  %3.0f%%  %7.1f MB/s  %lld records%s", tty ? "\r" : "", mb,
                 double(total_bytes) / 1e6, total_bytes ? 100.0 * double(done_bytes + pos) / double(total_bytes) : 100.0,
                 mb / std::max(t - t0, 1e-9), (long long)writer.count(),
                 tty && !final ? "" : "\n");
    std::fflush(stderr);
  };

  for (const auto& in : inputs) {
    Mapped m(in);
    const std::string_view text(m.data ? m.data : "", m.size);
    int64_t n = 0;
    const FastaSummary s = parse_fasta(text, in, opt.on_invalid, [&](const FastaRecord& r) {
      std::string_view meta = r.header.substr(0, 65535);
      writer.add(*r.tokens, 0, meta);
      if ((++n & 1023) == 0) progress(r.header.data() - text.data(), false);
    });
    done_bytes += int64_t(m.size);
    total.files += 1;
    total.bytes += int64_t(m.size);
    total.headers += s.headers;
    total.written += s.written;
    total.skipped_invalid += s.skipped_invalid;
    total.skipped_empty += s.skipped_empty;
    total.orphan_lines += s.orphan_lines;
    total.residues += s.residues;
    progress(0, false);
  }
  if (total.written == 0)  // an empty store would only fail later, in training
    throw IoError("no sequence records in the input" + std::string(inputs.size() > 1 ? "s" : " ") +
                  (inputs.size() == 1 ? inputs[0] : "") + " (" + std::to_string(total.headers) + " headers, " +
                  std::to_string(total.skipped_invalid + total.skipped_empty) + " skipped, " +
                  std::to_string(total.orphan_lines) + " lines before a first header): nothing written");
  writer.finish();
  total.compressed = writer.compressed();
  total.seconds = now_s() - t0;
  progress(0, true);
  return total;
}

}  // namespace brisk::data
