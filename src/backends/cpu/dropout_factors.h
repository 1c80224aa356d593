// Dropout's keep factors on the CPU, shared by the dropout op's kernels
// (dropout.cpp) and the attention kernels' probability dropout: for a run
// of consecutive element indices, 1 / (1 - p) where brisk/ops/dropout.h's
// hash keeps the element and 0 where it drops it. The hash is 32-bit
// multiplies, shifts and xors in a loop the compiler vectorises (vpmulld),
// and an element's factor depends only on (key, site, index), never on the
// thread or the tile that makes it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "brisk/core/op.h"
#include "brisk/ops/dropout.h"

namespace brisk::cpu {

// One dropout's mask: its key words, its site and p's threshold and scale.
struct DropoutMask {
  uint32_t k0 = 0, k1 = 0, site = 0, threshold = 0;
  float scale = 1.f;

  DropoutMask() = default;
  DropoutMask(const int32_t* key, float p, uint32_t site_)
      : k0(uint32_t(key[0])), k1(uint32_t(key[1])), site(site_), threshold(ops::dropout_threshold(p)),
        scale(float(1.0 / (1.0 - double(p)))) {}

  // f[k] = the factor of element index + k, for k in [0, n), in stretches
  // that share the index's high 32 bits (one hash stream each).
  void factors(int64_t index, int64_t n, float* f) const {
    for (int64_t done = 0; done < n;) {
      const int64_t i = index + done;
      const uint64_t high = uint64_t(i) >> 32;
      const int64_t len = std::min<int64_t>(n - done, int64_t((high + 1) << 32) - i);
      const ops::DropoutStream s = ops::dropout_stream(k0, k1, site, uint32_t(high));
      const uint32_t base = uint32_t(i), t = threshold;
      const float keep = scale;
      float* out = f + done;
#pragma omp simd
      for (int64_t k = 0; k < len; ++k) out[k] = ops::dropout_bits(s, base + uint32_t(k)) >= t ? keep : 0.f;
      done += len;
    }
  }
};

// The probability dropout of one attention call (core::AttentionParams):
// probability (b, h, t, u) of the (B, n_head, T, T) matrix has element index
// ((b * n_head + h) * T + t) * T + u, whichever kernel (plain or flash,
// causal or padding-masked) and whichever tile computes it, so all of them
// drop the same entries. Off (on() false) when the op's dropout is 0.
class ProbDropout {
 public:
  ProbDropout() = default;
  // The key is the op's last input, read only when dropout > 0.
  ProbDropout(const core::KernelCall& c, int64_t T) : T_(T) {
    const auto& p = c.p<core::AttentionParams>();
    if (p.dropout > 0.f) mask_ = DropoutMask(c.inputs.back().as<int32_t>(), p.dropout, p.dropout_site), on_ = true;
  }
  bool on() const { return on_; }

  // The factors of head bh's (= b * n_head + h) rows [i0, i0 + rows), keys
  // [j0, j0 + w), into a (rows, w) tile.
  void tile(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t w, float* z) const {
    for (int64_t r = 0; r < rows; ++r) mask_.factors((bh * T_ + i0 + r) * T_ + j0, w, z + r * w);
  }

 private:
  DropoutMask mask_;
  int64_t T_ = 0;
  bool on_ = false;
};

// x[r * ldx + j] *= z[r * w + j] over a (rows, w) block.
inline void multiply_rows(float* x, int64_t ldx, const float* z, int64_t rows, int64_t w) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict xr = x + r * ldx;
    const float* __restrict zr = z + r * w;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) xr[j] *= zr[j];
  }
}

// dst[r * w + j] = x[r * ldx + j] * z[r * w + j]: a dropped copy.
inline void times_rows(const float* x, int64_t ldx, const float* z, int64_t rows, int64_t w, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ldx;
    const float* __restrict zr = z + r * w;
    float* __restrict dr = dst + r * w;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) dr[j] = xr[j] * zr[j];
  }
}

// One head's share of a call's ProbDropout, with the scratch its kernel
// uses: z for a block's factors, pz (the plain kernels) for a dropped copy
// of a block of probabilities, `pz_at` floats past z. Off (on() false) when
// the call's is; the scratch is then not touched (it may not exist).
struct HeadDropout {
  const ProbDropout* drop = nullptr;
  int64_t bh = 0;
  float *z = nullptr, *pz = nullptr;

  HeadDropout() = default;
  HeadDropout(const ProbDropout& d, int64_t bh_, float* scratch, int64_t pz_at = 0) : bh(bh_) {
    if (!d.on()) return;
    drop = &d, z = scratch;
    if (pz_at > 0) pz = scratch + pz_at;
  }
  bool on() const { return drop != nullptr; }
  // z = the factors of rows [i0, i0 + rows), keys [j0, j0 + w), rows w apart.
  const float* factors(int64_t i0, int64_t rows, int64_t j0, int64_t w) const {
    drop->tile(bh, i0, rows, j0, w, z);
    return z;
  }
  // The plain kernels' block of probabilities P (query rows [i0, i0 +
  // rows), keys [0, w), rows `ld` apart) as P V reads it: P itself when off,
  // its dropped copy P Z in pz (rows w apart, `ld` set to w) when on.
  const float* dropped(const float* P, int64_t& ld, int64_t i0, int64_t rows, int64_t w) const {
    if (!on()) return P;
    times_rows(P, ld, factors(i0, rows, 0, w), rows, w, pz);
    ld = w;
    return pz;
  }
};

}  // namespace brisk::cpu
