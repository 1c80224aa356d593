// The LMDB record store (see record_store.h for the format and why LMDB).
//
// A record value is a 24-byte head (xxh3 checksum of everything after it,
// label, token count, stored payload bytes, metadata length, flags), then the
// metadata, then the token payload (uint16 or int32, zstd-compressed when the
// record's flag says so). The checksum exists because LMDB has none: a flipped
// byte in a data page would otherwise come back as a wrong token silently.
//
// LMDB itself is trusted only after cheap checks that keep a damaged file from
// crashing the process: a file shorter than the last page LMDB's meta page
// names would make the map fault (SIGBUS) on first touch, so open() compares
// the two. Readers open with MDB_NOLOCK | MDB_NOTLS: no lock file is needed
// for a write-once store, and a transaction may live on any thread.
//
// On-disk integers are little-endian (we only build for little-endian hosts);
// record keys are big-endian so that LMDB's byte order is index order, which
// is what lets the writer use MDB_APPEND and the reader scan with MDB_NEXT.
#include "brisk/data/record_store.h"

#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <nlohmann/json.hpp>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"

namespace brisk::data {

namespace fs = std::filesystem;
using core::ConfigError;
using core::IoError;

namespace {

static_assert(std::endian::native == std::endian::little, "record stores are little-endian on disk");

constexpr char kMagic[8] = {'B', 'R', 'I', 'S', 'K', 'R', 'E', 'C'};
constexpr uint32_t kVersion = 1;
constexpr uint8_t kFlagZstd = 1;

struct StoreHeader {
  char magic[8];
  uint32_t version;
  uint8_t dtype;
  uint8_t pad[3];
  int64_t vocab_size;
  int64_t count;
  uint32_t tokenizer_len;
  uint32_t pad2;
};  // followed by the tokenizer name, then xxh3 of everything before
static_assert(sizeof(StoreHeader) == 40);

struct RecordHead {
  uint64_t checksum;  // xxh3_64 of the value bytes after this field
  int32_t label;
  uint32_t n_tokens;
  uint32_t payload_bytes;
  uint16_t meta_len;
  uint8_t flags;
  uint8_t reserved;
};
static_assert(sizeof(RecordHead) == 24);

int elem_bytes(TokenDType d) { return d == TokenDType::U16 ? 2 : 4; }

void put_key(uint64_t index, unsigned char out[8]) {
  for (int i = 7; i >= 0; --i, index >>= 8) out[i] = static_cast<unsigned char>(index & 0xff);
}
uint64_t get_key(const MDB_val& k) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(k.mv_data);
  for (size_t i = 0; i < k.mv_size; ++i) v = (v << 8) | p[i];
  return v;
}

std::string lmdb_text(int rc) { return mdb_strerror(rc); }

[[noreturn]] void throw_lmdb(const std::string& path, const std::string& what, int rc) {
  std::string hint;
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID || rc == MDB_BAD_TXN)
    hint = " (the store is damaged: rebuild it with `brisk data ...`)";
  throw IoError(path + ": " + what + ": " + lmdb_text(rc) + hint);
}

}  // namespace

// ==== writer ===========================================================================

struct RecordWriter::Env {
  MDB_env* env = nullptr;
  MDB_dbi records = 0, meta = 0;
  size_t map_size = size_t(1) << 30;
  ZSTD_CCtx* cctx = nullptr;
  ~Env() {
    if (env) mdb_env_close(env);
    if (cctx) ZSTD_freeCCtx(cctx);
  }
};

