// CPU kernels for matmul and linear on OpenBLAS.
//
// f32 goes straight to cblas_sgemm with the transposes as flags: no copies.
// A shared (rank-2) B with an untransposed A folds the batch into the rows,
// and linear is one gemm over all rows with the bias pre-broadcast into the
// output (beta = 1), which costs one write pass instead of a read-write pass
// afterwards. Batches of matrices (attention heads) run one gemm per thread;
// a single large gemm is split across the threads by sgemm() below.
//
// bf16/f16: this machine class has no avx512_bf16, where OpenBLAS's sbgemm is
// a slow generic loop, so low-precision products widen their operands to f32
// in row chunks (scratch from the op's workspace), run sgemm, and narrow the
// result: f32 accumulation, bounded scratch.
#include <cblas.h>

#include <vector>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// A batch of at least one matrix per thread runs one gemm per thread unless
// the matrices are large, in which case each gemm is split across threads.
constexpr int64_t kLargeGemm = int64_t(1) << 26;
// Below this many multiply-adds a gemm is not worth splitting (and OpenBLAS
// does not thread it either: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD).
constexpr int64_t kSplitGemm = int64_t(1) << 18;

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

void sgemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), blasint(m), blasint(n), blasint(k), 1.f, a, blasint(lda), b,
              blasint(ldb), beta, c, blasint(ldc));
}

// We split the output across our own OpenMP team and call OpenBLAS from
// inside the parallel region, where its OpenMP build runs single-threaded.
// Called from outside a region it would start its own threading, which costs
// a heap allocation per call (so a training step would allocate). C is split
// along its longer side; a small product runs on one thread of the team.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c) {
  if (omp_in_parallel()) {
    sgemm_serial(ta, tb, m, n, k, a, lda, b, ldb, beta, c, n);
    return;
  }
  // Below kSplitGemm OpenBLAS itself stays on one thread (its SMP threshold
  // is the same 2^18 multiply-adds), so the direct call allocates nothing.
  const int threads = m * n * k < kSplitGemm ? 1 : omp_get_max_threads();
  if (threads <= 1) {
    sgemm_serial(ta, tb, m, n, k, a, lda, b, ldb, beta, c, n);
    return;
  }
  const bool split_rows = m >= n;
  const int64_t len = split_rows ? m : n;
  const int64_t quantum = split_rows ? 4 : 16;  // keep slices aligned to the micro-kernel
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = (len * t / nt) / quantum * quantum;
    const int64_t hi = t == nt - 1 ? len : (len * (t + 1) / nt) / quantum * quantum;
    if (hi > lo) {
      if (split_rows)
        sgemm_serial(ta, tb, hi - lo, n, k, ta ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * n, n);
      else
        sgemm_serial(ta, tb, m, hi - lo, k, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo, n);
    }
  }
}

struct Dims {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  bool shared_b = false;
};

Dims matmul_dims(const KernelCall& c) {
  const auto& p = c.p<ops::MatmulParams>();
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

// ---- f32 ------------------------------------------------------------------------
void matmul_f32(const KernelCall& c) {
  const auto& p = c.p<ops::MatmulParams>();
  const Dims d = matmul_dims(c);
  const float* a = c.in(0).as<float>();
  const float* b = c.in(1).as<float>();
  float* y = c.out(0).as<float>();
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  if (d.k == 0) {
    std::fill(y, y + d.batch * d.m * d.n, 0.f);
    return;
  }
  const int64_t lda = p.trans_a ? d.m : d.k, ldb = p.trans_b ? d.k : d.n;
  const int64_t sa = d.m * d.k, sb = d.shared_b ? 0 : d.k * d.n, sy = d.m * d.n;
  auto one = [&](int64_t i) { sgemm(p.trans_a, p.trans_b, d.m, d.n, d.k, a + i * sa, lda, b + i * sb, ldb, 0.f, y + i * sy); };
  if (d.batch == 1) {
    one(0);
  } else if (omp_get_max_threads() > 1 && d.batch >= omp_get_max_threads() && d.m * d.n * d.k < kLargeGemm) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < d.batch; ++i) one(i);
  }
}

