// CPU kernel of linear_packed (src/ops/linear_packed.cpp; the layout is in
// brisk/ops/packed_linear.h): the inference engine's fp32 Linear.
//
// The weight comes in panels of 16 outputs x K, so the product is the
// register-tiled form GEMM libraries use: at each k, the panel's 16 weights
// are two 8-float vectors, each activation row's x[k] is broadcast, and a
// tile of rows x panels keeps its sums in registers for the whole of K. No
// horizontal sums, and each panel is one sequential stream from memory:
// batch 1 runs at memory speed, a batch of 16 rows at the FMA units' speed.
//
// Tiles (accumulator registers <= 12 of AVX2's 16):
//   1 row x 4 panels, 2 rows x 2 panels, 3-6 rows x 1 panel;
// on AVX-512 (24 of 32): 1-6 rows x 4 panels, and over many panels (the LM
// head) 16 or 8 rows x 1 panel (the wide tiles below).
// Every output is bias + x[0] w[0] + x[1] w[1] + ... in the order of k, one
// FMA chain whatever the tile, so a row's result does not depend on how many
// rows share the call: the same prompt decodes the same alone or in a batch.
//
// Threads split the panels. Rows go in blocks of kRowBlock so a block's
// activations stay in cache while a thread's panels stream past them
// (prefill runs hundreds of rows through the same kernel).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/packed_linear.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using ops::packed::kPanel;
using PackedPath = CpuFeatures::PackedPath;

constexpr int64_t kRowBlock = 48;
constexpr int64_t kPanelBlock = 4;  // panels a row group runs over before the next row group
constexpr int64_t kWidePanels = 64;  // a thread's panels from which the AVX-512 wide tiles pay

struct Packed {
  const float *x, *w, *bias;
  float* y;
  int64_t rows, n, k;
};

// One panel's 16 floats as vector registers: two 8-float ymm (AVX2) or one
// 16-float zmm (AVX-512). The tiles (linear_packed_tiles.inc) are written
// once over these.
struct Avx2 {
  using V = __m256;
  static constexpr int kVecs = 2, kWidth = 8;
  // Panels per tile for 1..6 rows: accumulators rows x panels x 2 <= 12 of 16 registers.
  static constexpr int kPanels[6] = {4, 2, 1, 1, 1, 1};
  __attribute__((target("avx2"), always_inline)) static __m256i mask(int64_t count) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(count, 0, 8))), idx);
  }
  __attribute__((target("avx2,fma"), always_inline)) static V zero() { return _mm256_setzero_ps(); }
  __attribute__((target("avx2,fma"), always_inline)) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2,fma"), always_inline)) static V load_first(const float* p, int64_t count) {
    return _mm256_maskload_ps(p, mask(count));
  }
  __attribute__((target("avx2,fma"), always_inline)) static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  __attribute__((target("avx2,fma"), always_inline)) static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  __attribute__((target("avx2,fma"), always_inline)) static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  __attribute__((target("avx2,fma"), always_inline)) static void store_first(float* p, V v, int64_t count) {
    _mm256_maskstore_ps(p, mask(count), v);
  }
};

struct Avx512 {
  using V = __m512;
  static constexpr int kVecs = 1, kWidth = 16;
  // Panels per tile for 1..6 rows: accumulators rows x panels <= 24 of 32 registers.
  static constexpr int kPanels[6] = {4, 4, 4, 4, 4, 4};
  __attribute__((target("avx512f"), always_inline)) static __mmask16 mask(int64_t count) {
    return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
  }
  __attribute__((target("avx512f"), always_inline)) static V zero() { return _mm512_setzero_ps(); }
  __attribute__((target("avx512f"), always_inline)) static V load(const float* p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"), always_inline)) static V load_first(const float* p, int64_t count) {
    return _mm512_maskz_loadu_ps(mask(count), p);
  }
  __attribute__((target("avx512f"), always_inline)) static V broadcast(const float* p) { return _mm512_set1_ps(*p); }
  __attribute__((target("avx512f"), always_inline)) static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  __attribute__((target("avx512f"), always_inline)) static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  __attribute__((target("avx512f"), always_inline)) static void store_first(float* p, V v, int64_t count) {
    _mm512_mask_storeu_ps(p, mask(count), v);
  }
};

namespace avx2 {
using S = Avx2;
#define BRISK_PACKED_TARGET __attribute__((target("avx2,fma")))
#include "linear_packed_tiles.inc"
#undef BRISK_PACKED_TARGET
}  // namespace avx2

namespace avx512 {
using S = Avx512;
#define BRISK_PACKED_TARGET __attribute__((target("avx512f")))
#include "linear_packed_tiles.inc"
#undef BRISK_PACKED_TARGET
}  // namespace avx512

