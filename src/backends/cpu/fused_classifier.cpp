// CPU kernels of classifier_train (f32, bf16): the LM head, the loss and
// their backward, one chunk of rows at a time (see src/ops/fused_classifier.cpp).
// Per chunk of R rows, with the (R, V) f32 logits in the workspace:
//   logits = x_c w^T             one gemm (gemm.h) over the whole team
//   softmax pass per row         max, then exp(l - max) stored in place while
//                                summing (one exp per element, not two as the
//                                cross_entropy + cross_entropy_backward pair),
//                                then scaled to seed/count * (p - onehot)
//   dx_c = dlogits w             gemm
//   dw  += dlogits^T x_c         gemm, beta = 0 on the first chunk and 1 after
//                                (1 throughout with dw_into: the same memory)
// The products go through gemm() like every other CPU product: OpenBLAS on
// AVX2 machines, oneDNN where it has AVX-512 kernels, nothing allocated per
// step on the OpenBLAS path. Per-row losses go to a double slot in the
// workspace and are summed serially: the same loss for any thread count.
//
// bf16 on the bf16-native path (cpu_features()): x and w go straight into
// bf16 dot products with f32 logits; each row's dlogits are rounded to bf16
// in place (the first half of the row's f32 bytes, so the bf16 matrix has a
// leading dimension of 2V) as the operand of the two backward products, as
// PyTorch's autocast head rounds its logits' gradient. dx comes out in bf16,
// dw in its own dtype (f32 when dw_into is the f32 parameter's gradient).
// bf16-emulated widens x per chunk and w in blocks of rows (bounded scratch,
// no (V, C) f32 copy), keeps dlogits in f32 and narrows dx at the end.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "brisk/ops/params.h"
#include "cpu_util.h"
#include "gemm.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::DType;
using core::KernelCall;

// What both kernels share: the checked targets, the loss scale and the
// workspace carved into per-row losses and one chunk of logits.
struct Setup {
  const int32_t* t = nullptr;
  int64_t n = 0, k = 0, v = 0;
  int ignore = -100;
  int64_t count = 0;  // targets that are not ignore_index
  float scale = 0.f;  // seed / count
  double* row_loss = nullptr;
  float* logits = nullptr;
  int64_t chunk = 0;
  bool into = false;  // dw_into given: dw adds to it (the same memory)
  std::vector<unsigned char> owned;  // only without an executor's workspace
};

void setup(const KernelCall& c, Setup& s) {
  s.t = c.in(2).as<const int32_t>();
  s.n = c.in(0).shape()[0], s.k = c.in(0).shape()[1], s.v = c.in(1).shape()[0];
  s.ignore = c.p<ops::CrossEntropyParams>().ignore_index;
  s.into = c.inputs.size() == 5;
  // Targets checked on this thread, before any parallel region.
  for (int64_t r = 0; r < s.n; ++r) {
    if (s.t[r] == s.ignore) continue;
    if (s.t[r] < 0 || s.t[r] >= s.v)
      throw core::Error("classifier_train: target " + std::to_string(s.t[r]) + " at position " + std::to_string(r) +
                        " is out of range [0, " + std::to_string(s.v) + ") and is not ignore_index (" +
                        std::to_string(s.ignore) + ")");
    ++s.count;
  }
  s.scale = s.count ? c.in(3).as<const float>()[0] / float(s.count) : 0.f;

  // Workspace: N doubles, then (chunk, V) f32 logits (doubles first: they
  // keep their 8-byte alignment whatever chunk * V is); the chunk height is
  // what the given size allows (the OpDef sizes it by
  // ops::classifier_chunk_rows). Without one (run_op with no scratch) the
  // kernel owns a ~64 MiB chunk.
  const size_t tail = size_t(s.n) * sizeof(double);
  auto* base = static_cast<unsigned char*>(c.workspace);
  const int64_t v1 = std::max<int64_t>(s.v, 1);
  s.chunk = base && c.workspace_bytes > tail
                ? std::min<int64_t>(s.n, int64_t((c.workspace_bytes - tail) / sizeof(float)) / v1)
                : 0;
  if (s.chunk < 1) {
    s.chunk = std::max<int64_t>(1, std::min<int64_t>(s.n, std::max<int64_t>(16, (int64_t(1) << 24) / v1)));
    s.owned.resize(size_t(s.chunk * s.v) * sizeof(float) + tail);
    base = s.owned.data();
  }
  s.row_loss = reinterpret_cast<double*>(base);
  s.logits = reinterpret_cast<float*>(base + tail);
}

