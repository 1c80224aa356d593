// CPU kernels for matmul and linear, all through gemm.h (oneDNN or OpenBLAS,
// chosen at run time from the CPU's flags).
//
// f32 goes straight to the gemm with the transposes as flags: no copies.
// A shared (rank-2) B with an untransposed A folds the batch into the rows,
// and linear is one gemm over all rows with the bias as its epilogue (oneDNN)
// or pre-broadcast into the output under beta = 1 (OpenBLAS): no second pass
// over the output either way. Batches of matrices run one gemm per thread;
// a single large gemm uses the whole thread team (gemm.cpp).
//
// bf16 where the CPU has bf16 dot products (cpu_features(): bf16-native):
// the operands go straight into oneDNN's bf16 matmul (fp32 accumulation, the
// bias as its epilogue), no widening. Elsewhere (bf16-emulated), and for f16
// everywhere, low-precision products widen their operands to f32 in row
// chunks (scratch from the op's workspace), run the f32 gemm, and narrow the
// result: f32 accumulation, bounded scratch. OpenBLAS's sbgemm is no help:
// Debian's build has none.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "intrinsics_warnings.h"  // before the headers that hold intrinsics
#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "cpu_util.h"
#include "gemm.h"
#include "hsum16.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// A batch of at least one matrix per thread runs one gemm per thread unless
// the matrices are large, in which case each gemm is split across threads.
constexpr int64_t kLargeGemm = int64_t(1) << 26;

struct Dims {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  bool shared_b = false;
};

Dims matmul_dims(const KernelCall& c) {
  const auto& p = c.p<core::MatmulParams>();
  const core::Shape &a = c.in(0).shape(), &b = c.in(1).shape();
  const int ra = a.rank();
  Dims d;
  d.m = p.trans_a ? a[ra - 1] : a[ra - 2];
  d.k = p.trans_a ? a[ra - 2] : a[ra - 1];
  d.n = p.trans_b ? b[b.rank() - 2] : b[b.rank() - 1];
  for (int i = 0; i < ra - 2; ++i) d.batch *= a[i];
  d.shared_b = b.rank() == 2;
  // A shared B under an untransposed A: the batch is just more rows.
  if (d.shared_b && !p.trans_a) {
    d.m *= d.batch;
    d.batch = 1;
  }
  return d;
}

// ---- operands straight into gemm(): f32 always, bf16 on the bf16-native path --------
void matmul_direct(const KernelCall& c, core::DType t) {
  const auto& p = c.p<core::MatmulParams>();
  const Dims d = matmul_dims(c);
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  // With the accumulator input (input 2, the output's memory): f32 C, beta = 1.
  const bool into = c.inputs.size() == 3;
  const size_t es = core::dtype_size(t), ces = into ? sizeof(float) : es;
  const auto* a = static_cast<const char*>(c.in(0).data);
  const auto* b = static_cast<const char*>(c.in(1).data);
  auto* y = static_cast<char*>(c.out(0).data);
  const int64_t sa = d.m * d.k, sb = d.shared_b ? 0 : d.k * d.n, sy = d.m * d.n;
  GemmCache& cache = gemm_cache_of(c.ctx);
  Gemm g;
  g.ta = p.trans_a, g.tb = p.trans_b, g.m = d.m, g.n = d.n, g.k = d.k;
  g.lda = p.trans_a ? d.m : d.k, g.ldb = p.trans_b ? d.k : d.n, g.ldc = d.n;
  g.ab_type = t;
  g.c_type = into ? core::DType::f32 : t;
  g.beta = into ? 1.f : 0.f;
  auto one = [&](int64_t i) {
    Gemm gi = g;
    gi.a = a + i * sa * es, gi.b = b + i * sb * es, gi.c = y + i * sy * ces;
    gemm(cache, gi);
  };
  if (d.batch > 1 && omp_get_max_threads() > 1 && d.batch >= omp_get_max_threads() && d.m * d.n * d.k < kLargeGemm) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < d.batch; ++i) one(i);
  }
}

