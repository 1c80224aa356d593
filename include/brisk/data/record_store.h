// Record store: variable-length token sequences with an int label and a small
// metadata string, kept in one LMDB file. This is what classification and
// encoder workloads read (e-mails with ham/spam labels, protein sequences with
// their FASTA headers), where token shards (shards.h) do not fit because each
// sample has its own length and label.
//
// Why LMDB: records are read by index in any order from a memory map with no
// parsing and no locking on the read path, many reader threads can share one
// file, and a write-once bulk load with MDB_APPEND runs at disk speed.
//
// On disk (one file, MDB_NOSUBDIR): a named database "meta" holding the store
// header (magic, version, token dtype, vocab size, record count, tokenizer
// name), and a named database "records" keyed by the 8-byte big-endian record
// index. Each record carries an xxh3 checksum, because LMDB itself has none.
// Writers build `path.tmp` and rename it to `path` when finished, so a crash
// never leaves a half store under the real name. Readers open the file
// read-only without a lock file: a store is write-once.
//
// Every problem a user can cause (a missing, truncated or foreign file, a
// damaged record, a store built with another tokenizer) is a core::IoError
// naming the path and the problem. LMDB's own pages carry no checksums and
// are trusted: damage inside them can stop the process in LMDB itself
// (docs/formats.md, "What is not checked").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace brisk::data {

enum class TokenDType : uint8_t { U16 = 1, I32 = 2 };

struct Record {
  std::vector<int32_t> tokens;
  int32_t label = 0;
  std::string meta;  // at most 65535 bytes
};

struct StoreInfo {
  uint32_t version = 0;
  TokenDType dtype = TokenDType::U16;
  int64_t vocab_size = 0;
  int64_t count = 0;
  std::string tokenizer;  // e.g. "bytes", "gpt2", "fasta"
  // How the converter made the records (e.g. "strip_headers": "true" from
  // `brisk data emails`); empty for stores written before notes existed.
  std::map<std::string, std::string> notes;
};

struct RecordWriterOptions {
  std::string tokenizer;            // stored in the header; readers may insist on it
  int64_t vocab_size = 0;           // every token must lie in [0, vocab_size)
  int64_t commit_every = 4096;      // records per write transaction
  int64_t zstd_over = 0;            // compress records with more tokens than this (0 = never)
  int zstd_level = 1;                // fast: conversion speed matters more than the last few %
  std::map<std::string, std::string> notes;  // stored beside the header (StoreInfo::notes)
};

// Bulk loader. Not thread-safe: one writer per store.
class RecordWriter {
 public:
  RecordWriter(const std::string& path, const RecordWriterOptions& opt);
  ~RecordWriter();  // without finish(): the temporary file is removed
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Throws core::ConfigError for a token outside the vocabulary or metadata over 64 KiB.
  void add(std::span<const int32_t> tokens, int32_t label, std::string_view meta);
  // Commits the last batch, writes the header, syncs and renames to the final path.
  void finish();

  int64_t count() const { return count_; }
  int64_t compressed() const { return compressed_; }  // records stored with zstd
  int64_t raw_bytes() const { return raw_bytes_; }    // token payload before compression
  int64_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Env;
  void flush();
  void discard();  // an unfinished store: its temporary files removed, then the lock released
  std::string path_, tmp_;
  int lock_fd_ = -1;  // holds the lock on tmp_ (core::open_locked_temporary) until it is renamed or removed
  RecordWriterOptions opt_;
  TokenDType dtype_;
  std::unique_ptr<Env> env_;
  std::vector<std::string> pending_;  // encoded values since the last commit
  std::vector<char> scratch_;
  int64_t count_ = 0, compressed_ = 0, raw_bytes_ = 0, stored_bytes_ = 0;
  bool finished_ = false;
};

// What a reader expects of a store; empty / 0 fields are not checked.
struct StoreExpect {
  std::string tokenizer;
  int64_t vocab_size = 0;
};

class RecordReader;

// An open store. Thread-safe: every reading thread makes its own RecordReader
// (one read-only transaction each), or calls get(), which opens a short one.
class RecordStore {
 public:
  explicit RecordStore(const std::string& path, const StoreExpect& expect = {});
  ~RecordStore();
  RecordStore(const RecordStore&) = delete;
  RecordStore& operator=(const RecordStore&) = delete;

  const std::string& path() const { return path_; }
  const StoreInfo& info() const { return info_; }
  int64_t size() const { return info_.count; }

  Record get(int64_t index) const;
  RecordReader reader() const;
  // Reads every record and checks its checksum; throws core::IoError at the first bad one.
  void verify() const;

 private:
  friend class RecordReader;
  struct Env;
  std::string path_;
  StoreInfo info_;
  std::unique_ptr<Env> env_;
};

// One thread's view of a store: a read-only transaction plus a cursor. Cheap
// to create; keep one per thread, never share one between threads.
class RecordReader {
 public:
  explicit RecordReader(const RecordStore& store);
  ~RecordReader();
  RecordReader(RecordReader&&) noexcept;
  RecordReader& operator=(RecordReader&&) = delete;
  RecordReader(const RecordReader&) = delete;

  // Reads record `index` into `out`, reusing its buffers.
  void get(int64_t index, Record& out);
  // Sequential scan in key order: seek(i), then next() until it returns false.
  void seek(int64_t index);
  bool next(Record& out);

 private:
  struct Txn;
  const RecordStore* store_;
  std::unique_ptr<Txn> txn_;
};

// Reads ahead on a background thread, in key order over [begin, end) or in
// the order of `indices`, into a bounded queue of `capacity` records, so the
// consumer finds the next record decoded and waiting. Errors on the
// background thread are rethrown by next().
class PrefetchReader {
 public:
  PrefetchReader(const RecordStore& store, int64_t begin, int64_t end, int64_t capacity = 1024);
  PrefetchReader(const RecordStore& store, std::vector<int64_t> indices, int64_t capacity = 1024);
  ~PrefetchReader();
  PrefetchReader(const PrefetchReader&) = delete;
  PrefetchReader& operator=(const PrefetchReader&) = delete;

  // Swaps the next record into `out` (its old buffers go back to the pool); false at the end.
  bool next(Record& out);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Checks and unpacks one stored record value (the bytes LMDB holds under a
// record key) of a store at `path` whose tokens are `dtype`; a damaged value
// is a core::IoError naming `path` and `index`. Every reader goes through
// this; it is public so that fuzz/record_decode.cpp can feed it any bytes.
void decode_record(std::string_view value, TokenDType dtype, const std::string& path, int64_t index, Record& out);

}  // namespace brisk::data