// Rows [r0, r0 + rows) of the chunk's logits become their gradient
// seed/count * (softmax - onehot), in place; each row's loss term goes to
// row_loss. With `narrow_rows` the gradient row is then rounded to bf16 over
// the first half of its own bytes (element j's two bytes lie before f32
// element j + 1, so the forward pass never overwrites what it has yet to read).
void softmax_grad_rows(const Setup& s, int64_t r0, int64_t rows, bool narrow_rows) {
  const int64_t v = s.v;
  parallel_for(rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* l = s.logits + i * v;
      const int32_t tr = s.t[r0 + i];
      if (tr == s.ignore) {
        std::fill(l, l + v, 0.f);  // zero bytes are zero in bf16 too
        s.row_loss[r0 + i] = 0.0;
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < v; ++j) mx = max_step(mx, l[j]);
      const float target_logit = l[tr];
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < v; ++j) {
        const float e = fast_exp(l[j] - mx);
        l[j] = e;
        sum += e;
      }
      s.row_loss[r0 + i] = double(mx) + std::log(double(sum)) - double(target_logit);
      const float f = s.scale / sum;
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) l[j] *= f;
      l[tr] -= s.scale;
      if (!narrow_rows) continue;
      auto* out = reinterpret_cast<uint16_t*>(l);
      constexpr int64_t kStep = 16;
      float in[kStep];
      uint16_t h[kStep];
      for (int64_t j = 0; j < v; j += kStep) {  // each step reads its floats before writing its halves
        const int64_t len = std::min(kStep, v - j);
        std::memcpy(in, l + j, size_t(len) * sizeof(float));
        f32_to_bf16_row(in, h, len);
        std::memcpy(out + j, h, size_t(len) * sizeof(uint16_t));
      }
    }
  });
}

void finish_loss(const KernelCall& c, const Setup& s) {
  double total = 0.0;
  for (int64_t r = 0; r < s.n; ++r)
    if (s.t[r] != s.ignore) total += s.row_loss[r];
  c.out(0).as<float>()[0] = s.count ? float(total / double(s.count)) : 0.f;
}

// f32, and bf16 on the bf16-native path: x and w straight into gemm().
void classifier_direct(const KernelCall& c, DType t) {
  Setup s;
  setup(c, s);
  const int64_t n = s.n, k = s.k, v = s.v;
  const size_t es = core::dtype_size(t);
  const auto* x = static_cast<const char*>(c.in(0).data);
  auto* dx = static_cast<char*>(c.out(1).data);
  GemmCache& cache = gemm_cache_of(c.ctx);
  const bool narrow_grad = t != DType::f32;
  for (int64_t r0 = 0; r0 < n; r0 += s.chunk) {
    const int64_t rows = std::min(s.chunk, n - r0);
    const char* xc = x + r0 * k * es;
    if (k == 0) {  // no products: every logit is 0
      std::fill(s.logits, s.logits + rows * v, 0.f);
      softmax_grad_rows(s, r0, rows, false);
      continue;
    }
    Gemm logits;  // (rows, V) f32 = x_c w^T
    logits.tb = true, logits.m = rows, logits.n = v, logits.k = k;
    logits.a = xc, logits.lda = k, logits.b = c.in(1).data, logits.ldb = k;
    logits.c = s.logits, logits.ldc = v, logits.ab_type = t, logits.c_type = DType::f32;
    gemm(cache, logits);

    softmax_grad_rows(s, r0, rows, narrow_grad);
    const int64_t ld_grad = narrow_grad ? 2 * v : v;  // in elements of t

    Gemm dxc;  // (rows, C) = dlogits w
    dxc.m = rows, dxc.n = k, dxc.k = v;
    dxc.a = s.logits, dxc.lda = ld_grad, dxc.b = c.in(1).data, dxc.ldb = k;
    dxc.c = dx + r0 * k * es, dxc.ldc = k, dxc.ab_type = t, dxc.c_type = t;
    gemm(cache, dxc);

    Gemm dw;  // (V, C) += dlogits^T x_c
    dw.ta = true, dw.m = v, dw.n = k, dw.k = rows;
    dw.a = s.logits, dw.lda = ld_grad, dw.b = xc, dw.ldb = k;
    dw.c = c.out(2).data, dw.ldc = k, dw.ab_type = t, dw.c_type = c.out(2).dtype();
    dw.beta = r0 == 0 && !s.into ? 0.f : 1.f;
    gemm(cache, dw);
  }
  finish_loss(c, s);
}