void linear_direct(const KernelCall& c, core::DType t) {
  const int64_t out = c.in(1).shape()[0], in = c.in(1).shape()[1];
  const int64_t rows = c.out(0).numel() / std::max<int64_t>(out, 1);
  Gemm g;
  g.tb = true, g.m = rows, g.n = out, g.k = in;
  g.a = c.in(0).data, g.lda = in, g.b = c.in(1).data, g.ldb = in, g.c = c.out(0).data, g.ldc = out;
  g.ab_type = g.c_type = t;
  if (c.inputs.size() == 3) g.bias = c.in(2).data, g.bias_type = t;
  gemm(gemm_cache_of(c.ctx), g);
}

// A Linear over a few rows (decoding: one row per sequence) streams the
// weight once. oneDNN's matmul re-packs the whole weight on each such call
// (~2x slower at W1's LM head), so these rows take a kernel of their own:
// each thread takes a slice of the output features in blocks of 4, and a
// block's 4 weight rows stay in L1 while every group of 4 activation rows
// is dotted with them: 16 accumulators, summed at the end by hsum16_ps.
// Every output element is one dot product in a fixed order whatever the
// tile around it, so a row's result does not depend on how many rows share
// the call (the same prompt decodes the same alone or in a batch).
constexpr int64_t kFewRows = 16;
constexpr int kTile = 4;

struct FewRows {
  const float *x, *w, *bias;
  float* y;
  int64_t rows, out, in;
};

// The kTile x kTile dot products of rows x[0..nr) and weight rows w[0..no),
// lane r * kTile + o of the result (each row's outputs side by side). Missing rows repeat the first one (their
// sums are dropped), so the loop has no branches.
template <int kRows>
__attribute__((target("avx512f"))) __m512 tile_dots_avx512(const float* x, const float* w, int no, int64_t k) {
  const float* xr[kTile];
  const float* wr[kTile];
  for (int i = 0; i < kTile; ++i) xr[i] = x + (i < kRows ? i : 0) * k, wr[i] = w + (i < no ? i : 0) * k;
  __m512 acc[kTile * kTile];
  // Unrolled before GCC's scalar replacement runs, so the accumulators live
  // in registers (otherwise they are stored to the stack on every step).
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {  // the last step masks the tail
    const __mmask16 m = k - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (k - i)) - 1);
    __m512 wv[kTile];
#pragma GCC unroll 4
    for (int o = 0; o < kTile; ++o) {
      wv[o] = _mm512_maskz_loadu_ps(m, wr[o] + i);
      _mm_prefetch(reinterpret_cast<const char*>(wr[o] + i + kTile * k), _MM_HINT_T0);  // the next block's line
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, xr[r] + i);
#pragma GCC unroll 4
      for (int o = 0; o < kTile; ++o) acc[r * kTile + o] = _mm512_fmadd_ps(xv, wv[o], acc[r * kTile + o]);
    }
  }
  return hsum16_ps(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7], acc[8], acc[9], acc[10], acc[11],
                   acc[12], acc[13], acc[14], acc[15]);
}

__attribute__((target("avx512f,avx512vl"))) void few_rows_avx512(const FewRows& p, int64_t o0, int64_t o1) {
  alignas(64) float dots[kTile * kTile];
  for (int64_t o = o0; o < o1; o += kTile) {
    const int no = int(std::min<int64_t>(kTile, o1 - o));
    const float* w = p.w + o * p.in;
    // The block's 4 biases in every 128-bit chunk (one chunk per row).
    const __m512 bias = p.bias ? _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(__mmask8((1u << no) - 1), p.bias + o))
                               : _mm512_setzero_ps();
    for (int64_t r0 = 0; r0 < p.rows; r0 += kTile) {
      const int nr = int(std::min<int64_t>(kTile, p.rows - r0));
      const float* x = p.x + r0 * p.in;
      __m512 s;
      switch (nr) {
        case 1: s = tile_dots_avx512<1>(x, w, no, p.in); break;
        case 2: s = tile_dots_avx512<2>(x, w, no, p.in); break;
        case 3: s = tile_dots_avx512<3>(x, w, no, p.in); break;
        default: s = tile_dots_avx512<4>(x, w, no, p.in); break;
      }
      _mm512_store_ps(dots, _mm512_add_ps(s, bias));
      for (int r = 0; r < nr; ++r) std::memcpy(p.y + (r0 + r) * p.out + o, dots + r * kTile, size_t(no) * sizeof(float));
    }
  }
}