RecordWriter::RecordWriter(const std::string& path, const RecordWriterOptions& opt)
    : path_(path), tmp_(path + ".tmp"), opt_(opt), env_(std::make_unique<Env>()) {
  if (opt_.vocab_size <= 0) throw ConfigError(path + ": record store needs a vocab size > 0");
  if (opt_.tokenizer.empty()) throw ConfigError(path + ": record store needs a tokenizer name");
  if (opt_.commit_every <= 0) opt_.commit_every = 1;
  dtype_ = opt_.vocab_size <= 65536 ? TokenDType::U16 : TokenDType::I32;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw IoError(path + ": is a directory; a record store is a single file");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  // Locked and emptied rather than removed: a second converter writing the
  // same store removed the first one's file, which then renamed the
  // second's half-written one into place and reported success.
  lock_fd_ = core::open_locked_temporary(tmp_, path_);
  fs::remove(tmp_ + "-lock", ec);

  try {
    int rc = mdb_env_create(&env_->env);
    if (rc == 0) rc = mdb_env_set_maxdbs(env_->env, 2);
    if (rc == 0) rc = mdb_env_set_mapsize(env_->env, env_->map_size);
    // NOSYNC: a bulk load is synced once in finish(); a crash before that leaves only path.tmp.
    if (rc == 0) rc = mdb_env_open(env_->env, tmp_.c_str(), MDB_NOSUBDIR | MDB_NOSYNC, 0644);
    if (rc != 0) throw_lmdb(tmp_, "cannot create record store", rc);
    MDB_txn* txn = nullptr;
    rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
    if (rc == 0) rc = mdb_dbi_open(txn, "records", MDB_CREATE, &env_->records);
    if (rc == 0) rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &env_->meta);
    if (rc == 0) rc = mdb_txn_commit(txn);
    else if (txn) mdb_txn_abort(txn);
    if (rc != 0) throw_lmdb(tmp_, "cannot create record store databases", rc);
  } catch (...) {  // no destructor runs for a constructor that throws
    discard();
    throw;
  }
}

RecordWriter::~RecordWriter() {
  if (!finished_) discard();
}

void RecordWriter::discard() {
  env_.reset();
  std::error_code ec;
  fs::remove(tmp_, ec);
  fs::remove(tmp_ + "-lock", ec);
  ::close(lock_fd_);  // after the removal: the lock guards the name until then
  lock_fd_ = -1;
}

void RecordWriter::add(std::span<const int32_t> tokens, int32_t label, std::string_view meta) {
  if (finished_) throw core::Error(path_ + ": add() after finish()");
  if (meta.size() > 65535)
    throw ConfigError(path_ + ": record metadata is " + std::to_string(meta.size()) + " bytes; the limit is 65535");
  if (tokens.size() > 0xffffffffu) throw ConfigError(path_ + ": record too long");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= opt_.vocab_size)
      throw ConfigError(path_ + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                        " of record " + std::to_string(count_) + " is outside the vocabulary [0, " +
                        std::to_string(opt_.vocab_size) + ")");
  const size_t raw_n = tokens.size() * size_t(elem_bytes(dtype_));
  const char* raw = reinterpret_cast<const char*>(tokens.data());
  if (dtype_ == TokenDType::U16) {
    scratch_.resize(raw_n);
    auto* d = reinterpret_cast<uint16_t*>(scratch_.data());
    for (size_t i = 0; i < tokens.size(); ++i) d[i] = static_cast<uint16_t>(tokens[i]);
    raw = scratch_.data();
  }
  const char* payload = raw;
  size_t payload_n = raw_n;
  uint8_t flags = 0;
  std::string packed;
  if (opt_.zstd_over > 0 && int64_t(tokens.size()) > opt_.zstd_over) {
    if (!env_->cctx) {
      // Parameters set once and kept: compressing per record then reuses the
      // context's tables instead of rebuilding them for every small record.
      env_->cctx = ZSTD_createCCtx();
      ZSTD_CCtx_setParameter(env_->cctx, ZSTD_c_compressionLevel, opt_.zstd_level);
      ZSTD_CCtx_setParameter(env_->cctx, ZSTD_c_checksumFlag, 0);  // the record checksum covers it
      ZSTD_CCtx_setParameter(env_->cctx, ZSTD_c_contentSizeFlag, 0);
    }
    packed.resize(ZSTD_compressBound(raw_n));
    const size_t z = ZSTD_compress2(env_->cctx, packed.data(), packed.size(), raw, raw_n);
    if (ZSTD_isError(z)) throw IoError(path_ + ": zstd failed: " + ZSTD_getErrorName(z));
    if (z < raw_n) {  // incompressible records stay raw: reading them is cheaper
      payload = packed.data();
      payload_n = z;
      flags |= kFlagZstd;
      ++compressed_;
    }
  }
  RecordHead h{};
  h.label = label;
  h.n_tokens = static_cast<uint32_t>(tokens.size());
  h.payload_bytes = static_cast<uint32_t>(payload_n);
  h.meta_len = static_cast<uint16_t>(meta.size());
  h.flags = flags;
  std::string v(sizeof h + meta.size() + payload_n, '\0');
  // memcpy from a null pointer is undefined even for 0 bytes (an empty
  // record's payload and an empty meta have none).
  if (!meta.empty()) std::memcpy(v.data() + sizeof h, meta.data(), meta.size());
  if (payload_n > 0) std::memcpy(v.data() + sizeof h + meta.size(), payload, payload_n);
  std::memcpy(v.data(), &h, sizeof h);
  h.checksum = XXH3_64bits(v.data() + 8, v.size() - 8);
  std::memcpy(v.data(), &h.checksum, 8);
  pending_.push_back(std::move(v));
  raw_bytes_ += int64_t(raw_n);
  stored_bytes_ += int64_t(payload_n);
  ++count_;
  if (int64_t(pending_.size()) >= opt_.commit_every) flush();
}

