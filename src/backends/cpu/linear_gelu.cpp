// CPU kernels of linear_gelu (src/ops/linear_gelu.cpp): h = x W^T + b, y = gelu(h),
// and of matmul_gelu_backward (at the end).
//
// f32: each thread takes a contiguous block of rows and finishes it: one
// single-threaded gemm() of its rows (gemm.h: oneDNN with the bias as its
// epilogue on AVX-512 CPUs, OpenBLAS over the broadcast bias elsewhere, the
// engine linear uses), then GELU over those rows into y while they are in
// this core's caches, with no second fork/join. The gemms run nested in our
// own OpenMP region (one oneDNN primitive per block shape, OpenBLAS serial
// and allocation-free). GELU is gelu_math.h's, the gelu op's own; the product
// is split by rows where linear's one product may split otherwise, so fused
// and unfused graphs agree to float rounding, not bit for bit.
//
// Why one block per thread and not row chunks of ~100 that stay in L2: every
// gemm call packs W again. Measured through OpenBLAS (2048 x 384 -> 1536,
// W2's c_fc, one thread, CPU time): linear + gelu 30.2 ms; fused with 96-row
// chunks 33.6, 512-row 31.2, 1024-row 30.6, one block 30.3. GELU is compute
// bound here (about 1.1 ns per element), so keeping h in cache saves less
// than the extra packing costs.
//
// bf16 (and any dtype with both kernels): the registered linear kernel into
// h, then the gelu kernel into y. No faster than the unfused pair, but the
// fusion pass may put the op in any graph, and low-precision products go
// through whatever path matmul.cpp provides for them.
#include <algorithm>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "gemm.h"
#include "gelu_math.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Below this many multiply-adds the product stays on one thread (OpenBLAS's
// own threshold, as in matmul.cpp).
constexpr int64_t kSplitGemm = int64_t(1) << 18;

void linear_gelu_rows(GemmCache& cache, const float* x, const float* w, const float* bias, float* h, float* y,
                      int64_t r0, int64_t r1, int64_t in, int64_t out) {
  if (r1 <= r0) return;
  Gemm g;  // h[r0:r1] = x[r0:r1] W^T + bias
  g.tb = true, g.m = r1 - r0, g.n = out, g.k = in;
  g.a = x + r0 * in, g.lda = in, g.b = w, g.ldb = in, g.c = h + r0 * out, g.ldc = out, g.bias = bias;
  gemm(cache, g);
  gelu_rows(h + r0 * out, y + r0 * out, g.m * out);
}

void linear_gelu_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  const float* w = c.in(1).as<float>();
  const float* bias = c.inputs.size() == 3 ? c.in(2).as<float>() : nullptr;
  float* y = c.out(0).as<float>();
  float* h = c.out(1).as<float>();
  const int64_t out = c.in(1).shape()[0], in = c.in(1).shape()[1];
  const int64_t rows = c.out(0).numel() / std::max<int64_t>(out, 1);
  if (rows == 0 || out == 0) return;
  const int threads =
      omp_in_parallel() || rows * out * std::max<int64_t>(in, 1) < kSplitGemm ? 1 : omp_get_max_threads();
  GemmCache& cache = gemm_cache_of(c.ctx);
  if (threads <= 1) {
    linear_gelu_rows(cache, x, w, bias, h, y, 0, rows, in, out);
    return;
  }
  // Row blocks on multiples of 4 (the gemm micro-kernel's), as matmul.cpp splits.
  const int64_t quantum = rows >= 4 * threads ? 4 : 1;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = (rows * t / nt) / quantum * quantum;
    const int64_t hi = t == nt - 1 ? rows : (rows * (t + 1) / nt) / quantum * quantum;
    linear_gelu_rows(cache, x, w, bias, h, y, lo, hi, in, out);
  }
}

// The linear and gelu kernels of this backend, looked up once.
const core::KernelRegistry& composed_kernels() {
  static const core::KernelRegistry r = [] {
    core::KernelRegistry k;
    register_matmul_kernels(k);
    register_activation_kernels(k);
    return k;
  }();
  return r;
}

void linear_gelu_composed(const KernelCall& c) {
  const core::DType t = c.in(0).dtype();
  const core::KernelFn lin = composed_kernels().find(core::OpKind::linear, t);
  const core::KernelFn act = composed_kernels().find(core::OpKind::gelu, t);
  KernelCall lc = c;  // same inputs, params and workspace; output h
  lc.outputs = c.outputs.subspan(1, 1);
  lin(lc);
  KernelCall gc = c;  // gelu: h -> y
  gc.inputs = c.outputs.subspan(1, 1);
  gc.outputs = c.outputs.subspan(0, 1);
  act(gc);
}

// matmul_gelu_backward (dy, W, h) -> dh: matmul's kernel into dh over the
// (rows, out) x (out, in) views, then gelu_backward's over dh in place. The
// same kernels as the unfused pair, so the same bits; on this backend the
// fusion saves nothing measurable (the product dominates, and GELU's
// backward is compute bound), but every CPU run exercises the fused graph
// that a GPU runs with cuBLASLt's DGELU epilogue.
void matmul_gelu_backward_composed(const KernelCall& c) {
  const core::DType t = c.in(0).dtype();
  const core::KernelFn mm = composed_kernels().find(core::OpKind::matmul, t);
  const core::KernelFn act = composed_kernels().find(core::OpKind::gelu_backward, t);
  const int64_t out = c.in(1).shape()[0], in = c.in(1).shape()[1];
  const int64_t rows = c.out(0).numel() / std::max<int64_t>(in, 1);
  const core::TensorView mm_in[] = {{c.in(0).data, {core::Shape{rows, out}, t}}, c.in(1)};
  const core::TensorView mm_out[] = {{c.out(0).data, {core::Shape{rows, in}, t}}};
  const core::OpParams params = core::MatmulParams{};
  KernelCall mc = c;
  mc.params = &params;
  mc.inputs = mm_in;
  mc.outputs = mm_out;
  mm(mc);
  const core::TensorView act_in[] = {c.in(2), c.out(0)};  // gelu'(h) * the product, element by element
  KernelCall ac = c;
  ac.inputs = act_in;
  act(ac);
}

}  // namespace

void register_linear_gelu_kernels(core::KernelRegistry& r) {
  using core::DType;
  r.add(core::OpKind::linear_gelu, DType::f32, linear_gelu_f32);
  for (DType t : {DType::bf16, DType::f16})
    if (composed_kernels().supports(core::OpKind::linear, t) && composed_kernels().supports(core::OpKind::gelu, t))
      r.add(core::OpKind::linear_gelu, t, linear_gelu_composed);
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (composed_kernels().supports(core::OpKind::matmul, t) &&
        composed_kernels().supports(core::OpKind::gelu_backward, t))
      r.add(core::OpKind::matmul_gelu_backward, t, matmul_gelu_backward_composed);
}

}  // namespace brisk::cpu
