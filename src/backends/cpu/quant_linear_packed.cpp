// CPU kernels of linear_q8_packed and linear_q4_packed
// (src/ops/quant_linear_packed.cpp; the layouts in
// brisk/ops/packed_linear.h). linear_q8_packed first, linear_q4_packed below.
//
// avx512_vnni: tiles of NP panels (16 outputs each) x NR activation rows,
// one 512-bit int32 accumulator per (panel, row). Per group of 4 k: one
// 64-byte load per panel (w + 128, the unsigned operand) and one broadcast
// of a row's 4 activation codes (signed) per row feed NP x NR vpdpbusd; no
// horizontal sum anywhere. NP x NR <= 16 accumulators, and at least 8 where
// there are few rows, so that vpdpbusd's latency is covered. A block's
// panels stay in L1 while each group of rows passes over them. The result,
// float(sum - 128 * sum(codes)) * (sx * sw) + b as one FMA, is what
// linear_q8's AVX-512 kernel computes from the same exact int32 sum: the
// two give the same bits.
//
// Elsewhere a scalar loop over the same layout: the engine packs int8
// weights only where the CPU has avx512_vnni, and the harness runs both.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "intrinsics_warnings.h"  // before the headers that hold intrinsics
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
namespace packed = ops::packed;

constexpr int64_t kPanelBytes = packed::kPanel * packed::kQ8Group;  // 64: one group of one panel

struct Call {
  const int8_t* codes;  // activation codes, rows `stride` bytes apart, zero from K to the row's end
  int64_t stride;
  const float* xscale;  // per row
  const int32_t* xsum;  // per row: the sum of its codes (the +128 of the weights comes off as 128 * it)
  const uint8_t* wp;
  const float *wscale, *bias;
  float* y;
  int64_t rows, n, panels, groups;
};

// Rows in tiles of 8, then the rest as one tile: tile_rows(NR as an
// integral_constant, first row) for each (a tile's row count is a template
// argument of the kernels).
template <class TileRows>
void for_row_tiles(int64_t rows, TileRows&& tile_rows) {
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) tile_rows(std::integral_constant<int, 8>{}, r0);
  switch (rows - r0) {
    case 7: tile_rows(std::integral_constant<int, 7>{}, r0); break;
    case 6: tile_rows(std::integral_constant<int, 6>{}, r0); break;
    case 5: tile_rows(std::integral_constant<int, 5>{}, r0); break;
    case 4: tile_rows(std::integral_constant<int, 4>{}, r0); break;
    case 3: tile_rows(std::integral_constant<int, 3>{}, r0); break;
    case 2: tile_rows(std::integral_constant<int, 2>{}, r0); break;
    case 1: tile_rows(std::integral_constant<int, 1>{}, r0); break;
    default: break;
  }
}

// Panels in blocks of 8 (a tile's most) split over the threads, each block
// run whole before the next, so that its panels stay in L1 across the row
// tiles; enough work per thread to wake the team. block(first panel, end).
template <class Block>
void for_panel_blocks(int64_t panels, int64_t k, int64_t rows, Block&& block) {
  constexpr int64_t kBlock = 8;
  const int64_t blocks = (panels + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(kBlock * packed::kPanel * k * rows, 1));
  parallel_for(blocks, grain, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) block(blk * kBlock, std::min(panels, blk * kBlock + kBlock));
  });
}

// Rows r0 .. r0 + NR against panels p0 .. p0 + NP, of which the first `np`
// exist (the others repeat the last one and are not stored).
template <int NP, int NR>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void tile_avx512(const Call& c, int64_t p0, int np,
                                                                                  int64_t r0) {
  const uint8_t* w[NP];
  for (int i = 0; i < NP; ++i) w[i] = c.wp + (p0 + std::min(i, np - 1)) * c.groups * kPanelBytes;
  const int8_t* x = c.codes + r0 * c.stride;
  __m512i acc[NP][NR];
#pragma GCC unroll 16
  for (int i = 0; i < NP; ++i)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_si512();
  for (int64_t g = 0; g < c.groups; ++g) {
    __m512i wv[NP];
#pragma GCC unroll 8
    for (int i = 0; i < NP; ++i) {
      wv[i] = _mm512_loadu_si512(w[i] + g * kPanelBytes);
      _mm_prefetch(reinterpret_cast<const char*>(w[i] + (g + NP * c.groups) * kPanelBytes), _MM_HINT_T0);  // the next tile's panel
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      int32_t four;
      std::memcpy(&four, x + r * c.stride + g * packed::kQ8Group, sizeof(four));
      const __m512i xb = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int i = 0; i < NP; ++i) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], wv[i], xb);
    }
  }
  for (int i = 0; i < np; ++i) {
    const int64_t o0 = (p0 + i) * packed::kPanel;
    const int no = int(std::min<int64_t>(packed::kPanel, c.n - o0));
    const __mmask16 m = __mmask16((1u << no) - 1);
    const __m512 sw = _mm512_maskz_loadu_ps(m, c.wscale + o0);
    const __m512 b = c.bias ? _mm512_maskz_loadu_ps(m, c.bias + o0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 dots = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][r], _mm512_set1_epi32(128 * c.xsum[r0 + r])));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(c.xscale[r0 + r]), sw);
      _mm512_mask_storeu_ps(c.y + (r0 + r) * c.n + o0, m, _mm512_fmadd_ps(dots, s, b));
    }
  }
}