// One write transaction for the whole batch. A full map aborts the batch, so
// the batch is kept until its commit succeeds, then replayed into a doubled map.
void RecordWriter::flush() {
  if (pending_.empty()) return;
  const uint64_t first = uint64_t(count_) - pending_.size();
  for (;;) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
    if (rc != 0) throw_lmdb(tmp_, "cannot begin write transaction", rc);
    for (size_t i = 0; i < pending_.size() && rc == 0; ++i) {
      unsigned char kb[8];
      put_key(first + i, kb);
      MDB_val k{8, kb}, v{pending_[i].size(), pending_[i].data()};
      rc = mdb_put(txn, env_->records, &k, &v, MDB_APPEND);
    }
    if (rc == 0) {
      rc = mdb_txn_commit(txn);
    } else {
      mdb_txn_abort(txn);
    }
    if (rc == 0) break;
    if (rc != MDB_MAP_FULL) throw_lmdb(tmp_, "cannot write records", rc);
    env_->map_size *= 2;
    rc = mdb_env_set_mapsize(env_->env, env_->map_size);
    if (rc != 0) throw_lmdb(tmp_, "cannot grow the map", rc);
  }
  pending_.clear();
}

void RecordWriter::finish() {
  if (finished_) return;
  flush();
  std::string h(sizeof(StoreHeader) + opt_.tokenizer.size() + 8, '\0');
  StoreHeader sh{};
  std::memcpy(sh.magic, kMagic, 8);
  sh.version = kVersion;
  sh.dtype = static_cast<uint8_t>(dtype_);
  sh.vocab_size = opt_.vocab_size;
  sh.count = count_;
  sh.tokenizer_len = static_cast<uint32_t>(opt_.tokenizer.size());
  std::memcpy(h.data(), &sh, sizeof sh);
  std::memcpy(h.data() + sizeof sh, opt_.tokenizer.data(), opt_.tokenizer.size());
  const uint64_t sum = XXH3_64bits(h.data(), h.size() - 8);
  std::memcpy(h.data() + h.size() - 8, &sum, 8);
  for (;;) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
    if (rc != 0) throw_lmdb(tmp_, "cannot begin write transaction", rc);
    MDB_val k{6, const_cast<char*>("header")}, v{h.size(), h.data()};
    rc = mdb_put(txn, env_->meta, &k, &v, 0);
    if (rc == 0 && !opt_.notes.empty()) {
      std::string notes = nlohmann::json(opt_.notes).dump();
      MDB_val nk{5, const_cast<char*>("notes")}, nv{notes.size(), notes.data()};
      rc = mdb_put(txn, env_->meta, &nk, &nv, 0);
    }
    if (rc == 0) rc = mdb_txn_commit(txn);
    else mdb_txn_abort(txn);
    if (rc == 0) break;
    if (rc != MDB_MAP_FULL) throw_lmdb(tmp_, "cannot write the store header", rc);
    env_->map_size *= 2;
    if ((rc = mdb_env_set_mapsize(env_->env, env_->map_size)) != 0) throw_lmdb(tmp_, "cannot grow the map", rc);
  }
  if (int rc = mdb_env_sync(env_->env, 1); rc != 0) throw_lmdb(tmp_, "cannot sync", rc);
  env_.reset();
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw IoError("cannot rename " + tmp_ + " to " + path_ + ": " + ec.message());
  fs::remove(tmp_ + "-lock", ec);
  fs::remove(path_ + "-lock", ec);  // a stale lock from an older store under this name
  finished_ = true;
  ::close(lock_fd_);
  lock_fd_ = -1;
}

