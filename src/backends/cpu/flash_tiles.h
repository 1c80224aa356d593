// Flash attention of one head (online softmax forward, FlashAttention-2
// backward) on the AVX2 + FMA register tiles of attention_tiles.h, for the
// f32 kernels of flash_attention.cpp (causal) and masked_flash_attention.cpp
// (bidirectional over a right-padded batch).
//
// The same tiles as the plain kernels, without the (T, T) probabilities:
// queries go in blocks of kTileQ rows and keys in tiles of kTileK, and a
// block's scores against a key tile live only in per-thread scratch. Each
// head's keys and values are copied once into the dense layouts the tiles
// read (K and, backward, V transposed into panels; V, backward K, as dense
// rows), which costs O(T * hd) scratch per thread, the size of the head's
// inputs. The backward recomputes P = exp(S - lse) per tile and takes
// D = rowsum(dY * Y) in place of rowsum(P * dP), so it runs five products to
// the plain backward's four; what it saves is writing and reading the
// probabilities (32 MiB per layer at the e-mail classifier's batch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention_tiles.h"
#include "dropout_factors.h"

namespace brisk::cpu::flash_tiles {

// Query rows per block and keys per tile. kTileQ divides kTileK, so under a
// causal mask a key tile never starts after its query block's first row:
// every row of every visited tile sees at least one key.
constexpr int64_t kTileQ = 64, kTileK = 256;

// The keys query row t sees: [0, min(t + 1, L)) under a causal mask,
// [0, L) otherwise (L = the sequence's valid length, T when unpadded).
struct KeyRange {
  int64_t L;
  bool causal;
  int64_t end(int64_t t) const { return causal ? std::min(t + 1, L) : L; }
};

// A thread's scratch for one head of up to T rows, hd wide; with
// probability dropout a tile of its factors (z) last, null otherwise.
struct Work {
  float *kt, *vt, *krows, *vrows, *qb, *dyb, *s, *ds, *stats, *transposed, *z = nullptr;
  static size_t floats(int64_t T, int64_t hd, bool dropout) {
    return size_t(2 * attention_tiles::packed_floats(T, hd) + 2 * T * hd + 2 * kTileQ * hd + 2 * kTileQ * kTileK +
                  2 * kTileQ + attention_tiles::kKeyChunk * kTileQ + (dropout ? kTileQ * kTileK : 0));
  }
  Work(float* w, int64_t T, int64_t hd, bool dropout)
      : kt(w), vt(kt + attention_tiles::packed_floats(T, hd)), krows(vt + attention_tiles::packed_floats(T, hd)),
        vrows(krows + T * hd), qb(vrows + T * hd), dyb(qb + kTileQ * hd), s(dyb + kTileQ * hd),
        ds(s + kTileQ * kTileK), stats(ds + kTileQ * kTileK), transposed(stats + 2 * kTileQ) {
    if (dropout) z = transposed + attention_tiles::kKeyChunk * kTileQ;
  }
};

// One head. q, k, v: T rows of hd floats `ld` apart; y: rows `ldy` apart;
// lse: T floats. `drop`: the head's probability dropout (factors in w.z).
void forward_head(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* lse,
                  int64_t T, KeyRange keys, int64_t hd, float scale, const Work& w, const HeadDropout& drop);

// One head of the backward: inputs as forward_head's plus dy and y (rows
// `ldg` apart) and lse; dq, dk, dv rows `ldd` apart. dK and dV rows of keys
// no query sees (padding) are zero.
void backward_head(const float* q, const float* k, const float* v, int64_t ld, const float* dy, const float* y,
                   int64_t ldg, const float* lse, float* dq, float* dk, float* dv, int64_t ldd, int64_t T,
                   KeyRange keys, int64_t hd, float scale, const Work& w, const HeadDropout& drop);

}  // namespace brisk::cpu::flash_tiles
