// Pieces of the GPT-2 tokenizer that are plain data structures: UTF-8
// handling with node's replacement rule, the merge table keyed by pairs of
// symbol ids and the per-thread word cache. Kept apart from gpt2_bpe.cpp so
// that file reads as the JS encoder's algorithm; private to src/data.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace brisk::data::detail {

// ---- UTF-8 ---------------------------------------------------------------------------

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Length of the well-formed sequence at s[i], or 0 if it is not one. The
// bounds on the second byte exclude overlongs, surrogates and > U+10FFFF.
// On failure `*bad_len` is the maximal subpart that one U+FFFD replaces.
inline size_t utf8_seq(const unsigned char* s, size_t n, size_t i, size_t* bad_len) {
  const unsigned char b = s[i];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *bad_len = 1;
    return 0;
  }
  size_t k = 0;
  while (k < need && i + 1 + k < n && s[i + 1 + k] >= lo && s[i + 1 + k] <= hi) {
    ++k;
    lo = 0x80;
    hi = 0xBF;
  }
  if (k == need) return need + 1;
  *bad_len = k + 1;
  return 0;
}

// `text` itself when it is valid UTF-8, else a copy in `buf` with each
// invalid sequence replaced by U+FFFD, as node's 'utf8' decoding does.
inline std::string_view well_formed(std::string_view text, std::string& buf) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0, bad = 0;
  bool copying = false;
  while (i < n) {
    if (s[i] < 0x80) {
      if (copying) buf += static_cast<char>(s[i]);
      ++i;
      continue;
    }
    if (size_t len = utf8_seq(s, n, i, &bad)) {
      if (copying) buf.append(text.data() + i, len);
      i += len;
      continue;
    }
    if (!copying) {
      buf.reserve(n + n / 8 + 16);
      buf.assign(text.data(), i);
      copying = true;
    }
    append_utf8(buf, 0xFFFD);
    i += bad;
  }
  return copying ? std::string_view(buf) : text;
}

// Decodes the (valid) sequence at s[i].
inline char32_t utf8_at(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) return p[0];
  if (p[0] < 0xE0) return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  if (p[0] < 0xF0) return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// ECMAScript WhiteSpace and LineTerminator: what \s means in a JS regex.
constexpr const char* kJsSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

inline bool is_js_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

// ---- symbol-pair merge table -----------------------------------------------------------

// Open addressing on (left id, right id): the merge loop's hot lookup.
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr int32_t kNone = INT32_MAX;

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    slots_[index(key(a, b))] = {key(a, b), rank, merged};
  }
  const Entry* find(int32_t a, int32_t b) const {
    const Entry& e = slots_[index(key(a, b))];
    return e.key == kEmpty ? nullptr : &e;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are < 2^31, so never a real key
  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  // The slot holding k, or the empty slot where it would go (never full: reserve() sizes 2x).
  size_t index(uint64_t k) const {
    size_t i = (k * 0x9E3779B97F4A7C15ull) >> 20 & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask_;
    return i;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// ---- word cache ----------------------------------------------------------------------

inline uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  if (n) {  // the tail without a byte-wise copy (the length is in the seed)
    uint64_t v;
    if (n >= 4) {
      uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + n - 4, 4);
      v = lo | uint64_t(hi) << 32;
    } else {
      const auto* u = reinterpret_cast<const unsigned char*>(p);
      v = u[0] | uint64_t(u[n / 2]) << 8 | uint64_t(u[n - 1]) << 16;
    }
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  }
  return h ^ (h >> 29);
}

// word bytes -> ids, open addressing over flat arrays: the hit path is one
// hash, one probe and one compare, with no per-entry allocation.
class WordCache {
 public:
  static constexpr size_t kMaxWords = size_t(1) << 18;

  const int32_t* find(std::string_view w, uint64_t h, uint32_t* len) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.str_len == 0) return nullptr;
      if (s.hash == uint32_t(h >> 32) && s.str_len == w.size() &&
          std::memcmp(chars_.data() + s.str_off, w.data(), w.size()) == 0) {
        *len = s.ids_len;
        return ids_.data() + s.ids_off;
      }
    }
  }
  void insert(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
    if (w.size() > UINT16_MAX) return;  // too rare to be worth a slot
    if (2 * (used_ + 1) > slots_.size()) grow();
    size_t i = h & mask_;
    while (slots_[i].str_len != 0) i = (i + 1) & mask_;
    slots_[i] = {uint32_t(h >> 32), uint32_t(chars_.size()), uint32_t(ids_.size()), uint16_t(w.size()),
                 uint16_t(n)};
    chars_.append(w);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }
  // Bounded: a long run over diverse text must not grow without limit.
  bool full() const { return used_ >= kMaxWords || chars_.size() > (size_t(1) << 28); }
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    chars_.clear();
    ids_.clear();
    used_ = 0;
  }

 private:
  // 16 bytes: the slot load is the cache miss that dominates a hit.
  struct Slot {
    uint32_t hash = 0;  // high half; the low bits pick the slot
    uint32_t str_off = 0, ids_off = 0;
    uint16_t str_len = 0;  // 0: empty (cached words have >= 2 bytes)
    uint16_t ids_len = 0;  // <= str_len
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 4096 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.str_len == 0) continue;
      size_t i = rehash_of(s) & mask_;
      while (slots_[i].str_len != 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  uint64_t rehash_of(const Slot& s) const { return hash_bytes({chars_.data() + s.str_off, s.str_len}); }
  std::vector<Slot> slots_;
  size_t mask_ = 0, used_ = 0;
  std::string chars_;
  std::vector<int32_t> ids_;
};

}  // namespace brisk::data::detail