// ==== reader ===========================================================================

struct RecordStore::Env {
  MDB_env* env = nullptr;
  MDB_dbi records = 0, meta = 0;
  ~Env() {
    if (env) mdb_env_close(env);
  }
};

struct RecordReader::Txn {
  MDB_txn* txn = nullptr;
  MDB_cursor* cur = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<char> scratch;
  bool seek_pending = true;
  uint64_t seek_to = 0;
  ~Txn() {
    if (cur) mdb_cursor_close(cur);
    if (txn) mdb_txn_abort(txn);
    if (dctx) ZSTD_freeDCtx(dctx);
  }
};

RecordStore::RecordStore(const std::string& path, const StoreExpect& expect)
    : path_(path), env_(std::make_unique<Env>()) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw IoError(path + ": no such record store (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode))
    throw IoError(path + ": is a directory; a brisk record store is a single LMDB file (made by `brisk data ...`)");
  if (st.st_size < 2 * 4096)
    throw IoError(path + ": " + std::to_string(st.st_size) +
                  " bytes is too small for an LMDB file: truncated, or not a record store");
  int rc = mdb_env_create(&env_->env);
  if (rc == 0) rc = mdb_env_set_maxdbs(env_->env, 2);
  if (rc == 0) rc = mdb_env_open(env_->env, path.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOTLS, 0644);
  if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
    throw IoError(path + ": not a valid LMDB file (" + lmdb_text(rc) + "): the file is damaged or not a record store");
  if (rc != 0) throw_lmdb(path, "cannot open record store", rc);
  MDB_envinfo ei{};
  MDB_stat es{};
  mdb_env_info(env_->env, &ei);
  mdb_env_stat(env_->env, &es);
  const uint64_t needed = (uint64_t(ei.me_last_pgno) + 1) * es.ms_psize;
  if (needed > uint64_t(st.st_size))
    throw IoError(path + ": truncated: LMDB's meta page needs " + std::to_string(needed) + " bytes, the file has " +
                  std::to_string(st.st_size));

  MDB_txn* txn = nullptr;
  if ((rc = mdb_txn_begin(env_->env, nullptr, MDB_RDONLY, &txn)) != 0) throw_lmdb(path, "cannot read", rc);
  auto fail = [&](const std::string& msg) {
    mdb_txn_abort(txn);
    throw IoError(path + ": " + msg);
  };
  rc = mdb_dbi_open(txn, "meta", 0, &env_->meta);
  if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
    fail("an LMDB file but not a brisk record store (no 'meta' database with a store header)");
  if (rc != 0) fail(std::string("cannot open the 'meta' database: ") + lmdb_text(rc));
  MDB_val k{6, const_cast<char*>("header")}, v{};
  rc = mdb_get(txn, env_->meta, &k, &v);
  if (rc == MDB_NOTFOUND) fail("not a brisk record store (its 'meta' database holds no header)");
  if (rc != 0) fail(std::string("cannot read the store header: ") + lmdb_text(rc));
  StoreHeader sh{};
  if (v.mv_size < sizeof sh + 8) fail("store header is " + std::to_string(v.mv_size) + " bytes, too short");
  std::memcpy(&sh, v.mv_data, sizeof sh);
  const char* hb = static_cast<const char*>(v.mv_data);
  if (std::memcmp(sh.magic, kMagic, 8) != 0) fail("not a brisk record store (bad magic in the store header)");
  if (sh.version != kVersion)
    fail("record store version " + std::to_string(sh.version) + "; this build reads version " +
         std::to_string(kVersion));
  if (v.mv_size != sizeof sh + sh.tokenizer_len + 8) fail("store header has the wrong size: damaged");
  uint64_t sum = 0;
  std::memcpy(&sum, hb + v.mv_size - 8, 8);
  if (sum != XXH3_64bits(hb, v.mv_size - 8)) fail("store header checksum mismatch: damaged");
  if (sh.dtype != uint8_t(TokenDType::U16) && sh.dtype != uint8_t(TokenDType::I32))
    fail("unknown token dtype " + std::to_string(sh.dtype) + " in the store header");
  if (sh.vocab_size <= 0 || sh.count < 0) fail("store header holds a bad vocab size or count: damaged");
  info_.version = sh.version;
  info_.dtype = static_cast<TokenDType>(sh.dtype);
  info_.vocab_size = sh.vocab_size;
  info_.count = sh.count;
  info_.tokenizer.assign(hb + sizeof sh, sh.tokenizer_len);
  MDB_val nk{5, const_cast<char*>("notes")}, nv{};
  rc = mdb_get(txn, env_->meta, &nk, &nv);
  if (rc == 0) {
    const auto notes = nlohmann::json::parse(std::string_view(static_cast<const char*>(nv.mv_data), nv.mv_size),
                                             nullptr, /*allow_exceptions=*/false);
    if (!notes.is_object()) fail("the store's notes are not a JSON object: damaged");
    for (const auto& [key, value] : notes.items()) {
      if (!value.is_string()) fail("the store's note '" + key + "' is not a string: damaged");
      info_.notes[key] = value.get<std::string>();
    }
  } else if (rc != MDB_NOTFOUND) {
    fail(std::string("cannot read the store's notes: ") + lmdb_text(rc));
  }
  if ((rc = mdb_dbi_open(txn, "records", 0, &env_->records)) != 0)
    fail(std::string("cannot open the 'records' database: ") + lmdb_text(rc));
  MDB_stat rs{};
  if ((rc = mdb_stat(txn, env_->records, &rs)) != 0) fail(std::string("cannot stat records: ") + lmdb_text(rc));
  if (int64_t(rs.ms_entries) != info_.count)
    fail("header says " + std::to_string(info_.count) + " records but the store holds " +
         std::to_string(rs.ms_entries) + ": damaged or incompletely written");
  // Committing a read-only transaction keeps the database handles for later ones.
  if ((rc = mdb_txn_commit(txn)) != 0) throw_lmdb(path, "cannot read", rc);

  const auto desc = [](const std::string& t, int64_t v) { return "'" + t + "' (vocab " + std::to_string(v) + ")"; };
  if (!expect.tokenizer.empty() && expect.tokenizer != info_.tokenizer)
    throw IoError(path + ": store was built with tokenizer " + desc(info_.tokenizer, info_.vocab_size) +
                  ", expected '" + expect.tokenizer + "': rebuild it or pick the matching model");
  if (expect.vocab_size > 0 && expect.vocab_size != info_.vocab_size)
    throw IoError(path + ": store was built with tokenizer " + desc(info_.tokenizer, info_.vocab_size) +
                  ", expected vocab " + std::to_string(expect.vocab_size));
}