// Without AVX-512: one dot product per output, vectorised by the compiler.
void few_rows_portable(const FewRows& p, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = p.w + o * p.in;
    const float b = p.bias ? p.bias[o] : 0.f;
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* xr = p.x + r * p.in;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < p.in; ++k) s += xr[k] * wr[k];
      p.y[r * p.out + o] = s + b;
    }
  }
}

void linear_few_rows(const KernelCall& c) {
  FewRows p;
  p.out = c.in(1).shape()[0], p.in = c.in(1).shape()[1];
  p.rows = c.out(0).numel() / std::max<int64_t>(p.out, 1);
  p.x = c.in(0).as<float>(), p.w = c.in(1).as<float>();
  p.bias = c.inputs.size() == 3 ? c.in(2).as<float>() : nullptr;
  p.y = c.out(0).as<float>();
  const bool avx512 = cpu_features().few_rows_avx512;
  const int64_t blocks = (p.out + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(p.in * p.rows * kTile, 1));
  parallel_for(blocks, grain, [&](int64_t lo, int64_t hi) {
    const int64_t o0 = lo * kTile, o1 = std::min(p.out, hi * kTile);
    if (avx512) few_rows_avx512(p, o0, o1);
    else few_rows_portable(p, o0, o1);
  });
}

void matmul_f32(const KernelCall& c) { matmul_direct(c, core::DType::f32); }
void linear_f32(const KernelCall& c) {
  const int64_t out = c.in(1).shape()[0];
  if (c.out(0).numel() / std::max<int64_t>(out, 1) <= kFewRows) return linear_few_rows(c);
  linear_direct(c, core::DType::f32);
}

// ---- bf16 / f16 via f32 ---------------------------------------------------------
template <class T> struct Lowp;
template <> struct Lowp<core::bf16> {
  static float widen(uint16_t h) { return core::bf16_to_f32(h); }
  static uint16_t narrow(float f) { return core::f32_to_bf16(f); }
};
template <> struct Lowp<core::f16> {
  // cpu_util.h's inline F16C conversions (fp16 training widens every operand
  // here; the out-of-line core ones made f16 products ~2x slower than bf16).
  static float widen(uint16_t h) {
    core::f16 v;
    v.bits = h;
    return cpu::widen(v);
  }
  static uint16_t narrow(float f) { return cpu::narrow<core::f16>(f).bits; }
};

// Widens rows x cols elements at src (row stride ld) into dst (row stride cols).
template <class T>
void widen_block(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const uint16_t* s = src + r * ld;
      float* o = dst + r * cols;
#pragma omp simd
      for (int64_t i = 0; i < cols; ++i) o[i] = Lowp<T>::widen(s[i]);
    }
  });
}

template <class T>
void narrow_block(const float* src, int64_t n, uint16_t* dst) {
  parallel_for(n, kParallelGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dst[i] = Lowp<T>::narrow(src[i]);
  });
}

// Scratch for one low-precision product: B widened once, then chunks of
// `chunk` rows of op(A) and of C. Uses the executor's workspace when it is
// large enough, else owns a buffer (run_op without a workspace).
struct LowpScratch {
  float *b = nullptr, *a = nullptr, *c = nullptr;
  int64_t chunk = 0;
  std::vector<float> owned;

  LowpScratch(const KernelCall& call, int64_t rows, int64_t k, int64_t n) {
    const int64_t avail = int64_t(call.workspace ? call.workspace_bytes / sizeof(float) : 0);
    chunk = std::min<int64_t>(rows, (avail - k * n) / std::max<int64_t>(k + n, 1));
    float* base = static_cast<float*>(call.workspace);
    if (chunk < 1 || !base) {
      chunk = std::min<int64_t>(rows, std::max<int64_t>(64, (int64_t(1) << 22) / std::max<int64_t>(k + n, 1)));
      owned.resize(size_t(k * n + chunk * (k + n)));
      base = owned.data();
    }
    b = base;
    a = b + k * n;
    c = a + chunk * k;
  }
};

