// CPU kernel of classifier_train (f32): the LM head, the loss and their
// backward, one chunk of rows at a time (see src/ops/fused_classifier.cpp).
// Per chunk of R rows, with the (R, V) logits in the workspace:
//   logits = x_c w^T             gemm split over V: each thread streams half of w
//   softmax pass per row         max, then exp(l - max) stored in place while
//                                summing (one exp per element, not two as the
//                                cross_entropy + cross_entropy_backward pair),
//                                then scaled to seed/count * (p - onehot)
//   dx_c = dlogits w             gemm split over R
//   dw  += dlogits^T x_c         gemm split over V, beta = 1 (dw starts at 0,
//                                or at dw_into when given: the same memory)
// The gemms run single-threaded OpenBLAS calls inside our own OpenMP region
// (as matmul.cpp does), so one thread pool owns the cores and nothing is
// allocated per step. Per-row losses go to a double slot in the workspace and
// are summed serially: the same loss for any thread count.
#include <cblas.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "brisk/ops/params.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// C (m, n) = op(A) op(B) + beta C, row-major, the output split across the
// threads along rows (split_rows) or columns. Inside the region each call is
// serial OpenBLAS.
void par_sgemm(bool split_rows, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int64_t len = split_rows ? m : n;
  const int64_t quantum = split_rows ? 4 : 16;  // slices aligned to the micro-kernel
  const int threads = m * n * k < (int64_t(1) << 18) ? 1 : int(std::min<int64_t>(omp_get_max_threads(), len / quantum + 1));
  auto gemm = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    const float* as = split_rows ? (ta ? a + lo : a + lo * lda) : a;
    const float* bs = split_rows ? b : (tb ? b + lo * ldb : b + lo);
    const int64_t mm = split_rows ? hi - lo : m, nn = split_rows ? n : hi - lo;
    float* cs = split_rows ? c + lo * n : c + lo;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(mm),
                blasint(nn), blasint(k), 1.f, as, blasint(lda), bs, blasint(ldb), beta, cs, blasint(n));
  };
  if (threads <= 1 || omp_in_parallel()) {
    gemm(0, len);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = (len * t / nt) / quantum * quantum;
    const int64_t hi = t == nt - 1 ? len : (len * (t + 1) / nt) / quantum * quantum;
    gemm(lo, hi);
  }
}

void classifier_train_f32(const KernelCall& c) {
  const float* x = c.in(0).as<const float>();
  const float* w = c.in(1).as<const float>();
  const int32_t* t = c.in(2).as<const int32_t>();
  const float seed = c.in(3).as<const float>()[0];
  float* loss = c.out(0).as<float>();
  float* dx = c.out(1).as<float>();
  float* dw = c.out(2).as<float>();
  const int64_t n = c.in(0).shape()[0], k = c.in(0).shape()[1], v = c.in(1).shape()[0];
  const int ignore = c.p<ops::CrossEntropyParams>().ignore_index;

  // Targets checked on this thread, before any parallel region.
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore) continue;
    if (t[r] < 0 || t[r] >= v)
      throw core::Error("classifier_train: target " + std::to_string(t[r]) + " at position " + std::to_string(r) +
                        " is out of range [0, " + std::to_string(v) + ") and is not ignore_index (" +
                        std::to_string(ignore) + ")");
    ++count;
  }
  const float scale = count ? seed / float(count) : 0.f;

  // Workspace: N doubles, then (chunk, V) logits (doubles first: they keep
  // their 8-byte alignment whatever chunk * V is); the chunk height is what
  // the given size allows (the OpDef sizes it by ops::classifier_chunk_rows).
  // Without one (run_op with no scratch) the kernel owns a ~64 MiB chunk.
  const size_t tail = size_t(n) * sizeof(double);
  auto* base = static_cast<unsigned char*>(c.workspace);
  int64_t chunk = base && c.workspace_bytes > tail
                      ? std::min<int64_t>(n, int64_t((c.workspace_bytes - tail) / sizeof(float)) / std::max<int64_t>(v, 1))
                      : 0;
  std::vector<unsigned char> owned;
  if (chunk < 1) {
    chunk = std::max<int64_t>(1, std::min<int64_t>(n, std::max<int64_t>(16, (int64_t(1) << 24) / std::max<int64_t>(v, 1))));
    owned.resize(size_t(chunk * v) * sizeof(float) + tail);
    base = owned.data();
  }
  double* row_loss = reinterpret_cast<double*>(base);
  float* logits = reinterpret_cast<float*>(base + tail);

  // With dw_into (input 4, the same memory as dw) the gradient adds to it.
  if (c.inputs.size() == 4) std::fill(dw, dw + v * k, 0.f);
  if (k == 0) std::fill(dx, dx + n * k, 0.f);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const float* xc = x + r0 * k;
    if (k > 0) par_sgemm(false, false, true, rows, v, k, xc, k, w, k, 0.f, logits);
    else std::fill(logits, logits + rows * v, 0.f);

    parallel_for(rows, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        float* l = logits + i * v;
        const int32_t tr = t[r0 + i];
        if (tr == ignore) {
          std::fill(l, l + v, 0.f);
          row_loss[r0 + i] = 0.0;
          continue;
        }
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < v; ++j) mx = std::max(mx, l[j]);
        const float target_logit = l[tr];
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < v; ++j) {
          const float e = fast_exp(l[j] - mx);
          l[j] = e;
          s += e;
        }
        row_loss[r0 + i] = double(mx) + std::log(double(s)) - double(target_logit);
        const float f = scale / s;
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) l[j] *= f;
        l[tr] -= scale;
      }
    });

    if (k == 0) continue;
    par_sgemm(true, false, false, rows, k, v, logits, v, w, k, 0.f, dx + r0 * k);   // dx_c = dlogits w
    par_sgemm(true, true, false, v, k, rows, logits, v, xc, k, 1.f, dw);            // dw += dlogits^T x_c
  }

  double total = 0.0;
  for (int64_t r = 0; r < n; ++r)
    if (t[r] != ignore) total += row_loss[r];
  loss[0] = count ? float(total / double(count)) : 0.f;
}

}  // namespace

void register_fused_classifier_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::classifier_train, core::DType::f32, classifier_train_f32);
}

}  // namespace brisk::cpu