RecordStore::~RecordStore() = default;

Record RecordStore::get(int64_t index) const {
  RecordReader r(*this);
  Record out;
  r.get(index, out);
  return out;
}

RecordReader RecordStore::reader() const { return RecordReader(*this); }

void RecordStore::verify() const {
  RecordReader r(*this);
  Record rec;
  int64_t n = 0;
  for (r.seek(0); r.next(rec);) ++n;
  if (n != info_.count)
    throw IoError(path_ + ": scan found " + std::to_string(n) + " records, header says " +
                  std::to_string(info_.count));
}

RecordReader::RecordReader(const RecordStore& store) : store_(&store), txn_(std::make_unique<Txn>()) {
  int rc = mdb_txn_begin(store.env_->env, nullptr, MDB_RDONLY, &txn_->txn);
  if (rc == 0) rc = mdb_cursor_open(txn_->txn, store.env_->records, &txn_->cur);
  if (rc != 0) throw_lmdb(store.path_, "cannot begin a read transaction", rc);
}
RecordReader::~RecordReader() = default;
RecordReader::RecordReader(RecordReader&&) noexcept = default;

namespace {

// Checks and unpacks one stored value of a store at `path` holding `dt`
// tokens; `index` names the record in errors.
void decode_value(const std::string& path, TokenDType dt, int64_t index, const MDB_val& v, ZSTD_DCtx*& dctx,
                  std::vector<char>& scratch, Record& out) {
  const auto bad = [&](const std::string& why) {
    return IoError(path + ": record " + std::to_string(index) + " is damaged (" + why +
                   "): rebuild the store with `brisk data ...`");
  };
  RecordHead h{};
  if (v.mv_size < sizeof h) throw bad("value of " + std::to_string(v.mv_size) + " bytes is shorter than its head");
  const char* p = static_cast<const char*>(v.mv_data);
  std::memcpy(&h, p, sizeof h);
  if (sizeof h + h.meta_len + uint64_t(h.payload_bytes) != v.mv_size) throw bad("sizes do not add up");
  if (XXH3_64bits(p + 8, v.mv_size - 8) != h.checksum) throw bad("checksum mismatch");
  const size_t raw_n = size_t(h.n_tokens) * elem_bytes(dt);
  // The token count decides what is allocated below, so it is checked against
  // the payload first. A raw payload is exactly the tokens; a zstd one can
  // expand at most ZSTD_BLOCKSIZE_MAX / 4 times (a block of that size as a
  // 4-byte RLE block), so a count beyond that is a lie, not a good ratio.
  constexpr uint64_t kZstdMaxRatio = ZSTD_BLOCKSIZE_MAX / 4;
  if (!(h.flags & kFlagZstd) && h.payload_bytes != raw_n) throw bad("payload size does not match its token count");
  if ((h.flags & kFlagZstd) && raw_n > uint64_t(h.payload_bytes) * kZstdMaxRatio)
    throw bad("its " + std::to_string(h.payload_bytes) + " zstd bytes cannot hold the " + std::to_string(h.n_tokens) +
              " tokens its head claims");
  out.label = h.label;
  out.meta.assign(p + sizeof h, h.meta_len);
  const char* payload = p + sizeof h + h.meta_len;
  out.tokens.resize(h.n_tokens);
  if (h.flags & kFlagZstd) {
    if (!dctx) dctx = ZSTD_createDCtx();
    char* dst = reinterpret_cast<char*>(out.tokens.data());
    if (dt == TokenDType::U16) {
      scratch.resize(raw_n);
      dst = scratch.data();
    }
    const size_t z = ZSTD_decompressDCtx(dctx, dst, raw_n, payload, h.payload_bytes);
    if (ZSTD_isError(z) || z != raw_n) throw bad("zstd payload does not decompress to its token count");
    payload = dst;
  }
  if (dt == TokenDType::U16) {
    // A raw payload follows metadata of any length, so it can start at an odd
    // address: each token is copied out, never read through a uint16_t*.
    for (size_t i = 0; i < h.n_tokens; ++i) {
      uint16_t t;
      std::memcpy(&t, payload + 2 * i, 2);
      out.tokens[i] = t;
    }
  } else if (raw_n > 0 && payload != reinterpret_cast<const char*>(out.tokens.data())) {
    // raw_n > 0: an empty record's token vector may have no buffer (data() is
    // null), and memcpy must not be handed a null pointer even for 0 bytes.
    std::memcpy(out.tokens.data(), payload, raw_n);
  }
}

}  // namespace