// Panels per tile for NR rows: 16 accumulators at most, 8 or more where the
// rows are few.
template <int NR>
constexpr int kTilePanels = NR == 1 ? 8 : NR <= 4 ? 4 : 2;

// Panels p0 .. p1 against every row.
void panels_avx512(const Call& c, int64_t p0, int64_t p1) {
  for_row_tiles(c.rows, [&](auto nr, int64_t r0) {
    constexpr int NR = decltype(nr)::value, NP = kTilePanels<NR>;
    for (int64_t p = p0; p < p1; p += NP) tile_avx512<NP, NR>(c, p, int(std::min<int64_t>(NP, p1 - p)), r0);
  });
}

void panels_scalar(const Call& c, int64_t k, int64_t p0, int64_t p1) {
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t o = p0 * packed::kPanel; o < std::min(c.n, p1 * packed::kPanel); ++o) {
      int32_t sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += int32_t(c.codes[r * c.stride + i]) * packed::q8_weight(c.wp, k, o, i);
      c.y[r * c.n + o] = float(sum) * (c.xscale[r] * c.wscale[o]) + (c.bias ? c.bias[o] : 0.f);
    }
}

void linear_q8_packed_f32(const KernelCall& c) {
  const int64_t k = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  const int64_t n = c.p<core::PackedLinearParams>().out;
  const int64_t stride = (k + 63) / 64 * 64;  // >= the groups' 4 * ceil(K/4) bytes
  auto* codes = static_cast<int8_t*>(c.workspace);
  auto* xscale = reinterpret_cast<float*>(codes + rows * stride);
  auto* xsum = reinterpret_cast<int32_t*>(xscale + rows);
  const float* x = c.in(0).as<float>();
  parallel_for(rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int8_t* q = codes + r * stride;
      xscale[r] = ops::quant::quantize_int8(x + r * k, k, q);
      std::memset(q + k, 0, size_t(stride - k));  // the last group's padding meets zeros
      int32_t s = 0;
      for (int64_t i = 0; i < k; ++i) s += q[i];
      xsum[r] = s;
    }
  });
  const Call call{codes,
                  stride,
                  xscale,
                  xsum,
                  c.in(1).as<uint8_t>(),
                  c.in(2).as<float>(),
                  c.inputs.size() == 4 ? c.in(3).as<float>() : nullptr,
                  c.out(0).as<float>(),
                  rows,
                  n,
                  packed::panels(n),
                  packed::q8_groups(k)};
  const bool vnni = cpu_features().int8 == Int8Dot::avx512_vnni;
  for_panel_blocks(call.panels, k, rows, [&](int64_t p0, int64_t p1) {
    if (vnni) panels_avx512(call, p0, p1);
    else panels_scalar(call, k, p0, p1);
  });
}

// ---- linear_q4_packed ---------------------------------------------------------------
// The same tiles over 4-bit codes: per group of 32 k, four 64-byte loads per
// panel, each an AND (low nibbles) and a shift + AND (high) into two
// vpdpbusd operands against a row's next two broadcast code quads, into an
// int32 accumulator per (panel, row); at the group's end it loses the codes'
// + 8 (8 x the group's code sum), becomes float and is added to the
// (panel, row)'s float sum times sx[row][group] x the panel's 16 scales.
// Each output is bias + the groups in order, whatever the tile: a row's
// result is the same bits alone or in a batch. Int and float accumulators
// both live in registers, so a tile holds at most 8 (panel, row) pairs.

struct Q4Call {
  const int8_t* codes;  // activation codes, K bytes per row
  const float* xscale;  // rows x groups
  const int32_t* xsum;  // rows x groups
  const uint8_t* wp;
  const float *sp, *bias;
  float* y;
  int64_t rows, k, n, panels, groups;
};

// 4 activation codes, broadcast to every lane. A function of its own with
// the target: a lambda in the kernel would not inherit the kernel's target
// and fails to build where the compiler's baseline lacks AVX-512.
__attribute__((target("avx512f"))) inline __m512i broadcast4(const int8_t* at) {
  int32_t four;
  std::memcpy(&four, at, sizeof(four));
  return _mm512_set1_epi32(four);
}