// AVX-512, 16 (or 8) rows at once: a batch-16 decode step's LM head.
// Six-row groups walk each block of weights three times (6 + 6 + 4 rows),
// and only the first walk overlaps its FMAs with the stream from memory; one
// 16-row walk keeps the memory stream and all of the arithmetic together (the
// 16-row W1 head went from 1.48 to 0.95 ms, bench_decode). The rows' activations are
// first transposed into xt (k-major, 16 per k), so one pointer serves all 16
// broadcasts; the sums are the same chain in the same order as the other
// tiles, so a row's result still does not depend on its neighbours.
namespace avx512 {
template <int kWideRows>
__attribute__((target("avx512f"))) void transpose_rows(const Packed& a, int64_t r, float* xt) {
  for (int64_t t = 0; t < a.k; ++t)
    for (int i = 0; i < kWideRows; ++i) xt[t * kWideRows + i] = a.x[(r + i) * a.k + t];
}

// Rows [r, r + kWideRows) x panel p, activations from xt.
template <int kWideRows>
__attribute__((target("avx512f"))) void wide_tile(const Packed& a, const float* xt, int64_t r, int64_t p) {
  const int64_t k = a.k, o = p * kPanel;
  const float* w = a.w + p * k * kPanel;
  const __m512 b = a.bias ? Avx512::load_first(a.bias + o, a.n - o) : _mm512_setzero_ps();
  __m512 acc[kWideRows];
#pragma GCC unroll 16
  for (int i = 0; i < kWideRows; ++i) acc[i] = b;
  for (int64_t t = 0; t < k; ++t) {
    const __m512 wv = _mm512_loadu_ps(w + t * kPanel);
    _mm_prefetch(reinterpret_cast<const char*>(w + (kPanelBlock * k + t) * kPanel), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int i = 0; i < kWideRows; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(xt[t * kWideRows + i]), wv, acc[i]);
  }
  if (o + kPanel <= a.n) {
#pragma GCC unroll 16
    for (int i = 0; i < kWideRows; ++i) _mm512_storeu_ps(a.y + (r + i) * a.n + o, acc[i]);
  } else {
    for (int i = 0; i < kWideRows; ++i) Avx512::store_first(a.y + (r + i) * a.n + o, acc[i], a.n - o);
  }
}
}  // namespace avx512

// Without AVX2 (or under BRISK_FEW_ROWS=portable): the same sums in the same order, one output at a time.
void panels_portable(const Packed& a, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < kPanel && p * kPanel + j < a.n; ++j) {
        const int64_t o = p * kPanel + j;
        const float* w = a.w + p * a.k * kPanel + j;
        const float* x = a.x + r * a.k;
        float s = a.bias ? a.bias[o] : 0.f;
        for (int64_t t = 0; t < a.k; ++t) s = std::fma(x[t], w[t * kPanel], s);
        a.y[r * a.n + o] = s;
      }
}

void linear_packed_f32(const KernelCall& c) {
  Packed a;
  a.n = c.p<core::PackedLinearParams>().out, a.k = c.in(0).shape().last();
  a.rows = c.in(0).shape().rows();
  a.x = c.in(0).as<float>(), a.w = c.in(1).as<float>();
  a.bias = c.inputs.size() == 3 ? c.in(2).as<float>() : nullptr;
  a.y = c.out(0).as<float>();
  if (a.rows == 0) return;
  const PackedPath path = cpu_features().packed;
  const int64_t panels = ops::packed::panels(a.n);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(a.k * std::min(a.rows, kRowBlock) * kPanel, 1));
  parallel_for(panels, grain, [&](int64_t p0, int64_t p1) {
    // One thread's transposed activations for the 16-row tiles (kRowBlock
    // rows): allocated once per thread, reused by every later call.
    thread_local std::vector<float> xt;
    for (int64_t rb = 0; rb < a.rows; rb += kRowBlock) {
      const int64_t rb1 = std::min(a.rows, rb + kRowBlock);
      if (path == PackedPath::portable) {
        panels_portable(a, rb, rb1, p0, p1);
        continue;
      }
      // AVX-512: whole groups of 16 rows, then one of 8, through the wide
      // tiles; the rest (under 8 rows) as below. Only over many panels: the
      // scalar transpose costs about 2 / panels of the products, and the
      // layers' small Linears measured no faster through the wide tiles.
      const bool wide_path = path == PackedPath::avx512 && p1 - p0 >= kWidePanels;
      const int64_t wide = wide_path ? (rb1 - rb) / 16 : 0;
      const bool eight = wide_path && (rb1 - rb) % 16 >= 8;
      if (wide > 0 || eight) {
        xt.resize(size_t(kRowBlock * a.k));
        for (int64_t g = 0; g < wide; ++g) avx512::transpose_rows<16>(a, rb + g * 16, xt.data() + g * 16 * a.k);
        if (eight) avx512::transpose_rows<8>(a, rb + wide * 16, xt.data() + wide * 16 * a.k);
        for (int64_t p = p0; p < p1; ++p) {
          for (int64_t g = 0; g < wide; ++g) avx512::wide_tile<16>(a, xt.data() + g * 16 * a.k, rb + g * 16, p);
          if (eight) avx512::wide_tile<8>(a, xt.data() + wide * 16 * a.k, rb + wide * 16, p);
        }
      }
      const int64_t rest = rb + wide * 16 + (eight ? 8 : 0);
      for (int64_t pb = p0; pb < p1 && rest < rb1; pb += kPanelBlock) {
        const int64_t pb1 = std::min(p1, pb + kPanelBlock);
        for (int64_t r = rest; r < rb1; r += 6) {
          const int rows = int(std::min<int64_t>(6, rb1 - r));
          if (path == PackedPath::avx512) avx512::row_group(a, r, rows, pb, pb1);
          else avx2::row_group(a, r, rows, pb, pb1);
        }
      }
    }
  });
}

}  // namespace

void register_linear_packed_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::linear_packed, core::DType::f32, linear_packed_f32);
}

}  // namespace brisk::cpu