void decode_record(std::string_view value, TokenDType dtype, const std::string& path, int64_t index, Record& out) {
  struct DCtx {  // freed on every exit path, throws included
    ZSTD_DCtx* p = nullptr;
    ~DCtx() { ZSTD_freeDCtx(p); }
  } dctx;
  std::vector<char> scratch;
  const MDB_val v{value.size(), const_cast<char*>(value.data())};
  decode_value(path, dtype, index, v, dctx.p, scratch, out);
}

void RecordReader::get(int64_t index, Record& out) {
  if (index < 0 || index >= store_->size())
    throw core::Error(store_->path() + ": record index " + std::to_string(index) + " outside [0, " +
                      std::to_string(store_->size()) + ")");
  unsigned char kb[8];
  put_key(uint64_t(index), kb);
  MDB_val k{8, kb}, v{};
  const int rc = mdb_get(txn_->txn, store_->env_->records, &k, &v);
  if (rc == MDB_NOTFOUND) throw IoError(store_->path() + ": record " + std::to_string(index) + " is missing: damaged");
  if (rc != 0) throw_lmdb(store_->path(), "cannot read record " + std::to_string(index), rc);
  decode_value(store_->path(), store_->info().dtype, index, v, txn_->dctx, txn_->scratch, out);
}

void RecordReader::seek(int64_t index) {
  txn_->seek_pending = true;
  txn_->seek_to = uint64_t(std::max<int64_t>(index, 0));
}

