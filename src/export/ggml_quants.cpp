// ggml's weight formats (ggml_quants.h). The K-quants search each
// sub-block's scale (and, for Q4_K / Q5_K, its minimum) for the least
// weighted squared error, then quantize the sub-block scales themselves
// against one f16 scale per super-block and round every value again with
// the scales as stored: the same steps as ggml's reference quantizers, with
// the same float operations in the same order (products grouped as ggml
// groups them, and no fused multiply-adds: CMakeLists.txt compiles this file
// with -ffp-contract=off), so the bytes are ggml's
// (`GgmlQuants.BytesAreGgmlsOwn` compares them with llama.cpp's library).
#include "brisk/export/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "brisk/core/dtype.h"

namespace brisk::exporter::ggml {

namespace {

constexpr float kAllZero = 1e-15f;  // ggml's GROUP_MAX_EPS: a sub-block this small is stored as zeros

// Round to nearest, ties to even (what ggml's nearest_int does through the
// FPU's default rounding). Past int's range (an overflowed f16 scale, which
// quantize() then refuses) it saturates rather than convert out of range.
int nearest(float v) {
  if (!(std::fabs(v) < 1e9f)) return v > 0 ? 1000000000 : v < 0 ? -1000000000 : 0;  // NaN: 0
  return int(std::nearbyint(v));
}

void put_f16(uint8_t* at, float v) {
  const uint16_t h = core::f32_to_f16(v);
  std::memcpy(at, &h, 2);
}
float stored_f16(float v) { return core::f16_to_f32(core::f32_to_f16(v)); }

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    put_f16(out, d);
    for (int j = 0; j < 32; ++j) out[2 + j] = uint8_t(int8_t(std::lround(x[b + j] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 18) {
    float amax = 0, max = 0;  // the value of largest magnitude, with its sign
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b + j]) > amax) amax = std::fabs(x[b + j]), max = x[b + j];
    const float d = max / -8.f, id = d != 0 ? 1.f / d : 0.f;
    put_f16(out, d);
    const auto code = [&](float v) { return uint8_t(std::min(15, int(int8_t(v * id + 8.5f)))); };
    for (int j = 0; j < 16; ++j) out[2 + j] = uint8_t(code(x[b + j]) | code(x[b + j + 16]) << 4);
  }
}

// One Q4_K / Q5_K sub-block: codes L in [0, nmax] with x ~ scale L - min.
// Starts from the range (min clamped to <= 0), then tries nstep + 1 other
// code spacings, each with the least-squares scale and min for its codes
// (weights w), and keeps the one of least weighted squared error. Returns
// the scale; *neg_min receives -min (>= 0).
float fit_scale_and_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                        float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  lo = std::min(lo, 0.f);
  if (hi == lo) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -lo;
    return 0.f;
  }
  float iscale = float(nmax) / (hi - lo), scale = 1 / iscale, best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {  // the minimum is never above zero
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_min - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      std::copy(trial, trial + n, L);
      best = err;
      scale = this_scale;
      lo = this_min;
    }
  }
  *neg_min = -lo;
  return scale;
}

