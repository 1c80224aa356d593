// What the GGUF tests read back from a file, written apart from the
// exporter: the tensor infos and bytes of a GGUF v3 file, and ggml's
// dequantization of every type `brisk export gguf` writes, after ggml's
// dequantize_row_* (the arithmetic llama.cpp's CPU backend reads weights
// with). A file the exporter wrote in one layout and this reads in another
// would fail the tests' accuracy bounds; this reader reading differently
// from llama.cpp would fail their comparison with llama.cpp's outputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "brisk/core/dtype.h"

namespace brisk::export_test {

struct GgufTensor {
  uint32_t type = 0;           // ggml type id
  std::vector<uint64_t> dims;  // innermost first
  std::vector<uint8_t> bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (uint64_t d : dims) n *= int64_t(d);
    return n;
  }
};

// ggml's ids for the types the exporter writes.
enum : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

inline const char* ggml_name(uint32_t t) {
  switch (t) {
    case kF32: return "f32";
    case kF16: return "f16";
    case kQ4_0: return "q4_0";
    case kQ8_0: return "q8_0";
    case kQ4_K: return "q4_K";
    case kQ5_K: return "q5_K";
    case kQ6_K: return "q6_K";
  }
  return "?";
}

// Values per block and bytes per block of a type.
inline std::pair<int64_t, int64_t> ggml_block(uint32_t t) {
  switch (t) {
    case kF32: return {1, 4};
    case kF16: return {1, 2};
    case kQ4_0: return {32, 18};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
  }
  throw std::runtime_error("gguf_reader: ggml type " + std::to_string(t) + " is not read here");
}

class GgufFile {
 public:
  explicit GgufFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    b_.assign(std::istreambuf_iterator<char>(f), {});
    if (b_.size() < 24 || std::memcmp(b_.data(), "GGUF", 4) != 0) throw std::runtime_error(path + ": not GGUF");
    at_ = 4;
    if (get<uint32_t>() != 3) throw std::runtime_error(path + ": not GGUF v3");
    const uint64_t n_tensors = get<uint64_t>(), n_kv = get<uint64_t>();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t type = get<uint32_t>();
      if (key == "general.alignment") alignment = get<uint32_t>();
      else if (type == 4) u32_[key] = get<uint32_t>();
      else skip(type);
    }
    struct Info {
      std::string name;
      GgufTensor t;
      uint64_t offset;
    };
    std::vector<Info> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      Info info;
      info.name = str();
      const uint32_t rank = get<uint32_t>();
      for (uint32_t d = 0; d < rank; ++d) info.t.dims.push_back(get<uint64_t>());
      info.t.type = get<uint32_t>();
      info.offset = get<uint64_t>();
      infos.push_back(std::move(info));
    }
    const size_t data = (at_ + alignment - 1) / alignment * alignment;
    for (Info& info : infos) {
      const auto [per_block, block_bytes] = ggml_block(info.t.type);
      const size_t n = size_t(info.t.numel() / per_block * block_bytes), from = data + info.offset;
      if (from + n > b_.size()) throw std::runtime_error(info.name + ": past the end of the file");
      info.t.bytes.assign(b_.begin() + std::ptrdiff_t(from), b_.begin() + std::ptrdiff_t(from + n));
      tensors[info.name] = std::move(info.t);
    }
  }

  std::map<std::string, GgufTensor> tensors;
  uint32_t u32(const std::string& key) const { return u32_.at(key); }

 private:
  template <class T>
  T get() {
    if (at_ + sizeof(T) > b_.size()) throw std::runtime_error("gguf_reader: truncated");
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (at_ + n > b_.size()) throw std::runtime_error("gguf_reader: truncated string");
    std::string s(b_.data() + at_, size_t(n));
    at_ += size_t(n);
    return s;
  }
  void skip(uint32_t type) {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // gguf value types 0..12
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t elem = get<uint32_t>();
      const uint64_t n = get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip(elem);
    } else if (type < 13) {
      at_ += sizes[type];
    } else {
      throw std::runtime_error("gguf_reader: value type " + std::to_string(type));
    }
  }
  std::vector<char> b_;
  size_t at_ = 0;
  std::map<std::string, uint32_t> u32_;
};

// ggml's dequantize_row_* for one tensor's bytes.
inline std::vector<float> dequantize(const GgufTensor& t) {
  const auto half = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return core::f16_to_f32(h);
  };
  const int64_t n = t.numel();
  std::vector<float> y(static_cast<size_t>(n));
  const uint8_t* b = t.bytes.data();
  float* out = y.data();
  switch (t.type) {
    case kF32: std::memcpy(out, b, size_t(n) * 4); break;
    case kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = half(b + 2 * i);
      break;
    case kQ8_0:
      for (int64_t k = 0; k < n; k += 32, b += 34, out += 32)
        for (int j = 0; j < 32; ++j) out[j] = half(b) * float(int8_t(b[2 + j]));
      break;
    case kQ4_0:
      for (int64_t k = 0; k < n; k += 32, b += 18, out += 32)
        for (int j = 0; j < 16; ++j) {
          out[j] = half(b) * float((b[2 + j] & 0xF) - 8);
          out[j + 16] = half(b) * float((b[2 + j] >> 4) - 8);
        }
      break;
    case kQ4_K:
    case kQ5_K: {
      const bool five = t.type == kQ5_K;
      const size_t block = five ? 176 : 144;
      for (int64_t k = 0; k < n; k += 256, b += block) {
        const float d = half(b), dmin = half(b + 2);
        const uint8_t* s = b + 4;
        const uint8_t* qh = b + 16;  // Q5_K only
        const uint8_t* q = b + (five ? 48 : 16);
        // 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
        const auto scale_min = [&](int j, int& sc, int& m) {
          if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
          } else {
            sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
            m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
          }
        };
        for (int j = 0, sub = 0; j < 256; j += 64, q += 32, sub += 2) {
          int sc1, m1, sc2, m2;
          scale_min(sub, sc1, m1);
          scale_min(sub + 1, sc2, m2);
          for (int l = 0; l < 32; ++l) {
            const int hi1 = five && (qh[l] >> sub & 1) ? 16 : 0;
            *out++ = d * float(sc1) * float((q[l] & 0xF) + hi1) - dmin * float(m1);
          }
          for (int l = 0; l < 32; ++l) {
            const int hi2 = five && (qh[l] >> (sub + 1) & 1) ? 16 : 0;
            *out++ = d * float(sc2) * float((q[l] >> 4) + hi2) - dmin * float(m2);
          }
        }
      }
      break;
    }
    case kQ6_K:
      for (int64_t k = 0; k < n; k += 256, b += 210) {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = half(b + 208);
        for (int h = 0; h < 256; h += 128, ql += 64, qh += 32, sc += 8, out += 128)
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
            const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            out[l] = d * float(sc[is]) * float(q1);
            out[l + 32] = d * float(sc[is + 2]) * float(q2);
            out[l + 64] = d * float(sc[is + 4]) * float(q3);
            out[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
      }
      break;
    default: throw std::runtime_error(std::string("gguf_reader: cannot dequantize ") + ggml_name(t.type));
  }
  return y;
}

}  // namespace brisk::export_test