bool RecordReader::next(Record& out) {
  unsigned char kb[8];
  MDB_val k{}, v{};
  int rc;
  if (txn_->seek_pending) {
    put_key(txn_->seek_to, kb);
    k = MDB_val{8, kb};
    rc = mdb_cursor_get(txn_->cur, &k, &v, MDB_SET_RANGE);
    txn_->seek_pending = false;
  } else {
    rc = mdb_cursor_get(txn_->cur, &k, &v, MDB_NEXT);
  }
  if (rc == MDB_NOTFOUND) return false;
  if (rc != 0) throw_lmdb(store_->path(), "cannot scan records", rc);
  if (k.mv_size != 8) throw IoError(store_->path() + ": a record key of " + std::to_string(k.mv_size) + " bytes: damaged");
  decode_value(store_->path(), store_->info().dtype, int64_t(get_key(k)), v, txn_->dctx, txn_->scratch, out);
  return true;
}

// ==== prefetching reader =================================================================

// Records travel in chunks so the lock is taken once per chunk, not per
// record; consumed chunks go back to a pool with their buffers, so the steady
// state allocates nothing.
struct PrefetchReader::State {
  const RecordStore* store;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> indices;
  bool use_indices = false;
  size_t chunk = 64, max_chunks = 16;
  std::mutex mu;
  std::condition_variable not_full, not_empty;
  std::deque<std::vector<Record>> ready;
  std::vector<std::vector<Record>> pool;
  std::vector<Record> current;
  size_t pos = 0;
  bool done = false, stop = false;
  // Who sleeps: a wake-up (a futex call) is paid only when someone waits.
  bool producer_waiting = false, consumer_waiting = false;
  std::exception_ptr error;
  std::thread worker;