// Q4_K and Q5_K share their scales: 8 sub-blocks of 32, each a 6-bit scale
// and a 6-bit minimum, packed in 12 bytes (scale j and min j in the low 6
// bits of bytes j and j + 4 for j < 4; for j >= 4 their low nibbles in byte
// j + 4 and their top 2 bits in the top bits of bytes j - 4 and j).
void pack_scales_and_mins(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = ls[j];
    s[j + 4] = lm[j];
  }
  for (int j = 4; j < 8; ++j) {
    s[j + 4] = uint8_t((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
    s[j - 4] |= uint8_t((ls[j] >> 4) << 6);
    s[j] |= uint8_t((lm[j] >> 4) << 6);
  }
}

void unpack_scale_and_min(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// One Q4_K (nmax 15) or Q5_K (nmax 31) super-block: fills d, dmin, the
// packed scales and the codes L[256]. Returns nothing else: the caller packs
// the codes.
void quantize_scaled_min_block(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* d_dmin,
                               uint8_t* packed_scales, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* v = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += v[l] * v[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(v[l]);
    scales[j] = fit_scale_and_min(32, nmax, v, weights, L + 32 * j, &mins[j], rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = uint8_t(std::min(63, nearest(inv_scale * scales[j])));
    lm[j] = uint8_t(std::min(63, nearest(inv_min * mins[j])));
  }
  pack_scales_and_mins(ls, lm, packed_scales);
  put_f16(d_dmin, max_scale / 63.f);
  put_f16(d_dmin + 2, max_min / 63.f);
  // Round again with the scales as the file holds them.
  const float d = stored_f16(max_scale / 63.f), dmin = stored_f16(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    unpack_scale_and_min(j, packed_scales, sc, m);
    const float ds = d * float(sc);
    if (ds == 0) continue;
    const float dm = dmin * float(m);
    for (int i = 0; i < 32; ++i) L[32 * j + i] = uint8_t(std::clamp(nearest((x[32 * j + i] + dm) / ds), 0, nmax));
  }
}

void quantize_q4_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += kSuperBlock, out += 144) {
    uint8_t L[kSuperBlock];
    quantize_scaled_min_block(x + b, 15, -1.f, 0.1f, 20, out, out + 4, L);
    uint8_t* q = out + 16;  // 64 values per 32 bytes: the first 32 in the low nibbles
    for (int j = 0; j < kSuperBlock; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | L[j + l + 32] << 4);
  }
}

void quantize_q5_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += kSuperBlock, out += 176) {
    uint8_t L[kSuperBlock];
    quantize_scaled_min_block(x + b, 31, -0.5f, 0.1f, 15, out, out + 4, L);
    uint8_t* qh = out + 16;  // bit 2k (2k + 1) of qh[l]: the 5th bit of value 64k + l (64k + 32 + l)
    uint8_t* q = out + 48;
    std::memset(qh, 0, 32);
    uint8_t lo_bit = 1, hi_bit = 2;
    for (int j = 0; j < kSuperBlock; j += 64, q += 32, lo_bit <<= 2, hi_bit <<= 2)
      for (int l = 0; l < 32; ++l) {
        const int a = L[j + l], c = L[j + l + 32];
        if (a > 15) qh[l] |= lo_bit;
        if (c > 15) qh[l] |= hi_bit;
        q[l] = uint8_t((a & 0xF) | (c & 0xF) << 4);
      }
  }
}

// One Q6_K sub-block of 16: signed codes in [-nmax, nmax - 1] (stored with
// +nmax) and a signed scale, trying 19 spacings around the one that maps the
// value of largest magnitude to -nmax and keeping the one of least squared
// error weighted by x^2.
float fit_signed_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < kAllZero) {
    std::fill(L, L + n, int8_t(0));
    return 0.f;
  }
  const auto sums = [&](float iscale, float& sum_lx, float& sum_l2) {
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * float(l);
      sum_l2 += w * float(l) * float(l);
    }
  };
  const auto set_codes = [&](float iscale) {
    for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1));
  };
  float iscale = -float(nmax) / max, sum_lx = 0, sum_l2 = 0;
  sums(iscale, sum_lx, sum_l2);
  set_codes(iscale);
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.f, best = scale * sum_lx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sums(iscale, sum_lx, sum_l2);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      set_codes(iscale);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

void quantize_q6_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += kSuperBlock, out += 210, x += kSuperBlock) {
    int8_t L[kSuperBlock];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_signed_scale(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) max_abs = std::fabs(scales[j]), max_scale = scales[j];
    }
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
    if (max_abs < kAllZero) {
      std::memset(out, 0, 210);
      continue;
    }
    const float iscale = -128.f / max_scale;
    put_f16(out + 208, 1 / iscale);
    const float d = stored_f16(1 / iscale);
    for (int j = 0; j < 16; ++j) sc[j] = int8_t(std::min(127, nearest(iscale * scales[j])));
    for (int j = 0; j < 16; ++j) {
      const float ds = d * float(sc[j]);
      if (ds == 0) continue;
      for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(32 + std::clamp(nearest(x[16 * j + i] / ds), -32, 31));
    }
    // Per 128 values: the low nibbles of values l and l + 64 share ql[l], of
    // l + 32 and l + 96 share ql[l + 32]; the top 2 bits of values l, l + 32,
    // l + 64 and l + 96 sit in qh[l], in that order from bit 0.
    for (int j = 0; j < kSuperBlock; j += 128, ql += 64, qh += 32)
      for (int l = 0; l < 32; ++l) {
        const auto code = [&](int k) { return uint8_t(L[j + l + k]); };
        ql[l] = uint8_t((code(0) & 0xF) | (code(64) & 0xF) << 4);
        ql[l + 32] = uint8_t((code(32) & 0xF) | (code(96) & 0xF) << 4);
        qh[l] = uint8_t(code(0) >> 4 | (code(32) >> 4) << 2 | (code(64) >> 4) << 4 | (code(96) >> 4) << 6);
      }
  }
}

}  // namespace