// C (m, n) = op(A) op(B) [+ bias], A and C low precision, B already widened
// (layout per tb, ld ldb). A is (m, k) or, with ta, (k, m) with row stride m.
// With `into` (f32 (m, n)), C is into + op(A) op(B) instead, written there.
template <class T>
void lowp_gemm(GemmCache& cache, const uint16_t* a, bool ta, const float* bf, bool tb, const uint16_t* bias,
               uint16_t* y, int64_t m, int64_t n, int64_t k, LowpScratch& s, float* into = nullptr) {
  const int64_t ldb = tb ? k : n;
  for (int64_t r0 = 0; r0 < m; r0 += s.chunk) {
    const int64_t mc = std::min(s.chunk, m - r0);
    if (!ta)
      widen_block<T>(a + r0 * k, k, mc, k, s.a);
    else
      widen_block<T>(a + r0, m, k, mc, s.a);  // columns r0..r0+mc of the stored (k, m)
    if (into) {
      if (k > 0) sgemm(cache, ta, tb, mc, n, k, s.a, ta ? mc : k, bf, ldb, 1.f, into + r0 * n, n);
      continue;
    }
    float beta = 0.f;
    if (bias) {
      for (int64_t i = 0; i < n; ++i) s.c[i] = Lowp<T>::widen(bias[i]);
      for (int64_t r = 1; r < mc; ++r) std::copy(s.c, s.c + n, s.c + r * n);
      beta = 1.f;
    }
    if (k > 0)
      sgemm(cache, ta, tb, mc, n, k, s.a, ta ? mc : k, bf, ldb, beta, s.c, n);
    else if (!bias)
      std::fill(s.c, s.c + mc * n, 0.f);
    narrow_block<T>(s.c, mc * n, y + r0 * n);
  }
}

template <class T>
void matmul_lowp(const KernelCall& c) {
  const auto& p = c.p<core::MatmulParams>();
  const Dims d = matmul_dims(c);
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  const auto* a = c.in(0).as<const uint16_t>();
  const auto* b = c.in(1).as<const uint16_t>();
  // With the accumulator input the output is f32 (its memory); else T.
  const bool into = c.inputs.size() == 3;
  LowpScratch s(c, d.m, d.k, d.n);
  const int64_t kn = d.k * d.n, mn = d.m * d.n;
  for (int64_t i = 0; i < d.batch; ++i) {
    // B as its stored rows: (k, n), or (n, k) when transposed.
    const int64_t b_rows = p.trans_b ? d.n : d.k, b_cols = p.trans_b ? d.k : d.n;
    if (i == 0 || !d.shared_b) widen_block<T>(b + (d.shared_b ? 0 : i * kn), b_cols, b_rows, b_cols, s.b);
    uint16_t* y = into ? nullptr : c.out(0).as<uint16_t>() + i * mn;
    float* acc = into ? c.out(0).as<float>() + i * mn : nullptr;
    lowp_gemm<T>(gemm_cache_of(c.ctx), a + i * d.m * d.k, p.trans_a, s.b, p.trans_b, nullptr, y, d.m, d.n, d.k, s, acc);
  }
}

template <class T>
void linear_lowp(const KernelCall& c) {
  const int64_t out = c.in(1).shape()[0], in = c.in(1).shape()[1];
  const int64_t rows = c.out(0).numel() / std::max<int64_t>(out, 1);
  if (rows == 0 || out == 0) return;
  LowpScratch s(c, rows, in, out);
  widen_block<T>(c.in(1).as<const uint16_t>(), in, out, in, s.b);
  const uint16_t* bias = c.inputs.size() == 3 ? c.in(2).as<const uint16_t>() : nullptr;
  lowp_gemm<T>(gemm_cache_of(c.ctx), c.in(0).as<const uint16_t>(), false, s.b, true, bias, c.out(0).as<uint16_t>(), rows, out, in, s);
}

// The path is chosen per call, so BRISK_BF16 (reload_cpu_features) switches it.
void matmul_bf16(const KernelCall& c) {
  gemm_bf16_native() ? matmul_direct(c, core::DType::bf16) : matmul_lowp<core::bf16>(c);
}
void linear_bf16(const KernelCall& c) {
  gemm_bf16_native() ? linear_direct(c, core::DType::bf16) : linear_lowp<core::bf16>(c);
}

}  // namespace

void register_matmul_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::matmul, DType::f32, matmul_f32);
  r.add(OpKind::matmul, DType::bf16, matmul_bf16);
  r.add(OpKind::matmul, DType::f16, matmul_lowp<core::f16>);
  r.add(OpKind::linear, DType::f32, linear_f32);
  r.add(OpKind::linear, DType::bf16, linear_bf16);
  r.add(OpKind::linear, DType::f16, linear_lowp<core::f16>);
}

}  // namespace brisk::cpu