  void run() {
    try {
      RecordReader r(*store);
      const int64_t n = use_indices ? int64_t(indices.size()) : end - begin;
      if (!use_indices) r.seek(begin);
      for (int64_t i = 0; i < n;) {
        std::vector<Record> c;
        {
          std::unique_lock lk(mu);
          if (!stop && ready.size() >= max_chunks) {
            // Sleep until the consumer has drained half the queue, not one
            // chunk: one wake-up per max_chunks/2 chunks instead of per chunk.
            producer_waiting = true;
            not_full.wait(lk, [&] { return stop || ready.size() <= max_chunks / 2; });
            producer_waiting = false;
          }
          if (stop) return;
          if (!pool.empty()) {
            c = std::move(pool.back());
            pool.pop_back();
          }
        }
        const size_t m = size_t(std::min<int64_t>(int64_t(chunk), n - i));
        c.resize(m);
        for (size_t j = 0; j < m; ++j, ++i) {
          if (use_indices) {
            r.get(indices[size_t(i)], c[j]);
          } else if (!r.next(c[j])) {
            throw IoError(store->path() + ": store ended at record " + std::to_string(begin + i) +
                          " before its header's count: damaged");
          }
        }
        std::lock_guard lk(mu);
        ready.push_back(std::move(c));
        if (consumer_waiting) not_empty.notify_one();
      }
    } catch (...) {
      std::lock_guard lk(mu);
      error = std::current_exception();
    }
    std::lock_guard lk(mu);
    done = true;
    not_empty.notify_all();
  }
};

PrefetchReader::PrefetchReader(const RecordStore& store, int64_t begin, int64_t end, int64_t capacity)
    : s_(std::make_unique<State>()) {
  s_->store = &store;
  s_->begin = std::clamp<int64_t>(begin, 0, store.size());
  s_->end = std::clamp<int64_t>(end, s_->begin, store.size());
  s_->chunk = size_t(std::clamp<int64_t>(capacity / 4, 1, 64));
  s_->max_chunks = size_t(std::max<int64_t>(1, capacity / int64_t(s_->chunk)));
  s_->worker = std::thread([s = s_.get()] { s->run(); });
}

PrefetchReader::PrefetchReader(const RecordStore& store, std::vector<int64_t> indices, int64_t capacity)
    : s_(std::make_unique<State>()) {
  s_->store = &store;
  s_->indices = std::move(indices);
  s_->use_indices = true;
  s_->chunk = size_t(std::clamp<int64_t>(capacity / 4, 1, 64));
  s_->max_chunks = size_t(std::max<int64_t>(1, capacity / int64_t(s_->chunk)));
  s_->worker = std::thread([s = s_.get()] { s->run(); });
}

PrefetchReader::~PrefetchReader() {
  {
    std::lock_guard lk(s_->mu);
    s_->stop = true;
  }
  s_->not_full.notify_all();
  if (s_->worker.joinable()) s_->worker.join();
}

bool PrefetchReader::next(Record& out) {
  State& s = *s_;
  if (s.pos >= s.current.size()) {
    std::unique_lock lk(s.mu);
    if (!s.current.empty()) s.pool.push_back(std::move(s.current));
    s.current.clear();
    s.pos = 0;
    if (s.ready.empty() && !s.done) {
      s.consumer_waiting = true;
      s.not_empty.wait(lk, [&] { return !s.ready.empty() || s.done; });
      s.consumer_waiting = false;
    }
    if (s.ready.empty()) {
      if (s.error) std::rethrow_exception(s.error);
      return false;
    }
    s.current = std::move(s.ready.front());
    s.ready.pop_front();
    if (s.producer_waiting && s.ready.size() <= s.max_chunks / 2) s.not_full.notify_one();
  }
  std::swap(out, s.current[s.pos++]);
  return true;
}

}  // namespace brisk::data