void linear_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  const float* w = c.in(1).as<float>();
  float* y = c.out(0).as<float>();
  const int64_t out = c.in(1).shape()[0], in = c.in(1).shape()[1];
  const int64_t rows = c.out(0).numel() / std::max<int64_t>(out, 1);
  if (rows == 0 || out == 0) return;
  float beta = 0.f;
  if (c.inputs.size() == 3) {
    const float* bias = c.in(2).as<float>();
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / out), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) std::copy(bias, bias + out, y + r * out);
    });
    beta = 1.f;
  }
  if (in == 0) {
    if (beta == 0.f) std::fill(y, y + rows * out, 0.f);
    return;
  }
  sgemm(false, true, rows, out, in, x, in, w, in, beta, y);
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
template <class T>
void lowp_gemm(const uint16_t* a, bool ta, const float* bf, bool tb, const uint16_t* bias, uint16_t* y, int64_t m,
               int64_t n, int64_t k, LowpScratch& s) {
  const int64_t ldb = tb ? k : n;
  for (int64_t r0 = 0; r0 < m; r0 += s.chunk) {
    const int64_t mc = std::min(s.chunk, m - r0);
    if (!ta)
      widen_block<T>(a + r0 * k, k, mc, k, s.a);
    else
      widen_block<T>(a + r0, m, k, mc, s.a);  // columns r0..r0+mc of the stored (k, m)
    float beta = 0.f;
    if (bias) {
      for (int64_t i = 0; i < n; ++i) s.c[i] = Lowp<T>::widen(bias[i]);
      for (int64_t r = 1; r < mc; ++r) std::copy(s.c, s.c + n, s.c + r * n);
      beta = 1.f;
    }
    if (k > 0)
      sgemm(ta, tb, mc, n, k, s.a, ta ? mc : k, bf, ldb, beta, s.c);
    else if (!bias)
      std::fill(s.c, s.c + mc * n, 0.f);
    narrow_block<T>(s.c, mc * n, y + r0 * n);
  }
}

template <class T>
void matmul_lowp(const KernelCall& c) {
  const auto& p = c.p<ops::MatmulParams>();
  const Dims d = matmul_dims(c);
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  const auto* a = c.in(0).as<const uint16_t>();
  const auto* b = c.in(1).as<const uint16_t>();
  auto* y = c.out(0).as<uint16_t>();
  LowpScratch s(c, d.m, d.k, d.n);
  const int64_t kn = d.k * d.n;
  for (int64_t i = 0; i < d.batch; ++i) {
    // B as its stored rows: (k, n), or (n, k) when transposed.
    const int64_t b_rows = p.trans_b ? d.n : d.k, b_cols = p.trans_b ? d.k : d.n;
    if (i == 0 || !d.shared_b) widen_block<T>(b + (d.shared_b ? 0 : i * kn), b_cols, b_rows, b_cols, s.b);
    lowp_gemm<T>(a + i * d.m * d.k, p.trans_a, s.b, p.trans_b, nullptr, y + i * d.m * d.n, d.m, d.n, d.k, s);
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
  lowp_gemm<T>(c.in(0).as<const uint16_t>(), false, s.b, true, bias, c.out(0).as<uint16_t>(), rows, out, in, s);
}

}  // namespace

void register_matmul_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::matmul, DType::f32, matmul_f32);
  r.add(OpKind::matmul, DType::bf16, matmul_lowp<core::bf16>);
  r.add(OpKind::matmul, DType::f16, matmul_lowp<core::f16>);
  r.add(OpKind::linear, DType::f32, linear_f32);
  r.add(OpKind::linear, DType::bf16, linear_lowp<core::bf16>);
  r.add(OpKind::linear, DType::f16, linear_lowp<core::f16>);
}

}  // namespace brisk::cpu