// bf16-emulated: f32 products over widened operands. x widens one chunk at
// a time; w one block of kBlockRows rows at a time, twice per chunk (for the
// logits, then for dx and dw), so the scratch stays a few MiB at any V.
constexpr int64_t kBlockRows = 512;

void classifier_bf16_emulated(const KernelCall& c) {
  Setup s;
  setup(c, s);
  const int64_t n = s.n, k = s.k, v = s.v;
  const auto* x = c.in(0).as<const uint16_t>();
  const auto* w = c.in(1).as<const uint16_t>();
  auto* dx = c.out(1).as<uint16_t>();
  const bool dw_f32 = c.out(2).dtype() == DType::f32;
  GemmCache& cache = gemm_cache_of(c.ctx);
  // Grown once to the largest need, then reused: no allocation per step.
  thread_local std::vector<float> xw, dxw, wb, dwb;
  const int64_t block = std::min(kBlockRows, std::max<int64_t>(v, 1));
  xw.resize(std::max(xw.size(), size_t(s.chunk * k)));
  dxw.resize(std::max(dxw.size(), size_t(s.chunk * k)));
  wb.resize(std::max(wb.size(), size_t(block * k)));
  if (!dw_f32) dwb.resize(std::max(dwb.size(), size_t(block * k)));
  auto widen_rows = [](const uint16_t* src, float* dst, int64_t rows, int64_t cols) {
    parallel_for(rows * cols, kParallelGrain, [&](int64_t lo, int64_t hi) { bf16_to_f32_row(src + lo, dst + lo, hi - lo); });
  };
  auto narrow_rows = [](const float* src, uint16_t* dst, int64_t count) {
    parallel_for(count, kParallelGrain, [&](int64_t lo, int64_t hi) { f32_to_bf16_row(src + lo, dst + lo, hi - lo); });
  };
  for (int64_t r0 = 0; r0 < n; r0 += s.chunk) {
    const int64_t rows = std::min(s.chunk, n - r0);
    if (k == 0) {
      std::fill(s.logits, s.logits + rows * v, 0.f);
      softmax_grad_rows(s, r0, rows, false);
      continue;
    }
    widen_rows(x + r0 * k, xw.data(), rows, k);
    for (int64_t j0 = 0; j0 < v; j0 += block) {  // logits[:, j0:j1] = x_c w[j0:j1]^T
      const int64_t bl = std::min(block, v - j0);
      widen_rows(w + j0 * k, wb.data(), bl, k);
      sgemm(cache, false, true, rows, bl, k, xw.data(), k, wb.data(), k, 0.f, s.logits + j0, v);
    }
    softmax_grad_rows(s, r0, rows, false);
    for (int64_t j0 = 0; j0 < v; j0 += block) {
      const int64_t bl = std::min(block, v - j0);
      widen_rows(w + j0 * k, wb.data(), bl, k);
      // dx_c += dlogits[:, j0:j1] w[j0:j1]
      sgemm(cache, false, false, rows, k, bl, s.logits + j0, v, wb.data(), k, j0 == 0 ? 0.f : 1.f, dxw.data(), k);
      // dw[j0:j1] += dlogits[:, j0:j1]^T x_c
      const float beta = r0 == 0 && !s.into ? 0.f : 1.f;
      if (dw_f32) {
        sgemm(cache, true, false, bl, k, rows, s.logits + j0, v, xw.data(), k, beta, c.out(2).as<float>() + j0 * k, k);
      } else {
        uint16_t* dwr = c.out(2).as<uint16_t>() + j0 * k;
        if (beta != 0.f) widen_rows(dwr, dwb.data(), bl, k);
        sgemm(cache, true, false, bl, k, rows, s.logits + j0, v, xw.data(), k, beta, dwb.data(), k);
        narrow_rows(dwb.data(), dwr, bl * k);
      }
    }
    narrow_rows(dxw.data(), dx + r0 * k, rows * k);
  }
  finish_loss(c, s);
}

void classifier_train_f32(const KernelCall& c) { classifier_direct(c, DType::f32); }

void classifier_train_bf16(const KernelCall& c) {
  gemm_bf16_native() ? classifier_direct(c, DType::bf16) : classifier_bf16_emulated(c);
}

}  // namespace

void register_fused_classifier_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::classifier_train, core::DType::f32, classifier_train_f32);
  r.add(core::OpKind::classifier_train, core::DType::bf16, classifier_train_bf16);
}

}  // namespace brisk::cpu