const char* type_name(Type t) {
  switch (t) {
    case Type::f32: return "f32";
    case Type::f16: return "f16";
    case Type::q4_0: return "q4_0";
    case Type::q8_0: return "q8_0";
    case Type::q4_K: return "q4_K";
    case Type::q5_K: return "q5_K";
    case Type::q6_K: return "q6_K";
  }
  return "?";
}

int64_t block_length(Type t) {
  switch (t) {
    case Type::f32: case Type::f16: return 1;
    case Type::q4_0: case Type::q8_0: return 32;
    case Type::q4_K: case Type::q5_K: case Type::q6_K: return kSuperBlock;
  }
  return 1;
}

size_t block_bytes(Type t) {
  switch (t) {
    case Type::f32: return 4;
    case Type::f16: return 2;
    case Type::q4_0: return 18;
    case Type::q8_0: return 34;
    case Type::q4_K: return 144;
    case Type::q5_K: return 176;
    case Type::q6_K: return 210;
  }
  return 0;
}

size_t row_bytes(Type t, int64_t n) { return size_t(n / block_length(t)) * block_bytes(t); }

namespace {

// The bytes of n values in `t`, unchecked.
void write_values(Type t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case Type::f32: std::memcpy(out, x, size_t(n) * sizeof(float)); return;
    case Type::f16:
      for (int64_t i = 0; i < n; ++i) put_f16(out + 2 * i, x[i]);
      return;
    case Type::q8_0: quantize_q8_0(x, n, out); return;
    case Type::q4_0: quantize_q4_0(x, n, out); return;
    case Type::q4_K: quantize_q4_K(x, n, out); return;
    case Type::q5_K: quantize_q5_K(x, n, out); return;
    case Type::q6_K: quantize_q6_K(x, n, out); return;
  }
}

bool f16_finite(const uint8_t* at) {
  uint16_t h;
  std::memcpy(&h, at, 2);
  return (h & 0x7C00) != 0x7C00;  // exponent all ones: an infinity or NaN
}

// Every f16 a row of `t` stores (its values, or its blocks' scales) is
// finite; one that is not came from values too large for the format.
void require_finite_f16(Type t, const float* x, int64_t n, const uint8_t* out) {
  bool ok = true;
  const int64_t blocks = n / block_length(t);
  const size_t size = block_bytes(t);
  for (int64_t b = 0; b < blocks && ok; ++b) {
    const uint8_t* at = out + size_t(b) * size;
    switch (t) {
      case Type::f32: break;
      case Type::f16: case Type::q8_0: case Type::q4_0: ok = f16_finite(at); break;
      case Type::q4_K: case Type::q5_K: ok = f16_finite(at) && f16_finite(at + 2); break;
      case Type::q6_K: ok = f16_finite(at + 208); break;
    }
  }
  if (ok) return;
  float largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(x[i]));
  throw std::range_error(std::string(type_name(t)) + " cannot hold a value of " + std::to_string(largest) +
                         ": its f16 " + (t == Type::f16 ? "values end" : "scales end") + " at 65504");
}

}  // namespace

void quantize(Type t, const float* x, int64_t n, uint8_t* out) {
  if (n % block_length(t) != 0)
    throw std::invalid_argument(std::string("ggml::quantize: ") + std::to_string(n) + " values are not whole " +
                                type_name(t) + " blocks");
  write_values(t, x, n, out);
  require_finite_f16(t, x, n, out);
}

}  // namespace brisk::exporter::ggml