template <int NP, int NR>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void tile_q4_avx512(const Q4Call& c, int64_t p0, int np,
                                                                                     int64_t r0) {
  const uint8_t* w[NP];
  const float* s[NP];
  for (int i = 0; i < NP; ++i) {
    const int64_t p = p0 + std::min(i, np - 1);
    w[i] = c.wp + p * c.groups * packed::kQ4GroupBytes;
    s[i] = c.sp + p * c.groups * packed::kPanel;
  }
  const int8_t* x = c.codes + r0 * c.k;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[NP][NR];
#pragma GCC unroll 8
  for (int i = 0; i < NP; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < c.groups; ++g) {
    __m512i dot[NP][NR];
#pragma GCC unroll 8
    for (int i = 0; i < NP; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) dot[i][r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t)
#pragma GCC unroll 8
      for (int i = 0; i < NP; ++i) {
        const uint8_t* line = w[i] + g * packed::kQ4GroupBytes + t * 64;
        const __m512i v = _mm512_loadu_si512(line);
        _mm_prefetch(reinterpret_cast<const char*>(line + NP * c.groups * packed::kQ4GroupBytes), _MM_HINT_T0);  // the next tile's panel
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) {
          dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], lo, broadcast4(x + r * c.k + g * 32 + t * 8));
          dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], hi, broadcast4(x + r * c.k + g * 32 + t * 8 + 4));
        }
      }
#pragma GCC unroll 8
    for (int i = 0; i < NP; ++i) {
      const __m512 sw = _mm512_loadu_ps(s[i] + g * packed::kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const int64_t rg = (r0 + r) * c.groups + g;
        const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[i][r], _mm512_set1_epi32(8 * c.xsum[rg])));
        acc[i][r] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_set1_ps(c.xscale[rg]), sw), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < np; ++i) {
    const int64_t o0 = (p0 + i) * packed::kPanel;
    const int no = int(std::min<int64_t>(packed::kPanel, c.n - o0));
    const __mmask16 m = __mmask16((1u << no) - 1);
    const __m512 b = c.bias ? _mm512_maskz_loadu_ps(m, c.bias + o0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) _mm512_mask_storeu_ps(c.y + (r0 + r) * c.n + o0, m, _mm512_add_ps(b, acc[i][r]));
  }
}

template <int NR>
constexpr int kQ4TilePanels = NR == 1 ? 8 : NR == 2 ? 4 : NR <= 4 ? 2 : 1;

void q4_panels_avx512(const Q4Call& c, int64_t p0, int64_t p1) {
  for_row_tiles(c.rows, [&](auto nr, int64_t r0) {
    constexpr int NR = decltype(nr)::value, NP = kQ4TilePanels<NR>;
    for (int64_t p = p0; p < p1; p += NP) tile_q4_avx512<NP, NR>(c, p, int(std::min<int64_t>(NP, p1 - p)), r0);
  });
}

// The same sums in the same order (bias + groups in order, each group's
// int32 sum scaled as above), one output at a time.
void q4_panels_scalar(const Q4Call& c, int64_t p0, int64_t p1) {
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t o = p0 * packed::kPanel; o < std::min(c.n, p1 * packed::kPanel); ++o) {
      float acc = 0.f;
      for (int64_t g = 0; g < c.groups; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * 32; i < g * 32 + 32; ++i)
          sum += int32_t(c.codes[r * c.k + i]) * packed::q4_packed_code(c.wp, c.k, o, i);
        const float sw = c.sp[((o / packed::kPanel) * c.groups + g) * packed::kPanel + o % packed::kPanel];
        acc = std::fma(float(sum), c.xscale[r * c.groups + g] * sw, acc);
      }
      c.y[r * c.n + o] = (c.bias ? c.bias[o] : 0.f) + acc;
    }
}

void linear_q4_packed_f32(const KernelCall& c) {
  const int64_t k = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  const int64_t n = c.p<core::PackedLinearParams>().out, groups = k / ops::quant::kQ4Group;
  auto* codes = static_cast<int8_t*>(c.workspace);
  auto* xscale = reinterpret_cast<float*>(codes + (rows * k + 3) / 4 * 4);
  auto* xsum = reinterpret_cast<int32_t*>(xscale + rows * groups);
  const float* x = c.in(0).as<float>();
  parallel_for(rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        int8_t* q = codes + r * k + g * 32;
        xscale[r * groups + g] = ops::quant::quantize_int8(x + r * k + g * 32, 32, q);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += q[j];
        xsum[r * groups + g] = s;
      }
  });
  const Q4Call call{codes,
                    xscale,
                    xsum,
                    c.in(1).as<uint8_t>(),
                    c.in(2).as<float>(),
                    c.inputs.size() == 4 ? c.in(3).as<float>() : nullptr,
                    c.out(0).as<float>(),
                    rows,
                    k,
                    n,
                    packed::panels(n),
                    groups};
  const bool vnni = cpu_features().int8 == Int8Dot::avx512_vnni;
  for_panel_blocks(call.panels, k, rows, [&](int64_t p0, int64_t p1) {
    if (vnni) q4_panels_avx512(call, p0, p1);
    else q4_panels_scalar(call, p0, p1);
  });
}

}  // namespace

void register_linear_q8_packed_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::linear_q8_packed, core::DType::f32, linear_q8_packed_f32);
  r.add(core::OpKind::linear_q4_packed, core::DType::f32, linear_q4_packed_f32);
}

}  // namespace brisk::cpu
